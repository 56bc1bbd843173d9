"""Env-thread CPU per vector step of RecordRLDSVector in same-step autoreset, N sub-envs.

Real Gymnasium SyncVectorEnv CartPole steps (autoreset_mode=SAME_STEP, final_obs an object
array) are collected first, then replayed to the recorder so the env's own ~13 ms/step does
not drown the recording's cost. argv: N T. Prints us per vector step of the recorded step
(thread CPU, process CPU, wall) and the replay's bare cost.

Usage: python benchmarks/vector_same_step.py 1024 400
"""

import shutil
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorWrapper

from rlds_writer import RecordRLDSVector

n, steps = int(sys.argv[1]), int(sys.argv[2])
venv = gym.make_vec(
    "CartPole-v1",
    num_envs=n,
    vectorization_mode="sync",
    vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
)
actions = np.random.default_rng(0).integers(0, 2, (64, n))
first = venv.reset(seed=0)
tape = [venv.step(actions[t % 64]) for t in range(64)]


class Replay(VectorWrapper):
    t = 0

    def reset(self, **kw):
        return first

    def step(self, a):
        self.t += 1
        return tape[(self.t - 1) % 64]


r = Replay(venv)
c0 = time.thread_time()
for t in range(steps):
    r.step(actions[t % 64])
bare = (time.thread_time() - c0) * 1e6 / steps
d = tempfile.mkdtemp()
env = RecordRLDSVector(Replay(venv), d + "/ds")
env.reset(seed=0)
for t in range(64):
    env.step(actions[t % 64])
c0 = time.thread_time()
p0 = time.process_time()
w0 = time.perf_counter()
for t in range(steps):
    env.step(actions[t % 64])
c, p, w = time.thread_time() - c0, time.process_time() - p0, time.perf_counter() - w0
env.close()
shutil.rmtree(d)
ended = np.mean([(te | tr).sum() for _, _, te, tr, _ in tape])
per = 1e6 / steps
print(
    f"N={n} ended/step {ended:.1f} replay {bare:.1f} | recorded env-thread CPU "
    f"{c * per:.1f} process CPU {p * per:.1f} wall {w * per:.1f} us/vstep"
)
