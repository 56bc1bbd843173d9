"""The discrete-action range check's own cost (`record/batch/action_range.py`).

The same recorders with the check on and off, interleaved in one process (15 rounds):
`RecordRLDSEnvPool._sent` (64 of 256 CartPole sub-envs, the check before EnvPool sees
the actions) and `RecordRLDSVector.step` over a vector env that costs almost nothing
(64 sub-envs, `Discrete(4)`), i.e. the recorder's own per-step cost.

    python benchmarks/action_range_cost.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import warnings

import envpool
import gymnasium as gym
import numpy as np

from rlds_writer import RecordRLDSVector
from rlds_writer.record.batch.envpool import RecordRLDSEnvPool

N = 64


class Idle(gym.vector.VectorEnv):
    """N sub-envs whose step costs almost nothing; some episodes end every 50th step."""

    def __init__(self):
        self.num_envs = N
        self.single_observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, N)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, N)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.obs = np.zeros((N, 4), np.float32)
        self.rewards = np.ones(N, np.float32)
        self.none = np.zeros(N, bool)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        return self.obs, {}

    def step(self, actions):
        self.t += 1
        ends = self.none if self.t % 50 else (np.arange(N) % 7 == self.t % 7)
        return self.obs, self.rewards, ends, self.none, {}


def main() -> None:
    warnings.simplefilter("ignore")  # EnvPool's Box bounds
    root = tempfile.mkdtemp()
    pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=256, batch_size=64, seed=0)
    env = RecordRLDSEnvPool(pool, os.path.join(root, "envpool"))
    env.async_reset()
    ids = env.recv()[-1]["env_id"]
    sent = np.ones(64, np.int32)
    pool_range = env._range
    venv = RecordRLDSVector(Idle(), os.path.join(root, "vector"))
    venv.reset()
    vector_range = venv._action_range
    actions = np.random.default_rng(0).integers(0, 4, (64, N))
    for i in range(500):
        venv.step(actions[i % 64])
    res: dict[tuple[str, bool], list[float]] = {}
    for _ in range(15):
        for on in (True, False):
            env._range = pool_range if on else None
            t = time.perf_counter()
            for _ in range(5000):
                env._sent(sent, ids)
            us = (time.perf_counter() - t) / 5000 * 1e6
            res.setdefault(("RecordRLDSEnvPool._sent us (64 of 256)", on), []).append(us)
            venv._action_range = vector_range if on else None
            t = time.perf_counter()
            for i in range(3000):
                venv.step(actions[i % 64])
            us = (time.perf_counter() - t) / 3000 * 1e6
            res.setdefault(("RecordRLDSVector.step us (N=64)", on), []).append(us)
    for (name, on), v in sorted(res.items()):
        print(
            f"{name:40s} check={'on ' if on else 'off'} median {statistics.median(v):6.2f} "
            f"range {min(v):.2f}-{max(v):.2f}"
        )
    env.close()
    venv.close()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
