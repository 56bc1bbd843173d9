"""Recording Gymnasium vector envs: every sub-env's episodes, aligned, in both autoreset modes.

The reference plays 4 separate CartPole envs with the same seeds and the
actions each sub-env actually received (in `next_step` mode the action given
on a sub-env's autoreset step is ignored by the vector env, so the
reference resets instead of stepping there).
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

NUM_ENVS = 4
SEED = 7
STEPS = 120


class _StepCount(gym.Wrapper):
    """Adds `info["t"]` (the step index in the episode; 0 at reset)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.t = 0
        return obs, {**info, "t": 0}

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        self.t += 1
        return obs, r, te, tr, {**info, "t": self.t}


def make_env() -> gym.Env:
    return _StepCount(gym.make("CartPole-v1", max_episode_steps=20))


def reference(
    actions: np.ndarray, mode: AutoresetMode, num_envs: int = NUM_ENVS
) -> list[dict[str, Any]]:
    """Episodes of each sub-env played separately."""
    episodes = []
    for i in range(num_envs):
        env = make_env()
        obs, info = env.reset(seed=SEED + i)
        ep = {"obs": [obs], "actions": [], "rewards": [], "t": [info["t"]], "terminated": False}
        autoreset = False
        for step_actions in actions:
            if autoreset:  # next_step mode: the vector env resets instead of stepping
                obs, info = env.reset()
                ep = {"obs": [obs], "actions": [], "rewards": [], "t": [info["t"]]}
                ep["terminated"] = False
                autoreset = False
                continue
            a = int(step_actions[i])
            obs, r, te, tr, info = env.step(a)
            ep["obs"].append(obs)
            ep["actions"].append(a)
            ep["rewards"].append(r)
            ep["t"].append(info["t"])
            if te or tr:
                ep["terminated"] = te
                episodes.append(ep)
                if mode == AutoresetMode.NEXT_STEP:
                    autoreset = True
                else:
                    obs, info = env.reset()
                    ep = {"obs": [obs], "actions": [], "rewards": [], "t": [info["t"]]}
                    ep["terminated"] = False
        if not autoreset:
            episodes.append(ep)  # open at close: recorded cut short
    return episodes


def load(path: Any) -> list[dict[str, Any]]:
    builder = tfds.builder_from_directory(os.fspath(path))
    out = []
    for episode in tfds.as_numpy(builder.as_dataset(split="train")):
        out.append({"steps": [dict(s) for s in episode["steps"]]})
    return out


def key(obs0: np.ndarray) -> bytes:
    return np.asarray(obs0, np.float32).tobytes()


def _record(venv: Any, path: Any, actions: np.ndarray, info_keys: tuple = ("t",)) -> None:
    env = RecordRLDSVector(venv, path, info_keys=list(info_keys))
    env.reset(seed=SEED)
    for step_actions in actions:
        env.step(step_actions)
    env.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_records_each_sub_env_episode_aligned(tmp_path, mode):
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(STEPS, NUM_ENVS))
    want = reference(actions, mode)
    _record(SyncVectorEnv([make_env] * NUM_ENVS, autoreset_mode=mode), tmp_path / "ds", actions)
    _check(load(tmp_path / "ds"), want)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_env_without_step_metadata_records_each_sub_env_episode_aligned(tmp_path, mode):
    # Without step metadata each sub-env's steps go through its episode's bound
    # step adder, not the general path the test above takes.
    actions = np.random.default_rng(2).integers(0, 2, size=(STEPS, NUM_ENVS))
    want = reference(actions, mode)
    venv = SyncVectorEnv([make_env] * NUM_ENVS, autoreset_mode=mode)
    _record(venv, tmp_path / "ds", actions, info_keys=())
    _check(load(tmp_path / "ds"), want, step_metadata=False)


def test_async_vector_env_is_recorded_like_the_sync_one(tmp_path):
    from gymnasium.vector import AsyncVectorEnv

    mode = AutoresetMode.SAME_STEP
    actions = np.random.default_rng(1).integers(0, 2, size=(60, 2))
    want = reference(actions, mode, num_envs=2)
    _record(AsyncVectorEnv([make_env] * 2, autoreset_mode=mode), tmp_path / "ds", actions)
    _check(load(tmp_path / "ds"), want)


def _check(
    got: list[dict[str, Any]], want: list[dict[str, Any]], step_metadata: bool = True
) -> None:
    assert len(got) == len(want)
    # Several sub-envs finish episodes in one step; match episodes by their first observation.
    want_by_key = {key(w["obs"][0]): w for w in want}
    assert len(want_by_key) == len(want)
    for g in got:
        steps = g["steps"]
        w = want_by_key.pop(key(steps[0]["observation"]))
        n = len(w["obs"])
        assert len(steps) == n
        np.testing.assert_array_equal(np.stack([s["observation"] for s in steps]), w["obs"])
        assert [int(s["action"]) for s in steps[:-1]] == w["actions"]
        assert [float(s["reward"]) for s in steps[:-1]] == w["rewards"]
        # The autoreset step never leaks in: step metadata counts 0..T in every episode.
        assert w["t"] == list(range(n))
        if step_metadata:
            assert [int(s["t"]) for s in steps] == w["t"]
        else:
            assert "t" not in steps[0]
        assert steps[-1]["action"] == 0 and steps[-1]["reward"] == 0
        assert [bool(s["is_first"]) for s in steps] == [True] + [False] * (n - 1)
        assert [bool(s["is_last"]) for s in steps] == [False] * (n - 1) + [True]
        assert bool(steps[-1]["is_terminal"]) == w["terminated"]
    assert not want_by_key
    # Episodes ended in all three ways: termination, truncation (20 steps), cut short at close.
    assert any(w["terminated"] for w in want)
    assert any(len(w["obs"]) == 21 and not w["terminated"] for w in want)


@pytest.mark.parametrize("info_keys", [["t"], []], ids=["step-metadata", "no-metadata"])
def test_vector_env_disabled_autoreset_records_after_masked_reset(tmp_path, info_keys):
    venv = SyncVectorEnv([make_env] * 2, autoreset_mode=AutoresetMode.DISABLED)
    env = RecordRLDSVector(venv, tmp_path / "ds", info_keys=info_keys)
    env.reset(seed=0)
    lengths = [0, 0]
    finished = []
    for _ in range(60):
        _, _, te, tr, _ = env.step(np.array([0, 1]))
        lengths = [n + 1 for n in lengths]
        done = np.logical_or(te, tr)
        if done.any():
            finished += [lengths[i] for i in np.flatnonzero(done)]
            env.reset(options={"reset_mask": done})
            lengths = [0 if d else n for n, d in zip(lengths, done)]
    env.close()
    got = load(tmp_path / "ds")
    assert sorted(len(g["steps"]) for g in got) == sorted([n + 1 for n in finished + lengths])
    for g in got:
        steps = g["steps"]
        assert [bool(s["is_first"]) for s in steps] == [True] + [False] * (len(steps) - 1)
        if info_keys:
            assert [int(s["t"]) for s in steps] == list(range(len(steps)))


@pytest.mark.parametrize("info_keys", [["t"], []], ids=["step-metadata", "no-metadata"])
def test_step_returns_the_vector_envs_own_results(tmp_path, info_keys):
    # What the wrapper reads for recording (Python scalars) never replaces
    # what the caller gets: the vector env's own arrays and info.
    results = []

    class Spy(gym.vector.VectorWrapper):
        def step(self, actions):
            results.append(self.env.step(actions))
            return results[-1]

    env = RecordRLDSVector(Spy(SyncVectorEnv([make_env] * 2)), tmp_path / "ds", info_keys=info_keys)
    env.reset(seed=0)
    for _ in range(30):
        got = env.step(np.array([0, 1]))
        assert all(a is b for a, b in zip(got, results[-1]))
        assert all(isinstance(x, np.ndarray) for x in got[1:4])
    env.close()


def _record_batched_and_per_sub_env(tmp_path, make, mode, actions) -> None:
    """Records the same run a batch at a time and a sub-env at a time (`step_fn`, `episode_fn`)."""
    for name, options in (
        ("batch", {}),
        ("each", {"step_fn": lambda *args: None}),
        ("episode", {"episode_fn": lambda *args: None}),
    ):
        venv = SyncVectorEnv([make] * NUM_ENVS, autoreset_mode=mode)
        env = RecordRLDSVector(venv, tmp_path / name, **options)
        assert (env._batch is not None) == (name == "batch")
        env.reset(seed=SEED)
        for step_actions in actions:
            env.step(step_actions)
        env.close()


def _records(path) -> list[bytes]:
    from rlds_writer.store.formats.tfrecord import tfrecord

    out = []
    for shard in sorted(path.glob("*.tfrecord-*")):
        with open(shard, "rb") as f:
            out.extend(data for _, data in tfrecord.iter_records(f))
    return sorted(out)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_batch_recording_writes_the_records_of_the_per_sub_env_recording(tmp_path, mode):
    actions = np.random.default_rng(3).integers(0, 2, size=(STEPS, NUM_ENVS))
    _record_batched_and_per_sub_env(tmp_path, make_env, mode, actions)
    batched = _records(tmp_path / "batch")
    assert batched and batched == _records(tmp_path / "each") == _records(tmp_path / "episode")
    _check(load(tmp_path / "batch"), reference(actions, mode), step_metadata=False)


def test_batch_recording_casts_actions_as_the_per_sub_env_recording_does(tmp_path):
    def pendulum() -> gym.Env:
        return gym.make("Pendulum-v1", max_episode_steps=15)

    # float32 actions are the column's dtype; float64 ones are cast. Both
    # recordings store the same float32s.
    rng = np.random.default_rng(4)
    actions = [
        rng.uniform(-2, 2, (NUM_ENVS, 1)).astype(np.float32 if t % 3 else np.float64)
        for t in range(40)
    ]
    _record_batched_and_per_sub_env(tmp_path, pendulum, AutoresetMode.NEXT_STEP, actions)
    batched = _records(tmp_path / "batch")
    assert batched and batched == _records(tmp_path / "each")
    steps = load(tmp_path / "batch")[0]["steps"]
    assert steps[0]["action"].dtype == np.float32
    np.testing.assert_array_equal(steps[0]["action"], actions[0][0].astype(np.float32))


def test_vector_recording_lets_the_wrapper_go(tmp_path):
    import gc
    import weakref

    env = RecordRLDSVector(SyncVectorEnv([make_env] * 2), tmp_path / "ds")
    env.reset(seed=0)
    env.step(np.array([0, 1]))
    gone = weakref.ref(env)
    del env
    gc.collect()
    assert gone() is None  # and exit wrote the open episodes, cut short


class _Steps(gym.vector.VectorWrapper):
    """Counts the vector env's steps."""

    steps = 0

    def step(self, actions):
        self.steps += 1
        return self.env.step(actions)


@pytest.mark.parametrize("per_sub_env", [False, True])
def test_a_step_from_another_thread_is_refused_before_the_vector_env_steps(tmp_path, per_sub_env):
    import threading

    from rlds_writer.errors import RecorderThreadError

    venv = _Steps(SyncVectorEnv([make_env] * 2))
    options = {"step_fn": lambda *step: {}} if per_sub_env else {}
    env = RecordRLDSVector(venv, tmp_path / "ds", **options)
    env.reset(seed=SEED)
    env.step(np.array([0, 1]))
    raised = []

    def other_thread() -> None:
        try:
            env.step(np.array([1, 0]))
        except RecorderThreadError as e:
            raised.append(e)

    thread = threading.Thread(target=other_thread, name="intruder")
    thread.start()
    thread.join()
    assert len(raised) == 1 and "'intruder'" in str(raised[0])
    assert venv.steps == 1  # the env was not stepped
    env.step(np.array([1, 0]))  # the recording's own thread goes on
    env.close()
    assert env.recorder.steps_written == 2 * 3  # per sub-env: 2 steps and the last


def test_a_refused_directory_leaves_nothing_to_clean_up(tmp_path):
    """A constructor that refuses (a taken directory) leaves an object whose
    `close()` (gymnasium's `__del__`) is quiet, in the batch and per-env forms."""
    import gc
    import sys

    from rlds_writer.errors import DatasetExistsError

    first = RecordRLDSVector(gym.make_vec("CartPole-v1", 2), tmp_path / "ds")
    first.reset(seed=0)
    first.close()
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        for options in ({}, {"step_fn": lambda *a: {"x": 1}}):
            with pytest.raises(DatasetExistsError, match="mode='append'"):
                RecordRLDSVector(gym.make_vec("CartPole-v1", 2), tmp_path / "ds", **options)
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [repr(u.exc_value) for u in unraisable] == []
