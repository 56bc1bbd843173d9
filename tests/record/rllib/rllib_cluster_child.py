"""A two-node Ray cluster on loopback, a tiny PPO recording, and what reached the dataset.

Run by tests/record/rllib/test_rllib_cluster.py as the first process of new PID,
network and mount namespaces (`unshare --net --pid --fork --kill-child
--mount-proc`): everything started here ends when this process exits, and
no Ray outside is reachable or touched.

    python rllib_cluster_child.py WORKDIR RESULT_JSON SCENARIO [SCENARIO ...]

(`RLLIB_CLUSTER_LOGS=1` shows the runners' logs, recorder warnings included.)

The head node runs the driver and one EnvRunner; a second node, started in a
mount namespace of its own with a tmpfs over the output root's parent, cannot
see the driver's files; a custom resource (`slot`, one per node) puts the
other EnvRunner there. The scenarios run one after the other on that one
cluster, each into an output root of its own. SCENARIO: `single` (CartPole), `multi` (two
modules), `lost` (CartPole; one shard the second node's runner shipped is
deleted on the driver's node before `algo.stop()`) or
`s3` and `multi_s3` (as `single` and `multi`, into `s3://<bucket>/run` on a
moto server started in this namespace on 127.0.0.1; every node reaches it
through `AWS_ENDPOINT_URL`) or
`node_lost` (CartPole; the second node is stopped after the first
`train()` and a third one, as blind to the driver's files, joins: RLlib
restarts the runner there; it runs after the others). In the others the EnvRunner on the second node
is killed after the first `train()` (Ray restarts it, on that node: the
only free `slot`). The result holds RLlib's
lifetime episode counter, the episodes in the merged dataset and the error
`algo.stop()` raised, if any, per scenario (or the scenario's traceback).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

# Before RLlib (which imports TensorFlow): rlds_writer makes TensorFlow load
# RTLD_LOCAL; loaded RTLD_GLOBAL, PyPI's CUDA torch's triton aborts this
# process (the learner's) at its first optimizer.
import rlds_writer  # noqa: E402

RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_NODE_ARGS: dict[str, Any] = {}


def _start_nodes(work: str, hidden: str) -> tuple[str, list[subprocess.Popen]]:
    port = _free_port()
    temp = os.path.join(work, "ray")
    os.makedirs(temp, exist_ok=True)
    env = {**os.environ, "RAY_TMPDIR": temp}
    common = [
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        "1",
        "--object-store-memory",
        str(80 * 1024 * 1024),
        "--resources",
        json.dumps({"slot": 1}),
        "--block",
    ]
    _NODE_ARGS.update(env=env, common=common)
    head = subprocess.Popen(
        [RAY, "start", "--head", "--port", str(port), "--temp-dir", temp]
        + ["--include-dashboard", "false", "--disable-usage-stats", *common],
        env=env,
    )
    address = f"127.0.0.1:{port}"
    return address, [head, _start_hidden_node(address, hidden, env, common)]


def _stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """Stops the `ray start --block` processes: all asked at once, killed after 30 s."""
    for node in nodes:
        node.terminate()
    for node in nodes:
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()


def _start_hidden_node(
    address: str, hidden: str, env: dict[str, str], common: list[str]
) -> subprocess.Popen:
    """A node that sees a fresh tmpfs where the driver keeps the output root."""
    script = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
    return subprocess.Popen(
        ["unshare", "-m", "sh", "-c", script, "sh", hidden, RAY, "start", "--address", address]
        + common,
        env=env,
    )


def _wait_for_port(address: str) -> None:
    host, port = address.split(":")
    for _ in range(240):
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the head node never listened on {address}")


def _config(scenario: str, root: str) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig

    from rlds_writer.record.rllib import RLDSRecorder

    config = PPOConfig()
    if scenario.startswith("multi"):
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        config = config.environment(MultiAgentCartPole, env_config={"num_agents": 2}).multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
    else:
        config = config.environment("CartPole-v1")
    return (
        config.env_runners(
            num_env_runners=2,
            num_envs_per_env_runner=1,
            rollout_fragment_length=16,
            num_cpus_per_env_runner=0,
            custom_resources_per_env_runner={"slot": 1},
        )
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .fault_tolerance(restart_failed_env_runners=True)
        .callbacks(RLDSRecorder.with_options(root, name="cluster"))
    )


def _start_moto(work: str) -> tuple[str, subprocess.Popen]:
    """A moto S3 server on this namespace's loopback, and a fresh bucket on it."""
    port = _free_port()
    log = open(os.path.join(work, "moto.log"), "wb")  # noqa: SIM115 - the server's life
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1"]
        + ["-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    _wait_for_port(f"127.0.0.1:{port}")
    # Set before the nodes start: the raylets, hence every Ray worker, inherit it.
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    import fsspec

    fsspec.filesystem("s3").mkdir("cluster-bucket")
    return "s3://cluster-bucket", server


def _bucket_counts(root: str) -> tuple[list[str], dict[str, int]]:
    """The runner directories left in the bucket, and episodes read back from the merge."""
    from rlds_writer.store.storage.storage import storage_for

    fs = storage_for(root)
    left = [n for n in fs.listdir(root) if n.startswith("writer-")]
    merged = fs.join(root, "merged")
    if not fs.exists(merged):
        return left, {}
    datasets = {"": merged}
    if not fs.exists(fs.join(merged, "dataset_info.json")):  # one per module
        datasets = {f"{m}/": fs.join(merged, m) for m in fs.listdir(merged)}
    counts = {}
    for prefix, path in datasets.items():
        dataset = rlds_writer.open_dataset(path)
        for split in dataset.splits:
            counts[prefix + split] = sum(1 for _ in dataset.episodes(split))
    return left, counts


def _kill_remote_runner(algo: Any, driver_node: str) -> dict[str, Any]:
    import ray

    def where(runner: Any) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpid()

    for actor in algo.env_runner_group._worker_manager.actors().values():
        node, pid = ray.get(actor.__ray_call__.remote(where))
        if node != driver_node:
            ray.kill(actor, no_restart=False)
            for _ in range(60):
                try:
                    new = ray.get(actor.__ray_call__.remote(where), timeout=20)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    time.sleep(0.5)
                    continue
                if new[1] != pid:
                    return {"killed_pid": pid, "restarted_on": new[0]}
            raise AssertionError("the killed EnvRunner was not restarted")
    raise AssertionError("no EnvRunner on the second node")


def _sink_reports(algo: Any) -> dict[str, dict[str, Any]]:
    """Every runner's latest report, read from the driver's sink (without finishing it)."""
    import ray

    recorder = algo.callbacks[0] if isinstance(algo.callbacks, list) else algo.callbacks
    return ray.get(recorder._sink.__ray_call__.remote(lambda sink: dict(sink.reports)))


def _delete_a_shipped_shard(algo: Any, root: str, driver_node: str) -> dict[str, Any]:
    """Deletes one shard a runner on the second node shipped; returns it and that runner."""
    reports = _sink_reports(algo)
    for report in reports.values():
        if report["node_id"] != driver_node and report["shipped"]:
            for directory, splits in report["counts"].items():
                if splits.get("train"):
                    names = os.listdir(os.path.join(root, directory))
                    shard = sorted(n for n in names if ".tfrecord-" in n)[0]
                    os.remove(os.path.join(root, directory, shard))
                    return {
                        "shard": f"{directory}/{shard}",
                        "node_id": report["node_id"],
                        "worker_index": report["worker_index"],
                    }
    raise AssertionError(f"no runner of the second node shipped an episode: {reports}")


def _runner_nodes(algo: Any) -> list[str]:
    import ray

    def where(runner: Any) -> str:
        return ray.get_runtime_context().get_node_id()

    out = []
    for actor in algo.env_runner_group._worker_manager.actors().values():
        try:
            out.append(ray.get(actor.__ray_call__.remote(where), timeout=20))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            out.append("")
    return out


def _lose_the_second_node(
    algo: Any, address: str, hidden: str, nodes: list[subprocess.Popen], driver_node: str
) -> dict[str, Any]:
    """Stops the second node (its runner dies with it) and adds a third; RLlib restarts there."""
    import ray

    second = next(n for n in _runner_nodes(algo) if n != driver_node)
    nodes[1].terminate()
    nodes[1].wait(timeout=120)
    for _ in range(240):
        if not any(n["NodeID"] == second and n["Alive"] for n in ray.nodes()):
            break
        time.sleep(0.5)
    nodes.append(_start_hidden_node(address, hidden, **_NODE_ARGS))
    for _ in range(240):
        located = _runner_nodes(algo)
        if all(located) and second not in located and len(set(located)) == 2:
            third = next(n for n in located if n != driver_node)
            return {"lost_node": second, "restarted_on": third}
        time.sleep(1)
    raise AssertionError(f"the runner of the lost node was not restarted elsewhere: {located}")


def _reported_per_dataset(algo: Any) -> dict[str, int]:
    """Episodes the runners reported finished, per module (or "") and split."""
    out: dict[str, int] = {}
    for report in _sink_reports(algo).values():
        for directory, splits in report["counts"].items():
            module = directory.rpartition("/")[0]
            for split, n in splits.items():
                key = f"{module}/{split}" if module else split
                out[key] = out.get(key, 0) + n
    return out


def _episodes_reported_from(algo: Any, node_id: str) -> int:
    """Episodes the runners of one node reported to the driver's sink (so far)."""
    return sum(
        n
        for report in _sink_reports(algo).values()
        if report["node_id"] == node_id
        for splits in report["counts"].values()
        for n in splits.values()
    )


def _merged_counts(merged: str) -> dict[str, int]:
    import tensorflow_datasets as tfds

    paths = [merged]
    if not os.path.exists(os.path.join(merged, "features.json")):
        paths = sorted(os.path.join(merged, m) for m in os.listdir(merged))
    counts: dict[str, int] = {}
    for path in paths:
        builder = tfds.builder_from_directory(path)
        for split in builder.info.splits:
            n = sum(1 for _ in builder.as_dataset(split=split))
            key = f"{os.path.basename(path)}/{split}" if path != merged else split
            counts[key] = n
    return counts


def _run_scenario(
    scenario: str, root: str, address: str, hidden: str, nodes: list[subprocess.Popen]
) -> dict[str, Any]:
    import ray

    result: dict[str, Any] = {}
    driver_node = ray.get_runtime_context().get_node_id()
    algo = _config(scenario, root).build_algo()
    results = [algo.train()]
    if scenario == "node_lost":
        # The scenario needs episodes of the second node's runner delivered before its
        # node dies: a runner slow to start may have finished none in the first train().
        second = next(n for n in _runner_nodes(algo) if n != driver_node)
        for _ in range(5):
            if _episodes_reported_from(algo, second):
                break
            results.append(algo.train())
        result.update(_lose_the_second_node(algo, address, hidden, nodes, driver_node))
    else:
        result.update(_kill_remote_runner(algo, driver_node))
    result["driver_node"] = driver_node
    results.append(algo.train())
    results.append(algo.train())
    lifetime = results[-1]["env_runners"].get("num_episodes_lifetime")
    result["rllib_episodes"] = lifetime
    result["reported"] = _reported_per_dataset(algo)
    if scenario == "node_lost":
        result["lost_node_episodes"] = _episodes_reported_from(algo, result["lost_node"])
    try:
        if scenario == "lost":
            result["deleted"] = _delete_a_shipped_shard(algo, root, driver_node)
        algo.stop()
    except Exception as e:  # noqa: BLE001 - reported to the test
        result["stop_error"] = f"{type(e).__name__}: {e}"
    if scenario.endswith("s3"):
        result["runner_directories"], result["merged"] = _bucket_counts(root)
    else:
        result["runner_directories"] = sorted(
            p for p in os.listdir(root) if p.startswith("writer-")
        )
        merged = os.path.join(root, "merged")
        result["merged"] = _merged_counts(merged) if os.path.exists(merged) else {}
    return result


# `node_lost` replaces the second node and `lost` leaves a failed stop behind:
# they run after the others, whatever order they were asked in.
_LAST = ("node_lost", "lost")


def main() -> None:
    work, result_path, *scenarios = sys.argv[1:]
    scenarios.sort(key=lambda s: _LAST.index(s) + 1 if s in _LAST else 0)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # Loopback of a network namespace of our own: no token to share between the nodes.
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    hidden = os.path.join(work, "out")
    os.makedirs(hidden)
    servers = []
    bucket = ""
    if any(s.endswith("s3") for s in scenarios):
        bucket, moto = _start_moto(work)
        servers.append(moto)
    begun = time.monotonic()
    address, nodes = _start_nodes(work, hidden)
    results: dict[str, Any] = {}
    try:
        import ray

        _wait_for_port(address)
        ray.init(address=address, log_to_driver=bool(os.environ.get("RLLIB_CLUSTER_LOGS")))
        for _ in range(120):
            if len([n for n in ray.nodes() if n["Alive"]]) == 2:
                break
            time.sleep(1)
        results["cluster_start_seconds"] = round(time.monotonic() - begun, 1)
        for scenario in scenarios:
            # One output root per scenario, all under the directory the other nodes cannot see.
            root = os.path.join(hidden, scenario, "run")
            os.makedirs(root)
            if scenario.endswith("s3"):
                root = f"{bucket}/{scenario}/run"
            started = time.monotonic()
            try:
                results[scenario] = _run_scenario(scenario, root, address, hidden, nodes)
            except Exception:  # noqa: BLE001 - reported to that scenario's test
                import traceback

                results[scenario] = {"child_error": traceback.format_exc()}
            results[scenario]["seconds"] = round(time.monotonic() - started, 1)
            # Written after each scenario: Ray may end this process if its nodes fail.
            with open(result_path, "w") as f:
                json.dump(results, f)
        ray.shutdown()
    finally:
        _stop_nodes(nodes)
        for server in servers:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
