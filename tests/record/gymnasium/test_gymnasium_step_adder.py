"""`RecordRLDS.step` adds through an adder bound once per episode: never to a finished one.

The adder writes into the open episode's buffer, which the recorder reuses for
the next episode once one ends; a step after the end (a refused value, the
env's own end, `close`) must take the general path, which records nothing
into another episode and refuses a step outside any.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import rlds_writer
from rlds_writer import RecordRLDS
from rlds_writer.errors import StepValueError


class _CountingEnv(gym.Env):
    """Observation `[t, episode]`; a wrong-shaped one at step `bad_step` of episode 0."""

    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, steps: int = 6, bad_step: int | None = None):
        self.steps, self.bad_step = steps, bad_step

    def _obs(self):
        if self.episode == 0 and self.t == self.bad_step:
            return np.zeros(3, np.float32)
        return np.array([self.t, self.episode], np.float32)

    def reset(self, *, seed=None, options=None):
        self.episode = seed or 0
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), False, self.t >= self.steps, {}


def _observations(path):
    return [e["steps"]["observation"] for e in rlds_writer.open_dataset(path).episodes()]


def test_steps_after_a_refused_value_record_nothing_and_the_next_episode_is_whole(tmp_path):
    env = RecordRLDS(_CountingEnv(bad_step=3), tmp_path / "ds")
    env.reset(seed=0)
    env.step(0)
    env.step(0)
    with pytest.raises(StepValueError, match="observation"):
        env.step(0)
    for _ in range(3):  # the env goes on to its end: none of these is recorded
        env.step(0)
    with pytest.raises(RuntimeError, match="outside an episode"):
        env.step(0)
    env.reset(seed=1)
    done = False
    while not done:
        _, _, term, trunc, _ = env.step(0)
        done = term or trunc
    env.close()
    first, second = _observations(tmp_path / "ds")
    np.testing.assert_array_equal(first, [[0, 0], [1, 0], [2, 0]])
    np.testing.assert_array_equal(second, [[t, 1] for t in range(7)])


def test_a_step_after_the_episode_ended_or_the_wrapper_closed_is_refused(tmp_path):
    env = RecordRLDS(_CountingEnv(steps=2), tmp_path / "ds")
    env.reset(seed=0)
    env.step(0)
    env.step(0)  # truncated: the episode is written
    with pytest.raises(RuntimeError, match="outside an episode"):
        env.step(0)
    env.reset(seed=1)
    env.step(0)
    env.close()  # the open episode is written cut short
    with pytest.raises(Exception, match="closed|outside an episode"):
        env.step(0)
    first, second = _observations(tmp_path / "ds")
    np.testing.assert_array_equal(first, [[0, 0], [1, 0], [2, 0]])
    np.testing.assert_array_equal(second, [[0, 1], [1, 1]])


def test_a_recording_with_step_metadata_still_records_it_per_step(tmp_path):
    env = RecordRLDS(
        _CountingEnv(steps=3),
        tmp_path / "ds",
        step_fn=lambda obs, action, reward, term, trunc, info: {"t2": np.int64(2 * obs[0])},
    )
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    env.close()
    (episode,) = rlds_writer.open_dataset(tmp_path / "ds").episodes()
    np.testing.assert_array_equal(episode["steps"]["t2"], [0, 2, 4, 6])
