"""Benchmark: RLDS read by Ray Data and RLlib straight from its shards, against a Parquet export.

Records a dataset (float32 (64,) observations, a discrete action, 200-step
episodes), exports it once with `rlds-writer export --to rllib-episodes
--layout columns` (RLlib's column Parquet), then, on one local Ray (2 CPUs)
or, with `--nodes 2`, on a head and a worker node (1 CPU each) reading both
copies from a moto S3 server with no shared file system:

* **read throughput**, transitions (rows) per second through
  `Dataset.iter_batches(batch_size=1024)`: `read_rlds(path, rows="transitions")`
  against `ray.data.read_parquet` of the export, and (one node) against TFDS
  reading the same RLDS shards through `tf.data` with parallel interleave
  (`builder.as_dataset(read_config=ReadConfig(num_parallel_calls_for_interleave_files=AUTOTUNE))`,
  steps flattened and batched by 1024, as numpy: steps, not pairs);
* **transitions per second into RLlib's learner**: BC (or `--algo marwil`),
  `train()` with `train_batch_size_per_learner=1024` after two warm-up
  iterations (the timed calls), and over the whole run (every call, the first
  two, where the read starts, included: what a user's training gets), from
  `offline_config(BCConfig(), path)` (the datasource, column schema, with
  its `RLDSPreLearner`) against `offline_data(input_=[export])` (RLlib's
  default `read_parquet` path and `OfflinePreLearner`); and, to show which
  part does what, each input with the other's pre-learner (not with
  `--defaults-only`). The inputs take turns within each repetition, in an
  order that turns every repetition (A, B, B, A, ...); medians and ranges.
  `--stream` keeps nothing in memory (every epoch reads and maps again).

Run Ray in a loopback-only network namespace, under the machine's locks:

    flock /tmp/rlds-bench.lock flock /tmp/rlds-ray.lock unshare --net --pid --fork \
        --kill-child --mount-proc sh -c 'ip link set lo up && \
        python benchmarks/ray_offline.py --report'

`--nodes 2` starts moto and the two nodes itself (as
tests/interop/test_rllib_offline_cluster.py does, with its helpers), in the
same kind of namespace, which it needs (root).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
from report_sections import add_report_argument, write_section  # noqa: E402

import rlds_writer  # noqa: E402, F401 - TensorFlow RTLD_LOCAL before torch

SECTION = "## Ray Data and RLlib offline: RLDS read in place vs a Parquet export"
SECTION_2 = "## Ray Data and RLlib offline on two nodes: RLDS in S3 vs a Parquet export in S3"
STREAM = " (streaming: materialize_mapped_data=False)"
STEPS = 200
BATCH = 1024


def record(path: str, episodes: int) -> int:
    import gymnasium as gym

    from rlds_writer.record.spaces import spaces_config

    config = spaces_config(
        gym.spaces.Box(-1, 1, (64,), np.float32), gym.spaces.Discrete(4), name="bench"
    )
    rng = np.random.default_rng(0)
    with rlds_writer.TFDSBackendWriter(path, config, max_episodes_per_file=50) as writer:
        for _ in range(episodes):
            writer.write_episode(
                {
                    "observation": rng.uniform(-1, 1, (STEPS + 1, 64)).astype(np.float32),
                    "action": rng.integers(0, 4, STEPS),
                    "reward": rng.random(STEPS, dtype=np.float32),
                },
                terminated=True,
            )
    return episodes * STEPS


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _rows_per_second(make, repetitions: int) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repetitions):
        ds = make()
        start = time.perf_counter()
        rows = 0
        for batch in ds:
            rows += len(next(iter(batch.values())))
        best = min(best, time.perf_counter() - start)
    return rows / best, rows


def _tfds_steps(path: str):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(path)
    config = tfds.ReadConfig(
        num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE, interleave_cycle_length=4
    )
    ds = builder.as_dataset(split="train", read_config=config)
    ds = ds.flat_map(lambda episode: episode["steps"]).batch(BATCH)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return tfds.as_numpy(ds)


def _learner_rate(config, iterations: int) -> tuple[float, float, float, float]:
    """Transitions per second into the learner, the 1-minute load average before, the
    seconds of the 2 warm-up `train()` calls and the rate counting them.

    With BC's defaults (`materialize_mapped_data=True`) the first call reads and
    maps the whole dataset and keeps the learner's batches in memory: the timed
    calls after it iterate those (the input is not in them); the warm-up is the input.
    """
    load = os.getloadavg()[0]
    algo = config.build_algo()
    try:
        start = time.perf_counter()
        for _ in range(2):
            algo.train()
        warm = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(iterations):
            algo.train()
        seconds = time.perf_counter() - start
    finally:
        algo.stop()
    whole = (iterations + 2) * BATCH / (seconds + warm)
    return iterations * BATCH / seconds, load, warm, whole


def _learner_configs(
    path: str,
    export: str,
    parquet_fs=None,
    stream: bool = False,
    algo: str = "bc",
    swapped: bool = True,
) -> dict:
    import gymnasium as gym
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.algorithms.marwil import MARWILConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    from rlds_writer.interop.formats.rllib.offline import offline_config
    from rlds_writer.interop.formats.rllib.prelearner import RLDSPreLearner

    def base():
        made = {"bc": BCConfig, "marwil": MARWILConfig}[algo]()
        config = made.training(train_batch_size_per_learner=BATCH).debugging(seed=0)
        if stream:  # every epoch reads and maps again (a dataset larger than memory)
            config = config.offline_data(materialize_data=False, materialize_mapped_data=False)
        return config

    # The same pool for every input: RLlib's default (2 x 1 CPU) starves its
    # read_parquet tasks on 2 CPUs (RLDSOfflineData sizes its own; here fixed).
    common = {
        "dataset_num_iters_per_learner": 1,
        "map_batches_kwargs": {"concurrency": 1, "num_cpus": 1},
    }
    # The recorder stored no spaces: RLlib is told them (a Box of ints it refuses).
    spaces = {
        "observation_space": gym.spaces.Box(-1, 1, (64,), np.float32),
        "action_space": gym.spaces.Discrete(4),
    }
    parquet = {"input_filesystem": parquet_fs} if parquet_fs is not None else {}

    def theirs(prelearner):
        chosen = {"prelearner_class": prelearner} if prelearner else {}
        return (
            base()
            .environment(**spaces)
            .offline_data(input_=[export], **chosen, **parquet, **common)
        )

    configs = {
        "RLDS datasource + RLDSPreLearner (offline_config's default)": lambda: offline_config(
            base(), path, **spaces, **common
        ),
        "Parquet export + RLlib's OfflinePreLearner (RLlib's default)": lambda: theirs(None),
    }
    if swapped:
        configs |= {
            "RLDS datasource + RLlib's OfflinePreLearner": lambda: offline_config(
                base(), path, **spaces, prelearner_class=OfflinePreLearner, **common
            ),
            "Parquet export + RLDSPreLearner": lambda: theirs(RLDSPreLearner),
        }
    return configs


def _prelearner_rates(path: str, repetitions: int) -> dict[str, list[float]]:
    """Rows per second through each pre-learner alone, in this process (no Ray actors).

    A 1024-row batch of the datasource's transition rows (whole 200-step
    episodes, in order) goes through `__call__` (episodes, then BC's and
    MARWIL's learner connectors) 10 times per repetition; the two take turns.
    """
    import gymnasium as gym
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.algorithms.marwil import MARWILConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    from rlds_writer.interop.formats.rllib.offline import offline_config, read_for_rllib
    from rlds_writer.interop.formats.rllib.prelearner import RLDSPreLearner

    spaces = (gym.spaces.Box(-1, 1, (64,), np.float32), gym.spaces.Discrete(4))
    rates: dict[str, list[float]] = {}
    for algo in (BCConfig, MARWILConfig):
        config = offline_config(
            algo().training(train_batch_size_per_learner=BATCH),
            path,
            observation_space=spaces[0],
            action_space=spaces[1],
        )
        batch = read_for_rllib(config).take_batch(BATCH)
        spec = config.get_multi_rl_module_spec(spaces={"default_policy": spaces})
        made = {
            f"{algo.__name__[:-6]}, RLlib's OfflinePreLearner": OfflinePreLearner,
            f"{algo.__name__[:-6]}, RLDSPreLearner": RLDSPreLearner,
        }
        made = {n: c(config=config, spaces=spaces, module_spec=spec) for n, c in made.items()}
        for _ in range(repetitions):
            for name, prelearner in made.items():
                prelearner(dict(batch))  # warm
                start = time.perf_counter()
                for _ in range(10):
                    prelearner(dict(batch))
                rate = 10 * BATCH / (time.perf_counter() - start)
                rates.setdefault(name, []).append(rate)
    return rates


def _measure(path: str, export: str, args, parquet_fs=None, tfds_path=None):
    import ray

    from rlds_writer.read.ray_data import read_rlds

    parquet_kwargs = {"filesystem": parquet_fs} if parquet_fs is not None else {}
    reads = {
        "read_rlds(rows='transitions')": _rows_per_second(
            lambda: read_rlds(path, rows="transitions").iter_batches(batch_size=BATCH),
            args.repetitions,
        ),
        "ray.data.read_parquet(export)": _rows_per_second(
            lambda: ray.data.read_parquet(export, **parquet_kwargs).iter_batches(batch_size=BATCH),
            args.repetitions,
        ),
    }
    if tfds_path is not None:
        reads["tfds + tf.data interleave (steps)"] = _rows_per_second(
            lambda: _tfds_steps(tfds_path), args.repetitions
        )
    configs = _learner_configs(
        path, export, parquet_fs, args.stream, args.algo, not args.defaults_only
    )
    learners: dict[str, list] = {name: [] for name in configs}
    for repetition in range(args.repetitions):  # interleaved: each input once per round
        # The order turns every round (A, B, B, A, ...): no input always runs first.
        order = list(configs.items())
        for name, make in order if repetition % 2 == 0 else order[::-1]:
            learners[name].append(_learner_rate(make(), args.iterations))
    return reads, learners


def _table(reads, learners, args, transitions: int) -> list[str]:
    prelearners = learners.pop("prelearners", None)
    lines = [
        f"Read throughput (best of {args.repetitions}, `iter_batches(batch_size={BATCH})`):",
        "",
        "| reader | rows/s | vs read_parquet |",
        "|---|---|---|",
    ]
    parquet = reads["ray.data.read_parquet(export)"][0]
    for name, (rate, rows) in reads.items():
        lines.append(f"| {name} ({rows:,} rows) | {rate:,.0f} | {rate / parquet:.2f}x |")
    lines += [
        "",
        f"Into RLlib's learner ({args.algo.upper()}, batch {BATCH}, {args.iterations} timed "
        f"`train()` calls after 2 warm-up ones ({(args.iterations + 2) * BATCH / transitions:.2f} "
        f"epochs in all), one local learner; {args.repetitions} repetitions, each in a fresh "
        "algorithm, the inputs taking turns in an order that turns every round; median [min - "
        "max]; 1-minute load average before each run). *Timed calls*: the rate of the calls "
        "after the first two; *whole run*: all calls' transitions over all their seconds, the "
        "first two included (where the read and the mapping start), what a user's training "
        "gets:",
        "",
        "| input + pre-learner | transitions/s, timed calls | vs RLlib's default | first 2 "
        "calls (s) | transitions/s, whole run | vs RLlib's default | load |",
        "|---|---|---|---|---|---|---|",
    ]
    default = learners["Parquet export + RLlib's OfflinePreLearner (RLlib's default)"]
    reference = float(np.median([run[0] for run in default]))
    whole_reference = float(np.median([run[3] for run in default]))
    for name, runs in learners.items():
        rates, loads, warms, wholes = (list(column) for column in zip(*runs))
        median, whole = float(np.median(rates)), float(np.median(wholes))
        lines.append(
            f"| {name} | {median:,.0f} [{min(rates):,.0f} - {max(rates):,.0f}] | "
            f"{median / reference:.2f}x | {np.median(warms):.1f} [{min(warms):.1f} - "
            f"{max(warms):.1f}] | {whole:,.0f} [{min(wholes):,.0f} - "
            f"{max(wholes):,.0f}] | {whole / whole_reference:.2f}x | "
            f"{min(loads):.1f} - {max(loads):.1f} |"
        )
    if prelearners:
        lines += [
            "",
            f"The pre-learners alone, in one process (a {BATCH}-row batch of the datasource's "
            f"rows through `__call__`, 10 calls per repetition, the two taking turns; median "
            "[min - max]):",
            "",
            "| algorithm, pre-learner | rows/s |",
            "|---|---|",
        ]
        for name, rates in prelearners.items():
            lines.append(
                f"| {name} | {np.median(rates):,.0f} [{min(rates):,.0f} - {max(rates):,.0f}] |"
            )
    return lines


def _one_node(args, tmp: str):
    import ray

    path = os.path.join(tmp, "rlds")
    transitions = record(path, args.episodes)
    export = os.path.join(tmp, "parquet")
    rlds_writer.export(path, export, to="rllib-episodes", layout="columns")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        reads, learners = _measure(path, export, args, tfds_path=path)
        learners["prelearners"] = _prelearner_rates(path, args.repetitions)
    finally:
        ray.shutdown()
    return transitions, (_size(path), _size(export)), reads, learners


def _two_nodes(args, tmp: str):
    """moto S3 and a head + a worker node in this (loopback-only) namespace."""
    import subprocess
    import sys

    import ray

    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    sys.path.insert(0, os.path.join(tests, "record", "rllib"))
    from rllib_cluster_child import _start_moto, _start_nodes, _stop_nodes, _wait_for_port

    from rlds_writer.store.storage.storage import storage_for

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    hidden = os.path.join(tmp, "out")  # the worker node sees a tmpfs here
    os.makedirs(hidden)
    bucket, moto = _start_moto(tmp)
    nodes = []
    try:
        local = os.path.join(hidden, "rlds")
        transitions = record(local, args.episodes)
        export = os.path.join(hidden, "parquet")
        rlds_writer.export(local, export, to="rllib-episodes", layout="columns")
        sizes = (_size(local), _size(export))
        store = storage_for(bucket)
        for name in ("rlds", "parquet"):
            for folder, _, files in os.walk(os.path.join(hidden, name)):
                for file in files:
                    relative = os.path.relpath(os.path.join(folder, file), hidden)
                    store.upload(os.path.join(folder, file), f"{bucket}/{relative}")
        address, nodes = _start_nodes(tmp, hidden)
        _wait_for_port(address)
        ray.init(address=address, log_to_driver=False)
        for _ in range(120):
            if len([n for n in ray.nodes() if n["Alive"]]) == 2:
                break
            time.sleep(1)
        import pyarrow.fs

        endpoint = os.environ["AWS_ENDPOINT_URL"].removeprefix("http://")
        fs = pyarrow.fs.S3FileSystem(
            endpoint_override=endpoint,
            scheme="http",
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
        )
        reads, learners = _measure(f"{bucket}/rlds", "cluster-bucket/parquet", args, fs)
        ray.shutdown()
    finally:
        _stop_nodes(nodes)
        moto.kill()
        moto.wait()
    return transitions, sizes, reads, learners


def _what_the_calls_hold(args) -> str:
    if args.stream:
        return (
            "Streaming (`materialize_data=False, materialize_mapped_data=False`): nothing is "
            "kept in memory, every epoch reads and maps its transitions again while the "
            "learner trains, and RLlib makes its pre-learner actor anew at each epoch (for "
            "both inputs): the timed calls hold the input's whole cost."
        )
    if args.algo == "marwil":
        return (
            "MARWIL keeps the read rows in memory by default (`materialize_data=True`) and "
            "maps them in every call (`materialize_mapped_data=False`: its advantages need "
            "the current value network): the first call reads every transition, the timed "
            "calls hold the pre-learner's work (episodes, GAE) but not the read."
        )
    return (
        "BC keeps the mapped epoch in memory by default (`materialize_mapped_data=True`): "
        "the first `train()` call reads and maps every transition, the timed calls after the "
        "2 warm-up ones iterate the learner's batches from memory, so no input runs in them "
        "(py-spy: no read task or pre-learner active); the input's own cost is in the first "
        "2 calls, so in the whole run's rate, and in every epoch with `--stream`."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch threads of the local learner (in this process); 0: torch's default",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="materialize_data=materialize_mapped_data=False: every epoch reads and maps "
        "again (BC keeps the mapped epoch in memory by default, so the timed calls hold no "
        "input; MARWIL the read rows, mapping them in every call)",
    )
    parser.add_argument(
        "--algo",
        choices=("bc", "marwil"),
        default="bc",
        help="the offline algorithm, with RLlib's defaults for what it keeps in memory",
    )
    parser.add_argument(
        "--defaults-only",
        action="store_true",
        help="only each input with its default pre-learner (not the swapped pairs)",
    )
    add_report_argument(parser)
    args = parser.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        run = _two_nodes if args.nodes == 2 else _one_node
        transitions, sizes, reads, learners = run(args, tmp)
    nodes = f" --nodes {args.nodes}" if args.nodes == 2 else ""
    if args.torch_threads:
        nodes += f" --torch-threads {args.torch_threads}"
    if args.stream:
        nodes += " --stream"
    if args.algo != "bc":
        nodes += f" --algo {args.algo}"
    if args.defaults_only:
        nodes += " --defaults-only"
    where = (
        "one local Ray with 2 CPUs"
        if args.nodes == 1
        else "a head and a worker node (1 CPU each, the worker blind to the driver's files), "
        "both copies read from a moto S3 server, all on loopback in one network namespace"
    )
    lines = [
        (SECTION if args.nodes == 1 else SECTION_2)
        + (f" ({args.algo.upper()})" if args.algo != "bc" else "")
        + (STREAM if args.stream else ""),
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        "`flock /tmp/rlds-bench.lock flock /tmp/rlds-ray.lock unshare --net --pid --fork "
        "--kill-child --mount-proc sh -c 'ip link set lo up && python "
        f"benchmarks/ray_offline.py --episodes {args.episodes} --iterations "
        f"{args.iterations} --repetitions {args.repetitions}{nodes} --report'`: "
        f"{args.episodes} episodes of {STEPS} steps "
        f"(float32 (64,) observations, Discrete(4) actions), {transitions:,} transitions; "
        f"{where}, on a {os.cpu_count()}-core machine shared with other work at the time "
        f"(noisy figures). RLDS: {sizes[0] / 1e6:.1f} MB; the Parquet export, a second "
        f"copy: {sizes[1] / 1e6:.1f} MB.",
        "",
        *_table(reads, learners, args, transitions),
        "",
        "Both inputs feed the same learner through one pre-learner actor of 1 CPU "
        "(`map_batches_kwargs={'concurrency': 1, 'num_cpus': 1}`: RLlib's default pool of "
        "2 x 1 CPU starves its own read_parquet tasks on 2 CPUs). RLlib's `OfflinePreLearner` "
        "makes one one-step `SingleAgentEpisode` per row; `RLDSPreLearner` one per run of an "
        "episode in the batch (the same BC batch), so it leaves more of the 2 CPUs to the "
        "reads and the learner. With the load this high the runs vary by several times: "
        "read the medians with their ranges.",
        "",
        _what_the_calls_hold(args),
        "",
    ]
    if args.nodes == 2:
        lines[-1:-1] = [
            "",
            "Two nodes on this machine are two sets of processes on the same 2 cores, with "
            "S3 on loopback: the figures show the reads spread over both nodes and no "
            "second copy needed, not a cluster's scaling.",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        write_section(args.report, lines[0], text)


if __name__ == "__main__":
    main()
