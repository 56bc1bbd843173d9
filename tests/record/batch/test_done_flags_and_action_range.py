"""Done flags that are not bools, and discrete actions out of the space's range, refused by name."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv

from rlds_writer import RecordRLDSVector
from rlds_writer.errors import StepValueError
from rlds_writer.record.batch.rollout import RolloutRecorder

N, T = 3, 4


def _load(path) -> list[dict]:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(path))
    return list(tfds.as_numpy(builder.as_dataset(split="train")))


def _rollout(terminated, action=None):
    return dict(
        observation=np.ones((T, N, 2), np.float32),
        action=np.zeros((T, N), np.int64) if action is None else action,
        reward=np.ones((T, N), np.float32),
        terminated=terminated,
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(terminated=np.full((T, N), 0.5)), r"^terminated: .*got 0\.5 in a float64 batch"),
        (dict(terminated=np.full((T, N), np.nan)), r"^terminated: .*got nan"),
        (dict(truncated=np.full((T, N), 2)), r"^truncated: .*exactly 0 or 1.*got 2 in a int64"),
        (dict(truncated=np.full((T, N), -1.0)), r"^truncated: .*got -1\.0"),
    ],
    ids=["half", "nan", "two", "minus-one"],
)
def test_done_flags_other_than_bools_or_0_and_1_are_refused_by_name(tmp_path, flags, message):
    # They were cast to True: episodes ended (as terminated) that the env never ended.
    rec = RolloutRecorder(tmp_path / "ds", autoreset="next_step")
    rec.write(first_observation=np.zeros((N, 2), np.float32), **_rollout(np.zeros((T, N), bool)))
    kwargs = _rollout(flags.get("terminated", np.zeros((T, N), bool)))
    with pytest.raises(StepValueError, match=message):
        rec.write(**kwargs, truncated=flags.get("truncated"))
    # Exactly 0/1 as ints or floats are flags, recorded as the bools they are.
    term = np.zeros((T, N), np.float32)
    term[1, 0] = 1.0
    rec.write(**_rollout(term), truncated=np.zeros((T, N), np.int8))
    rec.close()
    got = _load(tmp_path / "ds")
    # Sub-env 0 terminated at its 6th step; nothing else ended (3 more cut short at close).
    assert sorted((len(e["steps"]), e["end_reason"]) for e in got) == [
        (2, b"cut_short"),
        (7, b"terminated"),
        (9, b"cut_short"),
        (9, b"cut_short"),
    ]


class _FloatFlags(gym.vector.VectorEnv):
    """A vector env (as a torch simulator's) whose done flags come as floats."""

    def __init__(self, flag: float):
        self.num_envs = N
        self.single_observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(3, start=-1)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, N)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, N)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.flag, self.steps = flag, 0

    def reset(self, *, seed=None, options=None):
        return np.zeros((N, 2), np.float32), {}

    def step(self, actions):
        self.steps += 1
        flags = np.full(N, self.flag, np.float32)
        return np.zeros((N, 2), np.float32), np.ones(N), flags, np.zeros(N, np.float32), {}


def test_a_vector_envs_float_done_flags_and_out_of_range_actions_are_refused(tmp_path):
    env = RecordRLDSVector(_FloatFlags(0.5), tmp_path / "ds")
    env.reset(seed=0)
    with pytest.raises(StepValueError, match=r"^terminated: .*got 0\.5"):
        env.step(np.zeros(N, np.int64))
    # Discrete(3, start=-1) takes -1..1: 2 is refused before the env steps.
    steps = env.unwrapped.steps
    with pytest.raises(
        StepValueError, match=r"^steps/action: expected actions in -1\.\.1 .* got 2"
    ):
        env.step(np.array([0, 2, -1]))
    assert env.unwrapped.steps == steps
    env.unwrapped.flag = 1.0  # exactly 1: every sub-env terminates
    env.step([1, -1, 0])  # a list, as Gymnasium's own envs take
    env.close()
    got = _load(tmp_path / "ds")
    assert len(got) == N
    assert all(e["end_reason"] == b"terminated" for e in got)


class _Unchecked(gym.Env):
    """A Discrete(2) env that steps with any action (as many custom and EnvPool envs do)."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.full(2, float(action) / 10, np.float32), 1.0, False, False, {}


def test_discrete_actions_out_of_range_are_refused_by_every_batched_recorder(tmp_path):
    # They were recorded as given: a dataset of Discrete(2) holding 5.
    env = RecordRLDSVector(SyncVectorEnv([_Unchecked] * N), tmp_path / "vec")
    env.reset(seed=0)
    env.step(np.array([0, 1, 1]))
    with pytest.raises(
        StepValueError, match=r"^steps/action: expected actions in 0\.\.1 .*got 5 at \[1\]"
    ):
        env.step(np.array([0, 5, 1]))
    env.step(np.array([1, 0, 1]))  # the run goes on
    env.close()
    got = sorted([int(s["action"]) for s in e["steps"]] for e in _load(tmp_path / "vec"))
    assert got == [[0, 1, 0], [1, 0, 0], [1, 1, 0]]  # the last: the final step's zero

    rec = RolloutRecorder(
        tmp_path / "roll", action_space=gym.spaces.Discrete(2), autoreset="next_step"
    )
    first = np.zeros((N, 2), np.float32)
    action = np.eye(T, N, dtype=np.int64)
    action[2, 0] = -4
    with pytest.raises(
        StepValueError, match=r"^steps/action: expected actions in 0\.\.1 .*got -4 at \[2, 0\]"
    ):
        rec.write(first_observation=first, **_rollout(np.zeros((T, N), bool), action))
    rec.write(first_observation=first, **_rollout(np.zeros((T, N), bool)))
    rec.close()
    assert len(_load(tmp_path / "roll")) == N

    space = gym.spaces.MultiDiscrete([2, 4], start=[0, 1])
    rec = RolloutRecorder(tmp_path / "multi", action_space=space, autoreset="next_step")
    action = np.ones((T, N, 2), np.int64)
    action[3, 2, 1] = 5  # 1..4 for the second component
    with pytest.raises(
        StepValueError,
        match=r"^steps/action: expected actions in \[0, 1\]\.\.\[1, 4\] per component "
        r".*got 5 at \[3, 2, 1\]",
    ):
        rec.write(first_observation=first, **_rollout(np.zeros((T, N), bool), action))
    rec.close()
