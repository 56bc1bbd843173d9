"""The writer thread's `SplitShards.append_records` of two or more checkouts, alternated.

A batched recording (`RecordRLDSVector` at N = 1024 on vector CartPole)
ends about 46 episodes per vector step; the writer thread encodes them into
one buffer of framed TFRecord records (~40 KB) and hands it to
`SplitShards.append_records`, once per vector step, while the env thread
steps. This times that call alone, per call, in the writer thread's CPU time
(`time.thread_time`) and wall time, with the same batch of framed records
(46 records of 850 bytes), into the shards of a real `DatasetWriter`
(1,000 episodes per shard: rotations and zeros written ahead as in the
recording), in two settings:

* `alone`: nothing else runs in the process;
* `env`: a thread steps `gym.make_vec("CartPole-v1", 1024)` meanwhile (the
  GIL and the CPU shared as in the recording), one `append_records` per env
  step.

Each checkout runs in a subprocess with that checkout first on the path,
round after round; printed: per checkout and setting, the median (range)
over rounds of the per-round median and mean CPU per call.

    python benchmarks/shard_append_ab.py /tmp/base /work/wt [--rounds 5] [--calls 3000]

Each checkout needs its C extensions built in place (`setup.py build_ext --inplace`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, os, shutil, statistics, sys, tempfile, threading, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import rlds_writer
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.writing.writer import DatasetWriter

calls, setting = int(sys.argv[2]), sys.argv[3]
assert rlds_writer.__file__.startswith(sys.argv[1]), rlds_writer.__file__
rng = np.random.default_rng(0)
parts, starts, lengths, at = [], [], [], 0
for _ in range(46):
    data = rng.integers(0, 256, 850, np.uint8).tobytes()
    header, footer = tfrecord.frame_parts_of([data], len(data))
    parts += [bytes(header), data, bytes(footer)]
    starts.append(at)
    lengths.append(len(data))
    at += 16 + len(data)
buffer = np.frombuffer(b"".join(parts), np.uint8).copy()
starts, lengths = np.array(starts, np.int64), np.array(lengths, np.int64)
work = tempfile.mkdtemp(prefix="rlds_append_ab_")
import gymnasium as gym
from rlds_writer.record import spaces

config = spaces.spaces_config(
    gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), "append_ab"
)
writer = DatasetWriter(os.path.join(work, "ds"), config)
shards = writer._shards
cpu, wall = [], []
stepped = threading.Event()
done = threading.Event()


def write():
    for _ in range(calls):
        if setting == "env":
            stepped.wait()
            stepped.clear()
        c, w = time.thread_time(), time.perf_counter()
        shards.append_records("train", buffer, starts, lengths)
        shards.rotate_if_full("train")
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    done.set()


thread = threading.Thread(target=write)
thread.start()
if setting == "env":
    env = gym.make_vec("CartPole-v1", num_envs=1024, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    actions = rng.integers(0, 2, (64, 1024))
    t = 0
    while not done.is_set():
        env.step(actions[t % 64])
        t += 1
        stepped.set()
thread.join()
writer.close()
shutil.rmtree(work)
us = lambda xs: statistics.median(xs) * 1e6
print(json.dumps({
    "cpu_median": us(cpu), "cpu_mean": statistics.mean(cpu) * 1e6,
    "wall_median": us(wall), "wall_mean": statistics.mean(wall) * 1e6,
}))
"""


def _measure(checkout: str, calls: int, setting: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=checkout)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, checkout, str(calls), setting],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--settings", default="alone,env")
    args = parser.parse_args()
    settings = args.settings.split(",")
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for setting in settings:
            for checkout in args.checkouts:
                load = os.getloadavg()[0]
                got = _measure(os.path.abspath(checkout), args.calls, setting)
                for k, v in got.items():
                    found.setdefault((checkout, setting), {}).setdefault(k, []).append(v)
                print(
                    f"round {round_ + 1} {setting} {checkout}: load {load:.1f}, CPU per call "
                    f"median {got['cpu_median']:.1f} mean {got['cpu_mean']:.1f} us, wall mean "
                    f"{got['wall_mean']:.1f} us",
                    flush=True,
                )
    print("\n| setting | checkout | CPU median (us/call) | CPU mean | wall mean |")
    print("|---|---|---|---|---|")
    for (checkout, setting), got in found.items():
        cells = [
            f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
            for v in (got["cpu_median"], got["cpu_mean"], got["wall_mean"])
        ]
        print(f"| {setting} | {checkout} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
