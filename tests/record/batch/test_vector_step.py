"""A vector step in one C call (`_vector_step.c`) records the bytes of the numpy path.

The C step takes the usual steps; a step it does not take (here: an ndarray
subclass, a refused batch) goes the general way, in the same run. Each run is
compared with the same run with the extension hidden (every step through
numpy), which tests/record/batch/test_batch_vector_identity.py compares with
`RecordRLDS` sub-env by sub-env.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from batch_envs import Hops, records
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.errors import StepValueError
from rlds_writer.record.batch import core, vector_step
from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N, STEPS, MARKED, BAD = 5, 120, 7, 40


class _Marked(np.ndarray):
    """An ndarray subclass: the C step leaves it to the general path."""


class _SomeStepsAside(gym.vector.VectorWrapper):
    """Every `MARKED`th step's observations as `_Marked`; step `BAD`'s of the wrong shape."""

    def __init__(self, env):
        super().__init__(env)
        self.t = 0
        self.bad_finals = None  # the same-step step whose final observations are refused

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        self.t += 1
        if self.t == BAD:
            obs = np.zeros((len(obs), 9), np.float32)
        elif self.t % MARKED == 0:
            obs = obs.view(_Marked)
        elif "final_obs" in infos and self.t > BAD and self.bad_finals is None:
            if (terminations | truncations).any():  # refused after the rows are written
                self.bad_finals = self.t
                finals = np.empty(len(obs), object)
                finals[:] = [np.zeros(9, np.float32) for _ in range(len(obs))]
                infos = {**infos, "final_obs": finals}
        return obs, rewards, terminations, truncations, infos


def _record(path, mode, cartpole: bool, **options) -> int | None:
    if cartpole:  # native vector CartPole: Fortran-ordered observations, int64 actions
        venv = gym.make_vec("CartPole-v1", N, vectorization_mode="vector_entry_point")
        actions = np.random.default_rng(0).integers(0, 2, (STEPS, N))
    else:  # float64 rewards and info values cast into float32 and int64 columns
        venv = SyncVectorEnv([Hops] * N, autoreset_mode=mode)
        actions = np.random.default_rng(0).uniform(-1, 1, (STEPS, N, 2)).astype(np.float32)
    aside = _SomeStepsAside(venv)
    env = RecordRLDSVector(aside, path, **options)
    env.reset(seed=3)
    for t, step_actions in enumerate(actions, 1):
        if t == BAD:
            with pytest.raises(StepValueError, match="steps/observation: expected a batch"):
                env.step(step_actions)
            continue
        try:
            _, _, te, tr, _ = env.step(step_actions)
        except StepValueError as e:  # a refused final observation: the episodes stay open
            assert t == aside.bad_finals and "steps/observation" in str(e)
            continue
        if mode == AutoresetMode.DISABLED and (te | tr).any():
            env.reset(options={"reset_mask": te | tr})
    env.close()
    return aside.bad_finals


@pytest.mark.parametrize(
    ("mode", "cartpole"),
    [(AutoresetMode.NEXT_STEP, True), *((m, False) for m in AutoresetMode)],
    ids=["cartpole-next-step", "next-step", "same-step", "disabled"],
)
def test_the_c_step_records_the_bytes_of_the_numpy_path(tmp_path, monkeypatch, mode, cartpole):
    if vector_step.native is None:
        pytest.skip("the _vector_step extension is not built here")
    adds = []
    add = core.BatchRecorder.add
    monkeypatch.setattr(core.BatchRecorder, "add", lambda *a, **k: adds.append(1) or add(*a, **k))
    # Hops' 80-step episodes spill out of this small ring while they run
    # (their ends then go `apart`); info keys and a discount column.
    options = {} if cartpole else {"ring_bytes": 4096, "info_keys": ["t", "x"], "discount": True}
    bad_finals = _record(tmp_path / "c", mode, cartpole, **options)
    assert (bad_finals is not None) == (mode == AutoresetMode.SAME_STEP)
    # The general path only where the C step cannot go: marked and refused steps.
    assert len(adds) == STEPS // MARKED + 1
    adds.clear()
    monkeypatch.setattr(vector_step, "native", None)
    _record(tmp_path / "numpy", mode, cartpole, **options)
    assert len(adds) == STEPS
    want = records(tmp_path / "numpy")
    assert sum(want.values()) >= 20
    assert records(tmp_path / "c") == want


@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
def test_rollouts_take_the_c_step_with_the_bytes_of_the_numpy_path(
    tmp_path, monkeypatch, autoreset
):
    if vector_step.native is None:
        pytest.skip("the _vector_step extension is not built here")
    from rlds_writer.record.batch.rollout import RolloutRecorder

    rng = np.random.default_rng(1)
    steps, n = 40, 6
    done = rng.random((steps, n)) < 0.25
    done[:, 0] = False
    done[35, 0] = True  # sub-env 0's episode outgrows the small ring: spilled, ended apart
    terms = done & (rng.random((steps, n)) < 0.5)
    rollout = {
        "observation": rng.standard_normal((steps, n, 3)).astype(np.float32),
        "final_observation": rng.standard_normal((steps, n, 3)).astype(np.float32),
        "action": rng.integers(0, 4, (steps, n)),
        "reward": rng.standard_normal((steps, n)),  # float64, cast into float32
        "discount": rng.random((steps, n)).astype(np.float32),  # given, not 1 - terminated
        "terminated": terms,
        "truncated": done & ~terms,
        "step_metadata": {"t": rng.integers(0, 9, (steps, n))},
    }
    first = {
        "first_observation": rng.standard_normal((n, 3)).astype(np.float32),
        "first_step_metadata": {"t": np.zeros(n, np.int64)},
    }

    def half(lo, hi):
        return {
            k: ({"t": v["t"][lo:hi]} if isinstance(v, dict) else v[lo:hi])
            for k, v in rollout.items()
        }

    adds = []
    add = core.BatchRecorder.add
    monkeypatch.setattr(core.BatchRecorder, "add", lambda *a, **k: adds.append(1) or add(*a, **k))
    for name in ("c", "numpy"):
        if name == "numpy":
            monkeypatch.setattr(vector_step, "native", None)
        with RolloutRecorder(
            tmp_path / name, autoreset=autoreset, discount=True, ring_bytes=1024
        ) as rec:
            rec.write(**first, **half(0, 25))  # episodes go on across the calls
            rec.write(**half(25, steps))
        assert len(adds) == (0 if name == "c" else steps)
        adds.clear()
    want = records(tmp_path / "numpy")
    assert sum(want.values()) >= 20
    assert records(tmp_path / "c") == want
