"""Benchmark: one quick figure, recording overhead per sub-env step of `RecordRLDSVector`.

Gymnasium's native vector CartPole with N sub-envs, T vector steps of fixed
random actions, bare then recorded (creation to `close()` returned), wall and
process CPU. Meant for comparing two checkouts side by side under the same
load (interleave the runs):

    PYTHONPATH=/path/to/old/checkout python benchmarks/vector_cartpole_overhead.py 1024 300
    PYTHONPATH=. python benchmarks/vector_cartpole_overhead.py 1024 300
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np

from rlds_writer import RecordRLDSVector


def main() -> None:
    n, steps = int(sys.argv[1]), int(sys.argv[2])

    def make():
        return gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")

    actions = np.random.default_rng(0).integers(0, 2, (64, n))
    env = make()
    env.reset(seed=0)
    wall, cpu = time.perf_counter(), time.process_time()
    for t in range(steps):
        env.step(actions[t % 64])
    bare, bare_cpu = time.perf_counter() - wall, time.process_time() - cpu
    directory = tempfile.mkdtemp()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        env = RecordRLDSVector(make(), directory + "/ds")
        env.reset(seed=0)
        for t in range(steps):
            env.step(actions[t % 64])
        env.close()
        rec, rec_cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        shutil.rmtree(directory)
    per = 1e9 / (steps * n)
    print(
        f"N={n} bare {bare * per:.0f} ns/sub-env step; overhead {(rec - bare) * per:.0f} ns "
        f"wall, {(rec_cpu - bare_cpu) * per:.0f} ns CPU; {env.recorder.episodes_written} episodes"
    )


if __name__ == "__main__":
    main()
