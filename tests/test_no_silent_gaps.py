"""A refused value never leaves a hole in an episode, and is refused at the step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import load_episodes

import rlds_writer


def _catch_config(**kwargs):
    return rlds_writer.DatasetConfig(
        name="catch",
        observation_info=tfds.features.Tensor(shape=(10, 5), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        **kwargs,
    )


def test_dm_env_a_caught_bad_step_ends_the_episode_instead_of_leaving_a_hole(tmp_path):
    calls = []

    def step_fn(timestep, action, env):
        calls.append(action)
        return {"n": "three" if len(calls) == 4 else len(calls)}  # step 3 is refused

    backend = rlds_writer.TFDSBackendWriter(
        tmp_path, _catch_config(step_metadata_info={"n": np.int64})
    )
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), backend, step_fn=step_fn)
    env.reset()
    env.step(1)
    env.step(1)
    with pytest.raises(rlds_writer.errors.StepValueError, match="steps/n.*cut short"):
        env.step(1)  # refused after the env has stepped
    ts = env.step(1)  # the user carries on: nothing is recorded until reset
    while not ts.last():
        ts = env.step(1)
    ts = env.reset()
    while not ts.last():
        ts = env.step(0)
    env.close()
    first, second = load_episodes(tmp_path)
    # o0, o1, o2 with a0, a1, then the final step: no transition is missing.
    assert [int(s["n"]) for s in first["steps"]] == [1, 2, 3]
    assert [int(s["action"]) for s in first["steps"]] == [1, 1, 0]
    assert [bool(s["is_last"]) for s in first["steps"]] == [False, False, True]
    assert not bool(first["steps"][-1]["is_terminal"])
    assert len(second["steps"]) == 10 and bool(second["steps"][-1]["is_terminal"])


def test_gymnasium_a_caught_bad_step_ends_the_episode_instead_of_leaving_a_hole(tmp_path):
    def step_fn(obs, action, reward, terminated, truncated, info):
        return {"t": info.get("t", 0)}

    class Counting(gym.Wrapper):
        def reset(self, **kwargs):
            self.t = 0
            obs, info = self.env.reset(**kwargs)
            return obs, {"t": 0}

        def step(self, action):
            self.t += 1
            obs, r, term, trunc, info = self.env.step(action)
            # Step 3 reports a value the dataset cannot store.
            return obs, r, term, trunc, {"t": 2**70 if self.t == 3 else self.t}

    env = rlds_writer.RecordRLDS(
        Counting(gym.make("CartPole-v1")),
        tmp_path,
        step_fn=step_fn,
        step_metadata_info={"t": np.int64},
    )
    env.reset(seed=0)
    env.step(0)
    env.reset(seed=1)  # the first episode ends: the dataset's features are known
    env.step(0)
    env.step(0)
    with pytest.raises(rlds_writer.errors.StepValueError, match="out of range.*cut short"):
        env.step(0)
    env.step(0)
    env.step(0)
    env.reset(seed=2)
    env.step(1)
    env.close()
    _, second, third = load_episodes(tmp_path)
    assert [int(s["t"]) for s in second["steps"]] == [0, 1, 2]
    assert [int(s["t"]) for s in third["steps"]] == [0, 1]


def test_a_lone_surrogate_is_refused_at_the_step_and_later_episodes_still_record(tmp_path):
    config = _catch_config(step_metadata_info={"note": tfds.features.Text()})
    backend = rlds_writer.TFDSBackendWriter(tmp_path, config)
    obs = np.zeros((10, 5), np.float32)
    backend.begin_episode(obs, {"note": "start"})
    with pytest.raises(rlds_writer.errors.StepValueError, match="steps/note.*UTF-8"):
        backend.add_step(0, 0.0, 1.0, obs, {"note": "bad \ud800 text"})
    backend.add_step(0, 0.0, 1.0, obs, {"note": "fine"})
    backend.end_episode(terminated=True)
    for _ in range(3):  # the writer thread is alive: later episodes are written
        backend.begin_episode(obs, {"note": "é"})
        backend.end_episode(terminated=False)
    backend.close()
    episodes = load_episodes(tmp_path)
    assert len(episodes) == 4
    assert [s["note"] for s in episodes[0]["steps"]] == [b"start", b"fine"]
    assert episodes[1]["steps"][0]["note"] == "é".encode()


def test_an_integer_out_of_int64_range_is_refused_at_the_step_not_at_episode_end(tmp_path):
    backend = rlds_writer.TFDSBackendWriter(tmp_path, _catch_config())
    obs = np.zeros((10, 5), np.float32)
    backend.begin_episode(obs)
    backend.add_step(1, 0.0, 1.0, obs)
    with pytest.raises(rlds_writer.errors.StepValueError, match="steps/action.*out of range"):
        backend.add_step(2**70, 0.0, 1.0, obs)
    backend.add_step(2, 0.0, 1.0, obs)
    backend.end_episode(terminated=True)  # the episode is not dropped
    backend.close()
    (episode,) = load_episodes(tmp_path)
    assert [int(s["action"]) for s in episode["steps"]] == [1, 2, 0]
