"""Benchmark: RLDS read by Ray Data and RLlib straight from its shards, against a Parquet export.

Records a dataset (float32 (64,) observations, a discrete action, 200-step
episodes), exports it once with `rlds-writer export --to rllib-episodes
--layout columns` (RLlib's column Parquet), then, on one local Ray (2 CPUs):

* **read throughput**, transitions (rows) per second through
  `Dataset.iter_batches(batch_size=1024)`: `read_rlds(path, rows="transitions")`
  against `ray.data.read_parquet` of the export, and against TFDS reading
  the same RLDS shards through `tf.data` with parallel interleave
  (`builder.as_dataset(read_config=ReadConfig(num_parallel_calls_for_interleave_files=AUTOTUNE))`,
  steps flattened and batched by 1024, as numpy: steps, not pairs);
* **transitions per second into RLlib's learner**: BC, `train()` with
  `train_batch_size_per_learner=1024` after two warm-up iterations, from
  `offline_config(BCConfig(), path)` (the datasource, column schema) against
  `offline_data(input_=[export])` (RLlib's default `read_parquet` path).

Run Ray in a loopback-only network namespace, under the machine's locks:

    flock /tmp/rlds-bench.lock flock /tmp/rlds-ray.lock unshare --net --pid --fork \
        --kill-child --mount-proc sh -c 'ip link set lo up && \
        python benchmarks/ray_offline.py --report'
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


def _learner_rate(config, iterations: int) -> float:
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        start = time.perf_counter()
        for _ in range(iterations):
            algo.train()
        seconds = time.perf_counter() - start
    finally:
        algo.stop()
    return iterations * BATCH / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    add_report_argument(parser)
    args = parser.parse_args()
    import gymnasium as gym
    import ray

    from rlds_writer.interop.formats.rllib.offline import offline_config
    from rlds_writer.read.ray_data import read_rlds

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rlds")
        transitions = record(path, args.episodes)
        export = os.path.join(tmp, "parquet")
        rlds_writer.export(path, export, to="rllib-episodes", layout="columns")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            reads = {
                "read_rlds(rows='transitions')": _rows_per_second(
                    lambda: read_rlds(path, rows="transitions").iter_batches(batch_size=BATCH),
                    args.repetitions,
                ),
                "ray.data.read_parquet(export)": _rows_per_second(
                    lambda: ray.data.read_parquet(export).iter_batches(batch_size=BATCH),
                    args.repetitions,
                ),
                "tfds + tf.data interleave (steps)": _rows_per_second(
                    lambda: _tfds_steps(path), args.repetitions
                ),
            }
            from ray.rllib.algorithms.bc import BCConfig

            def base():
                return BCConfig().training(train_batch_size_per_learner=BATCH).debugging(seed=0)

            common = {
                "dataset_num_iters_per_learner": 1,
                "map_batches_kwargs": {"concurrency": 1, "num_cpus": 1},
            }
            # The recorder stored no spaces: RLlib is told them (a Box of ints it refuses).
            spaces = {
                "observation_space": gym.spaces.Box(-1, 1, (64,), np.float32),
                "action_space": gym.spaces.Discrete(4),
            }
            ours = offline_config(base(), path, **spaces, **common)
            theirs = base().environment(**spaces).offline_data(input_=[export], **common)
            learners = {
                "RLDS datasource (offline_config, columns)": _learner_rate(ours, args.iterations),
                "Parquet export, RLlib's read_parquet": _learner_rate(theirs, args.iterations),
            }
        finally:
            ray.shutdown()
        sizes = (_size(path), _size(export))
    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        "`flock /tmp/rlds-bench.lock flock /tmp/rlds-ray.lock unshare --net --pid --fork "
        "--kill-child --mount-proc sh -c 'ip link set lo up && python "
        f"benchmarks/ray_offline.py --episodes {args.episodes} --iterations "
        f"{args.iterations} --repetitions {args.repetitions} --report'`: "
        f"{args.episodes} episodes of {STEPS} steps "
        f"(float32 (64,) observations, Discrete(4) actions), {transitions:,} transitions; "
        f"one local Ray with 2 CPUs on a {os.cpu_count()}-core machine shared with other "
        "work at the time (noisy figures). RLDS on disk: "
        f"{sizes[0] / 1e6:.1f} MB; the Parquet export, a second copy: {sizes[1] / 1e6:.1f} MB.",
        "",
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
        f"Into RLlib's learner (BC, batch {BATCH}, {args.iterations} `train()` calls after 2 "
        "warm-up ones, one local learner):",
        "",
        "| input | transitions/s | vs Parquet |",
        "|---|---|---|",
    ]
    parquet = learners["Parquet export, RLlib's read_parquet"]
    for name, rate in learners.items():
        lines.append(f"| {name} | {rate:,.0f} | {rate / parquet:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        write_section(args.report, SECTION, text)


if __name__ == "__main__":
    main()
