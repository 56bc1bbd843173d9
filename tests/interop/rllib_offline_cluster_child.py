"""RLlib BC trained on a two-node Ray cluster straight from an RLDS dataset in moto's S3.

Run by tests/interop/test_rllib_offline_cluster.py as the first process of new
PID, network and mount namespaces (`unshare --net --pid --fork --kill-child
--mount-proc`): the moto server, the Ray head and the second node listen on
that namespace's loopback only and end when this process exits.

    python rllib_offline_cluster_child.py WORKDIR RESULT_JSON

The dataset (CartPole, pushed right) is written under a directory the second
node cannot see (a tmpfs over it in its own mount namespace, as in
tests/record/rllib/rllib_cluster_child.py) and uploaded to `s3://cluster-bucket`;
the local copy is then deleted: the cluster shares no file system and reads
the bucket. A pass of the datasource tells which nodes ran read tasks; then
BC trains with a pre-learner (RLDSPreLearner's subclass, the pool sized by
RLDSOfflineData for the two 1-CPU nodes) that reports each (episode, step) it is handed
to an actor, until one epoch's worth has arrived. The result holds the
transitions written, those handed over, the nodes that read, the loss.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import rlds_writer  # noqa: F401 - TensorFlow RTLD_LOCAL before RLlib and torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "record", "rllib")
)
from rllib_cluster_child import _start_moto, _start_nodes, _stop_nodes, _wait_for_port  # noqa: E402

_COUNTER = "rlds-offline-counter"


def _write_source(local: str, url: str) -> list[tuple[int, int]]:
    """CartPole pushed right, 9 episodes over 3 shard files, uploaded; its transitions."""
    import gymnasium as gym

    from rlds_writer.store.storage.storage import storage_for

    env = rlds_writer.RecordRLDS(
        gym.make("CartPole-v1", max_episode_steps=12), local, max_episodes_per_file=3
    )
    for i in range(9):
        env.reset(seed=i)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(1)
            done = terminated or truncated
    env.close()
    ids = rlds_writer.open_dataset(local).episodes("train").qlearning_dataset()["episode_ids"]
    expected = []
    for episode in np.unique(ids):
        expected.extend((int(episode), t) for t in range(int((ids == episode).sum())))
    store = storage_for(url)
    for name in sorted(os.listdir(local)):
        store.upload(os.path.join(local, name), store.join(url, name))
    shutil.rmtree(local)  # nothing local left to read
    return expected


def _read_nodes(url: str) -> list[str]:
    """The nodes whose read tasks read the dataset (a read fused with a map: one task)."""
    import ray

    from rlds_writer.read.ray_data import read_rlds

    def where(batch):
        node = ray.get_runtime_context().get_node_id()
        return {"node": np.array([node] * len(batch["episode_index"]))}

    ds = read_rlds(url, rows="transitions", columns=["episode_index"], bytes_per_task=1)
    ds = ds.map_batches(where, batch_format="numpy")
    return sorted({row["node"] for row in ds.take_all()})


def _train(url: str, expected: int) -> dict:
    import ray
    from ray.rllib.algorithms.bc import BCConfig

    from rlds_writer.interop.formats.rllib.offline import offline_config
    from rlds_writer.interop.formats.rllib.prelearner import RLDSPreLearner

    @ray.remote(num_cpus=0)
    class Counter:
        def __init__(self):
            self.seen = []

        def add(self, keys):
            self.seen.extend(keys)

        def get(self):
            return list(self.seen)

    class CountingPreLearner(RLDSPreLearner):
        def __call__(self, batch):
            keys = list(zip(np.asarray(batch["eps_id"]).tolist(), np.asarray(batch["t"]).tolist()))
            ray.get(ray.get_actor(_COUNTER).add.remote(keys))
            return super().__call__(batch)

    counter = Counter.options(name=_COUNTER).remote()
    config = offline_config(
        BCConfig().training(train_batch_size_per_learner=16, lr=0.01).debugging(seed=0),
        url,
        prelearner_class=CountingPreLearner,
        dataset_num_iters_per_learner=1,  # the pre-learner pool sized by RLDSOfflineData
        iter_batches_kwargs={"prefetch_batches": 1},
        read_options={"bytes_per_task": 1, "num_cpus": 0.25},
    )
    algo = config.build_algo()
    seen: list = []
    try:
        for _ in range(4 * expected):
            result = algo.train()
            seen = ray.get(counter.get.remote())
            if len(seen) >= expected:
                break
    finally:
        algo.stop()
    learner = result["learners"]["default_policy"]
    return {"seen": sorted(map(list, seen)), "policy_loss": float(learner["policy_loss"])}


def main() -> None:
    work, result_path = sys.argv[1:]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    hidden = os.path.join(work, "out")
    os.makedirs(hidden)
    bucket, moto = _start_moto(work)
    result: dict = {}
    nodes: list[subprocess.Popen] = []
    try:
        url = f"{bucket}/cartpole"
        expected = _write_source(os.path.join(hidden, "cartpole"), url)
        result["expected"] = sorted(map(list, expected))
        address, nodes = _start_nodes(work, hidden)
        import ray

        _wait_for_port(address)
        ray.init(address=address, log_to_driver=bool(os.environ.get("RLLIB_CLUSTER_LOGS")))
        for _ in range(120):
            if len([n for n in ray.nodes() if n["Alive"]]) == 2:
                break
            time.sleep(1)
        result["nodes"] = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        result["read_nodes"] = _read_nodes(url)
        result.update(_train(url, len(expected)))
        ray.shutdown()
    except Exception:  # noqa: BLE001 - reported to the test
        import traceback

        result["child_error"] = traceback.format_exc()
    finally:
        with open(result_path, "w") as f:
            json.dump(result, f)
        _stop_nodes(nodes)
        moto.kill()
        moto.wait()


if __name__ == "__main__":
    main()
