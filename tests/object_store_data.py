"""A local dataset worth reading by ranges: three shards of large episodes with a camera.

Each episode holds 8 steps of a 32 KB state vector and a 24x24 RGB camera
(PNG), about 300 KB; four episodes per shard file. Reading one episode of it
in object storage should fetch a few hundred KB, not the 3.6 MB of the whole.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

import rlds_writer

EPISODES = 12
PER_SHARD = 4
STEPS = 8


class CameraEnv(gym.Env):
    """Random observations, fixed-length episodes (seeded: the same data every time)."""

    observation_space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (24, 24, 3), np.uint8),
            "state": gym.spaces.Box(-1.0, 1.0, (8192,), np.float32),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)
        self._t = 0

    def _obs(self) -> dict:
        return {
            "image": self._rng.integers(0, 256, (24, 24, 3), dtype=np.uint8),
            "state": self._rng.uniform(-1, 1, 8192).astype(np.float32),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), float(self._t), self._t == STEPS - 1, False, {}


def write_camera_dataset(path: Path, file_format: str = "tfrecord") -> Path:
    """Records `EPISODES` episodes of `CameraEnv` to `path`, `PER_SHARD` per shard file."""
    env = rlds_writer.RecordRLDS(
        CameraEnv(), path, max_episodes_per_file=PER_SHARD, file_format=file_format
    )
    action = np.zeros(2, np.float32)
    for _ in range(EPISODES):
        env.reset()
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    env.close()
    return path
