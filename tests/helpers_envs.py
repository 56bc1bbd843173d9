"""Small Gymnasium envs shared by the exporter tests."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Rover(gym.Env):
    """Dict observations (a 2-D position and a small RGB camera) and continuous actions.

    Unregistered (no env id to recover); terminates after 4 steps; the reward
    is minus the distance travelled from the origin.
    """

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "camera": gym.spaces.Box(0, 255, (6, 5, 3), np.uint8),
        }
    )
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def _obs(self):
        camera = self.np_random.integers(0, 256, (6, 5, 3), dtype=np.uint8)
        return {"pos": self.pos.copy(), "camera": camera}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2, np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos += action
        self.t += 1
        return self._obs(), float(-np.abs(self.pos).sum()), self.t >= 4, False, {}


class Grey(gym.Env):
    """One-channel uint8 frames `(84, 84, 1)`, as Atari's (`config_from_env` makes them PNGs).

    Truncates after 3 steps through its own counter; Discrete(2) actions.
    """

    observation_space = gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (84, 84, 1), dtype=np.uint8), {}

    def step(self, action):
        self.t += 1
        frame = self.np_random.integers(0, 256, (84, 84, 1), dtype=np.uint8)
        return frame, 1.0, False, self.t >= 3, {}
