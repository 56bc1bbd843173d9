"""The RLDS step semantics of DESIGN.md, recorded through `EnvLogger` and loaded with TFDS.

A small deterministic dm_env env makes every expected value exact: in episode
`k`, the observation of step `t` is `[k, t]`, and the transition out of step
`t` gives reward `10k + t + 0.5`.
"""

from __future__ import annotations

import logging

import dm_env
import numpy as np
import pytest
from dm_env import specs
from helpers_core import assert_same, load_episodes

import rlds_writer
from rlds_writer.errors import WriterClosedError

F32 = np.float32


class CountingEnv(dm_env.Environment):
    """Deterministic env whose values encode (episode, step).

    Args:
      length: transitions per episode before it ends.
      end: `termination` (last discount 0) or `truncation` (last discount 1).
      action_spec: the action spec (any; actions are not used by the dynamics).
    """

    def __init__(self, length: int = 3, end: str = "termination", action_spec=None):
        self.length = length
        self.end = end
        self._action_spec = action_spec or specs.DiscreteArray(3, dtype=np.int64)
        self.episode = -1
        self.t = 0
        self._reset_next = True

    def _obs(self) -> np.ndarray:
        return np.array([self.episode, self.t], dtype=F32)

    def reset(self) -> dm_env.TimeStep:
        self.episode += 1
        self.t = 0
        self._reset_next = False
        return dm_env.restart(self._obs())

    def step(self, action) -> dm_env.TimeStep:
        if self._reset_next:
            return self.reset()
        reward = F32(10 * self.episode + self.t + 0.5)
        self.t += 1
        if self.t < self.length:
            return dm_env.transition(reward, self._obs(), discount=F32(1.0))
        self._reset_next = True
        if self.end == "termination":
            return dm_env.termination(reward, self._obs())
        return dm_env.truncation(reward, self._obs(), discount=F32(1.0))

    def observation_spec(self):
        return specs.Array((2,), F32)

    def action_spec(self):
        return self._action_spec

    def reward_spec(self):
        return specs.Array((), F32)

    def discount_spec(self):
        return specs.BoundedArray((), F32, 0.0, 1.0)


def _config(action_info=np.int64, step_metadata_info=None, episode_metadata_info=None):
    import tensorflow_datasets as tfds

    return rlds_writer.DatasetConfig(
        name="counting",
        observation_info=tfds.features.Tensor(shape=(2,), dtype=F32),
        action_info=action_info,
        reward_info=F32,
        discount_info=F32,
        step_metadata_info=step_metadata_info or {},
        episode_metadata_info=episode_metadata_info or {},
    )


def _logger(path, env, config=None, **kwargs):
    backend = rlds_writer.TFDSBackendWriter(path, config or _config(), max_episodes_per_file=10)
    return rlds_writer.EnvLogger(env, backend, **kwargs)


def _column(episode, key):
    return np.array([step[key] for step in episode["steps"]])


def _flags(episode):
    return [
        (bool(s["is_first"]), bool(s["is_last"]), bool(s["is_terminal"])) for s in episode["steps"]
    ]


def _obs(k, ts):
    return np.array([[k, t] for t in ts], dtype=F32)


def test_step_t_holds_observation_action_then_following_reward_and_discount(tmp_path):
    env = CountingEnv(length=3, end="termination")
    actions = [2, 0, 1]
    with _logger(tmp_path, env) as logged:
        logged.reset()
        for a in actions:
            logged.step(np.int64(a))
    (episode,) = load_episodes(tmp_path)
    assert_same(_column(episode, "observation"), _obs(0, range(4)))
    # a_t taken after o_t; the final step's action is the spec's zero.
    assert_same(_column(episode, "action"), np.array([2, 0, 1, 0], dtype=np.int64))
    # r_t and d_t are those of the timestep a_t produced; final step zeros.
    assert_same(_column(episode, "reward"), np.array([0.5, 1.5, 2.5, 0.0], dtype=F32))
    assert_same(_column(episode, "discount"), np.array([1, 1, 0, 0], dtype=F32))
    assert _flags(episode) == [
        (True, False, False),
        (False, False, False),
        (False, False, False),
        (False, True, True),
    ]


def test_truncation_keeps_discount_one_and_is_not_terminal(tmp_path):
    env = CountingEnv(length=2, end="truncation")
    with _logger(tmp_path, env) as logged:
        timestep = logged.reset()
        while not timestep.last():
            timestep = logged.step(1)
    (episode,) = load_episodes(tmp_path)
    assert_same(_column(episode, "discount"), np.array([1, 1, 0], dtype=F32))
    assert_same(_column(episode, "reward"), np.array([0.5, 1.5, 0.0], dtype=F32))
    assert _flags(episode) == [(True, False, False), (False, False, False), (False, True, False)]


def test_termination_and_truncation_episodes_side_by_side(tmp_path):
    config = _config()
    backend = rlds_writer.TFDSBackendWriter(tmp_path, config)
    for end in ("termination", "truncation", "termination"):
        env = CountingEnv(length=1, end=end)
        logged = rlds_writer.EnvLogger(env, backend)
        logged.reset()
        logged.step(0)
    backend.close()
    episodes = load_episodes(tmp_path)
    assert [e["steps"][-1]["is_terminal"] for e in episodes] == [True, False, True]
    assert [e["steps"][0]["discount"] for e in episodes] == [0.0, 1.0, 0.0]


def test_final_step_text_action_is_empty_string_not_previous_action(tmp_path):
    import tensorflow_datasets as tfds

    env = CountingEnv(length=2, action_spec=specs.StringArray(()))
    with _logger(tmp_path, env, _config(action_info=tfds.features.Text())) as logged:
        logged.reset()
        logged.step("left")
        logged.step("ríght")
    (episode,) = load_episodes(tmp_path)
    assert [s["action"] for s in episode["steps"]] == [b"left", "ríght".encode(), b""]


def test_final_step_dict_action_is_zeros_built_from_the_spec(tmp_path):
    import tensorflow_datasets as tfds

    action_info = {
        "move": tfds.features.Tensor(shape=(2,), dtype=np.int32),
        "say": tfds.features.Text(),
        "gain": {"value": np.float64, "flags": tfds.features.Tensor(shape=(3,), dtype=np.bool_)},
    }
    env = CountingEnv(length=1)
    action = {
        "move": np.array([7, -7], dtype=np.int32),
        "say": "hi",
        "gain": {"value": 0.25, "flags": [True, False, True]},
    }
    with _logger(tmp_path, env, _config(action_info=action_info)) as logged:
        logged.reset()
        logged.step(action)
    (episode,) = load_episodes(tmp_path)
    first, last = (s["action"] for s in episode["steps"])
    assert_same(
        first,
        {
            "move": np.array([7, -7], dtype=np.int32),
            "say": b"hi",
            "gain": {"value": np.float64(0.25), "flags": np.array([True, False, True])},
        },
    )
    assert_same(
        last,
        {
            "move": np.zeros(2, dtype=np.int32),
            "say": b"",
            "gain": {"value": np.float64(0.0), "flags": np.zeros(3, dtype=bool)},
        },
    )


@pytest.mark.parametrize("how", ["reset", "close"])
def test_one_step_episode_ended_by_reset_or_close(tmp_path, how):
    env = CountingEnv(length=5)
    logged = _logger(tmp_path, env)
    logged.reset()
    if how == "reset":
        logged.reset()
        logged.step(1)
    logged.close()
    episodes = load_episodes(tmp_path)
    assert len(episodes) == (2 if how == "reset" else 1)
    first = episodes[0]
    assert len(first["steps"]) == 1
    assert_same(first["steps"][0]["observation"], np.array([0, 0], dtype=F32))
    assert _flags(first) == [(True, True, False)]
    assert first["steps"][0]["action"] == 0
    assert first["steps"][0]["reward"] == 0.0
    assert first["steps"][0]["discount"] == 0.0
    if how == "reset":
        # The episode cut by close() after one transition.
        assert_same(_column(episodes[1], "observation"), _obs(1, range(2)))
        assert _flags(episodes[1]) == [(True, False, False), (False, True, False)]


@pytest.mark.parametrize("how", ["reset", "close"])
def test_episode_cut_mid_way_ends_last_not_terminal_with_zero_action(tmp_path, how):
    env = CountingEnv(length=10)
    logged = _logger(tmp_path, env)
    logged.reset()
    logged.step(2)
    logged.step(2)
    if how == "reset":
        logged.reset()
        logged.step(1)
        logged.step(1)
        logged.step(1)
    logged.close()
    episodes = load_episodes(tmp_path)
    assert len(episodes) == (2 if how == "reset" else 1)
    cut = episodes[0]
    assert_same(_column(cut, "observation"), _obs(0, range(3)))
    assert_same(_column(cut, "action"), np.array([2, 2, 0], dtype=np.int64))
    assert_same(_column(cut, "reward"), np.array([0.5, 1.5, 0.0], dtype=F32))
    assert_same(_column(cut, "discount"), np.array([1, 1, 0], dtype=F32))
    assert _flags(cut) == [(True, False, False), (False, False, False), (False, True, False)]


def test_step_after_last_timestep_restarts_like_dm_env(tmp_path):
    env = CountingEnv(length=2)
    with _logger(tmp_path, env) as logged:
        timestep = logged.reset()
        kinds = []
        for a in [1, 2, 0, 2, 1, 0]:  # the 3rd action only triggers the restart
            timestep = logged.step(a)
            kinds.append(timestep.step_type)
        assert kinds[2] == kinds[5] == dm_env.StepType.FIRST
    episodes = load_episodes(tmp_path)
    # Two full episodes, then the third restart leaves a one-step episode cut by close().
    assert len(episodes) == 3
    assert_same(_column(episodes[0], "observation"), _obs(0, range(3)))
    assert_same(_column(episodes[0], "action"), np.array([1, 2, 0], dtype=np.int64))
    assert_same(_column(episodes[1], "observation"), _obs(1, range(3)))
    # The action passed to the restarting step() is recorded nowhere.
    assert_same(_column(episodes[1], "action"), np.array([2, 1, 0], dtype=np.int64))
    assert_same(_column(episodes[1], "reward"), np.array([10.5, 11.5, 0], dtype=F32))
    assert [_flags(e)[-1] for e in episodes[:2]] == [(False, True, True)] * 2
    assert_same(_column(episodes[2], "observation"), _obs(2, range(1)))
    assert _flags(episodes[2]) == [(True, True, False)]


def test_step_fn_runs_at_reset_with_no_action_and_belongs_to_that_step(tmp_path):
    calls = []

    def step_fn(timestep, action, env):
        calls.append((int(timestep.step_type), action))
        t = int(timestep.observation[1])
        return {"t": t, "prev_action": -1 if action is None else int(action)}

    env = CountingEnv(length=3)
    config = _config(step_metadata_info={"t": np.int32, "prev_action": np.int64})
    with _logger(tmp_path, env, config, step_fn=step_fn) as logged:
        logged.reset()
        for a in [2, 1, 0]:
            logged.step(a)
    assert calls == [(0, None), (1, 2), (1, 1), (2, 0)]
    (episode,) = load_episodes(tmp_path)
    assert_same(_column(episode, "t"), np.array([0, 1, 2, 3], dtype=np.int32))
    # Metadata of o_t's timestep: it saw the action that led to o_t.
    assert_same(_column(episode, "prev_action"), np.array([-1, 2, 1, 0], dtype=np.int64))


def test_episode_fn_called_every_step_and_last_non_none_value_is_stored(tmp_path):
    calls = []

    def episode_fn(timestep, action, env):
        calls.append(action)
        t = int(timestep.observation[1])
        # Values only at t=0 and t=2; None afterwards must not erase them.
        return {"seen_t": t, "label": f"t{t}"} if t in (0, 2) else None

    env = CountingEnv(length=4)
    config = _config(episode_metadata_info={"seen_t": np.int64, "label": _text()})
    with _logger(tmp_path, env, config, episode_fn=episode_fn) as logged:
        for _ in range(2):
            logged.reset()
            for a in [1, 1, 1, 1]:
                logged.step(a)
    assert calls == [None, 1, 1, 1, 1] * 2
    episodes = load_episodes(tmp_path)
    assert [e["seen_t"] for e in episodes] == [2, 2]
    assert [e["label"] for e in episodes] == [b"t2", b"t2"]


def _text():
    import tensorflow_datasets as tfds

    return tfds.features.Text()


@pytest.mark.parametrize("bad", [[1, 2], 3.0, "t=1", (("t", 1),), None])
def test_step_fn_returning_a_non_dict_is_an_error(tmp_path, bad):
    def step_fn(timestep, action, env):
        return {"t": 0} if timestep.first() else bad

    env = CountingEnv(length=3)
    logged = _logger(tmp_path, env, _config(step_metadata_info={"t": np.int32}), step_fn=step_fn)
    logged.reset()
    with pytest.raises(rlds_writer.errors.StepValueError, match="step metadata.*dict"):
        logged.step(1)
    logged.close()


def test_missing_episode_metadata_stores_zeros_and_warns_once(tmp_path, caplog):
    config = _config(episode_metadata_info={"seed": np.int64, "name": _text(), "score": np.float32})
    env = CountingEnv(length=1)
    with caplog.at_level(logging.WARNING, logger="rlds_writer"):
        with _logger(tmp_path, env, config) as logged:
            for _ in range(3):
                logged.reset()
                logged.step(0)
    warnings = [r for r in caplog.records if "episode metadata" in r.getMessage()]
    assert len(warnings) == 1
    assert "seed" in warnings[0].getMessage()
    episodes = load_episodes(tmp_path)
    assert len(episodes) == 3
    for episode in episodes:
        assert_same(episode["seed"], np.int64(0))
        assert episode["name"] == b""
        assert_same(episode["score"], np.float32(0))


def test_env_logger_is_a_dm_env_wrapper_that_forwards_the_rest(tmp_path):
    env = CountingEnv(length=2)
    with _logger(tmp_path, env) as logged:
        assert isinstance(logged, dm_env.Environment)
        assert logged.length == 2 and logged.end == "termination"  # plain attributes
        assert logged.observation_spec() == env.observation_spec()
        assert logged.action_spec() == env.action_spec()
        assert logged.discount_spec() == env.discount_spec()
        timestep = logged.reset()
        assert_same(timestep.observation, np.array([0, 0], dtype=F32))
        assert env.episode == 0  # the wrapped env really stepped


def test_embedded_catch_env_records_terminated_and_truncated_episodes(tmp_path):
    from rlds_writer.envs.catch import Catch

    env = Catch(rows=5, columns=3, seed=1, max_steps=2)  # truncated after 2 steps
    long_env = Catch(rows=5, columns=3, seed=1)  # terminates after rows - 1 = 4 steps
    backend = rlds_writer.TFDSBackendWriter(tmp_path, rlds_writer.config_from_env(env, "catch"))
    for e in (env, long_env):
        logged = rlds_writer.EnvLogger(e, backend)
        timestep = logged.reset()
        while not timestep.last():
            timestep = logged.step(1)
    backend.close()
    truncated, terminated = load_episodes(tmp_path)
    assert len(truncated["steps"]) == 3 and len(terminated["steps"]) == 5
    assert _flags(truncated)[-1] == (False, True, False)
    assert _flags(terminated)[-1] == (False, True, True)
    assert_same(_column(truncated, "discount"), np.array([1.0, 1.0, 0.0], np.float32))
    # The same seed drops the ball in the same column; the final reward is +-1.
    assert_same(truncated["steps"][0]["observation"], terminated["steps"][0]["observation"])
    assert _column(terminated, "reward")[3] in (1.0, -1.0)
    assert _column(terminated, "observation").shape == (5, 5, 3)


class _BadObservationAt(CountingEnv):
    """A CountingEnv whose observation at one (episode, t) has the wrong shape."""

    def __init__(self, episode: int, t: int, **kwargs):
        super().__init__(**kwargs)
        self.bad = (episode, t)

    def _obs(self) -> np.ndarray:
        if (self.episode, self.t) == self.bad:
            return np.zeros(3, dtype=F32)
        return super()._obs()


def test_a_bad_value_mid_episode_ends_it_without_user_functions_too(tmp_path):
    """A logger without step_fn/episode_fn steps through a per-episode closure;
    it must cut the episode short at a refused value and stop recording it."""
    env = _BadObservationAt(episode=0, t=2, length=4)
    with _logger(tmp_path, env) as logged:
        logged.reset()
        logged.step(1)
        with pytest.raises(rlds_writer.errors.StepValueError, match="steps/observation.*cut short"):
            logged.step(2)
        timestep = logged.step(0)  # the env carries on: nothing recorded until reset
        assert not timestep.last()
        logged.step(1)  # the last step of episode 0: still nothing recorded
        for a in (9, 1, 1, 1, 2):  # a restart (its action is not recorded), then episode 1
            logged.step(a)
    first, second = load_episodes(tmp_path)
    assert_same(_column(first, "observation"), _obs(0, range(2)))
    assert_same(_column(first, "action"), np.array([1, 0], dtype=np.int64))
    assert _flags(first)[-1] == (False, True, False)  # cut short: not terminal
    assert_same(_column(second, "observation"), _obs(1, range(5)))
    assert_same(_column(second, "action"), np.array([1, 1, 1, 2, 0], dtype=np.int64))
    assert _flags(second)[-1] == (False, True, True)


def test_a_subclass_that_overrides_step_is_called_at_every_step(tmp_path):
    calls = []

    class CountingLogger(rlds_writer.EnvLogger):
        def step(self, action):
            calls.append(action)
            return super().step(action)

    backend = rlds_writer.TFDSBackendWriter(tmp_path, _config(), max_episodes_per_file=10)
    with CountingLogger(CountingEnv(length=3), backend) as logged:
        logged.reset()
        for a in (1, 2, 0):
            logged.step(a)
    assert calls == [1, 2, 0]
    (episode,) = load_episodes(tmp_path)
    assert_same(_column(episode, "action"), np.array([1, 2, 0, 0], dtype=np.int64))


def test_closing_mid_episode_ends_the_fast_step_path(tmp_path):
    env = CountingEnv(length=10)
    logged = _logger(tmp_path, env)
    logged.reset()
    logged.step(1)
    logged.close()
    with pytest.raises(WriterClosedError, match="closed"):
        logged.step(1)
    (episode,) = load_episodes(tmp_path)
    assert len(episode["steps"]) == 2
