"""EnvLogger's C step (`record.step_kernel`) records exactly what its Python step records.

Each test records the same scripted episodes twice, once with the C step and
once with RLDS_WRITER_PURE_PYTHON=1, and compares the shard files byte for
byte and the errors raised. The scripts hold values the C step takes as they
are and values it must leave to the Python step: other scalar types, ints out
of int64, non-contiguous, byte-swapped, subclassed and misshapen arrays,
lists, other step and timestep types, an env whose step raises.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import sysconfig
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dm_env
import numpy as np
import pytest
from dm_env import specs
from helpers_core import load_episodes

import rlds_writer
from rlds_writer.errors import StepValueError
from rlds_writer.record import chunk_columns, row_columns, scalar_columns, step_kernel

_SHAPE = (3, 2)


def _obs(t: float) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(_SHAPE) + t


class _Timestep(dm_env.TimeStep):
    """A TimeStep subclass: only the Python step reads it (by attribute)."""


class _Scripted(dm_env.Environment):
    """Each step gives the next scripted timestep (a callable returning one, or raising)."""

    def __init__(self, episodes: list[list[Callable[[], dm_env.TimeStep]]]):
        self._episodes = episodes
        self._episode = -1
        self._t = 0

    def reset(self) -> dm_env.TimeStep:
        self._episode += 1
        self._t = 0
        return dm_env.restart(_obs(0))

    def step(self, action: Any) -> dm_env.TimeStep:
        make = self._episodes[self._episode][self._t]
        self._t += 1
        return make()

    def observation_spec(self) -> specs.Array:
        return specs.Array(_SHAPE, np.float32)

    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(5, dtype=np.int64)

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32)

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0)


def _mid(reward: Any, observation: Any, discount: Any = 1.0) -> Callable[[], dm_env.TimeStep]:
    return lambda: dm_env.TimeStep(dm_env.StepType.MID, reward, discount, observation)


def _last(reward: Any = 1.0) -> Callable[[], dm_env.TimeStep]:
    return lambda: dm_env.termination(reward=reward, observation=_obs(99))


def _raises() -> dm_env.TimeStep:
    raise ValueError("the env failed")


def _fortran() -> np.ndarray:
    return np.asfortranarray(_obs(5))


def _strided() -> np.ndarray:
    return np.repeat(_obs(6), 2, axis=1)[:, ::2]


class _Sub(np.ndarray):
    pass


# (action, timestep) per step; the last step of each episode ends it.
_EPISODES: list[list[tuple[Any, Callable[[], dm_env.TimeStep]]]] = [
    # Values the C step takes as they are.
    [
        (1, _mid(0.5, _obs(1))),
        (2, _mid(0.25, _obs(2), 0.5)),
        (0, _mid(-1.0, _obs(3))),
        (4, _last()),
    ],
    # Other forms, which the Python step casts.
    [
        (np.int64(3), _mid(np.float32(0.5), _obs(1))),
        (True, _mid(2, _obs(2), np.float64(1.0))),
        (1, _mid(0.5, _fortran())),
        (1, lambda: dm_env.TimeStep(dm_env.StepType.MID, 0.5, 1.0, _strided())),
        (1, _mid(0.5, _obs(7).astype(">f4"))),
        (1, _mid(0.5, _obs(8).astype(np.float64))),
        (1, _mid(0.5, _obs(9).tolist())),
        (1, lambda: _Timestep(dm_env.StepType.MID, 0.5, 1.0, _obs(10))),
        (1, _mid(0.5, _obs(11).view(_Sub))),
        (2, _last(0.0)),
    ],
    # A refused value ends the episode there, cut short; the env's last step is not recorded.
    [(1, _mid(0.5, _obs(1))), (2**63, _mid(0.5, _obs(2))), (1, _last())],
    [(1, _mid(0.5, _obs(1))), (1, _mid(0.5, np.zeros((2, 3), np.float32))), (1, _last())],
    [(1, _mid(0.5, _obs(1))), (1, _mid(None, _obs(2))), (1, _last())],
    [(1, _mid(0.5, _obs(1))), (1, _mid("0.5", _obs(2))), (1, _last())],
    # The env fails mid-episode: nothing is recorded for that step, and the episode goes on.
    [(1, _mid(0.5, _obs(1))), (1, _raises), (1, _mid(0.5, _obs(2))), (1, _last())],
    # The env restarts mid-episode: the open episode ends cut short, a new one begins.
    [
        (1, _mid(0.5, _obs(1))),
        (1, lambda: dm_env.restart(_obs(50))),
        (1, _mid(0.5, _obs(2))),
        (1, _last()),
    ],  # fmt: skip
    # Rewards and discounts of every kind, packed at the step (the C step takes a
    # float, np.float32/64 and an int float32 holds exactly) or cast by numpy.
    [
        (1, _mid(3, _obs(1), 1)),
        (1, _mid(2**24, _obs(2), np.float64(0.5))),
        (1, _mid(2**24 + 1, _obs(3), np.float32(0.25))),
        (1, _mid(np.float64(0.1), _obs(4))),
        (1, _mid(np.float32(0.3), _obs(5))),
        (1, _mid(np.float16(0.7), _obs(6))),
        (1, _mid(1e39, _obs(7))),
        (1, _mid(-0.0, _obs(8))),
        (1, _mid(float("nan"), _obs(9))),
        (1, _mid(np.int32(-5), _obs(10))),
        (1, _last(-(2**24))),
    ],
    # Actions of every integer kind, packed at the step (one byte each while all
    # lie in [0, 128), else int64) or cast.
    [
        (np.uint32(7), _mid(0.5, _obs(1))),
        (np.int8(-3), _mid(0.5, _obs(2))),
        (np.longlong(5), _mid(0.5, _obs(3))),
        (np.uint16(128), _mid(0.5, _obs(4))),
        (2**63 - 1, _mid(0.5, _obs(5))),
        (-(2**63), _mid(0.5, _obs(6))),
        (np.uint64(9), _mid(0.5, _obs(7))),
        (np.bool_(True), _last()),
    ],
]


def _record(path: Path, pure_python: bool, monkeypatch) -> tuple[list[str], set[str]]:
    """Records `_EPISODES`; returns the errors raised and the types `step` had."""
    if pure_python:
        monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
    else:
        monkeypatch.delenv(step_kernel.PURE_PYTHON_ENV, raising=False)
    env = _Scripted([[make for _, make in steps] for steps in _EPISODES])
    errors, kinds = [], set()
    with rlds_writer.EnvLogger(env, data_directory=str(path), max_episodes_per_file=3) as logged:
        for steps in _EPISODES:
            logged.reset()
            kinds.add(type(logged.step).__name__)
            for action, _ in steps:
                try:
                    logged.step(action)
                except (StepValueError, ValueError) as e:
                    errors.append(f"{type(e).__name__}: {e}")
    return errors, kinds


def _shards(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.tfrecord-*"))}


def test_the_c_step_records_the_same_shards_and_raises_the_same_errors(tmp_path, monkeypatch):
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    with np.errstate(over="ignore"):  # 1e39 is float32 inf, as TFDS casts it
        c_errors, c_kinds = _record(tmp_path / "c", False, monkeypatch)
        py_errors, py_kinds = _record(tmp_path / "py", True, monkeypatch)
    assert c_kinds == {"StepKernel"} and py_kinds == {"function"}
    assert c_errors == py_errors
    assert any("out of range" in e for e in c_errors)
    assert sum("the env failed" in e for e in c_errors) == 1
    c_shards, py_shards = _shards(tmp_path / "c"), _shards(tmp_path / "py")
    assert c_shards and c_shards == py_shards
    episodes = load_episodes(tmp_path / "c")
    assert len(episodes) == 11  # the restart splits one env episode in two
    np.testing.assert_array_equal(episodes[0]["steps"][1]["observation"], _obs(1))
    np.testing.assert_array_equal(episodes[1]["steps"][3]["observation"], _fortran())
    np.testing.assert_array_equal(episodes[1]["steps"][4]["observation"], _strided())
    rewards = [s["reward"] for s in episodes[9]["steps"]]
    expected = np.float32(
        [3, 2**24, 2**24, 0.1, 0.3, np.float16(0.7), np.inf, -0.0, np.nan, -5, -(2**24), 0]
    )
    assert np.array_equal(rewards, expected, equal_nan=True)
    assert [np.signbit(r) for r in rewards[7:9]] == [True, False]
    discounts = [s["discount"] for s in episodes[9]["steps"]]
    assert discounts == [1, 0.5, 0.25] + [1] * 7 + [0, 0]
    actions = [int(s["action"]) for s in episodes[10]["steps"]]
    assert actions == [7, -3, 5, 128, 2**63 - 1, -(2**63), 9, 1, 0]


def test_the_c_step_takes_the_catch_layout_and_leaves_others_to_the_python_step(tmp_path):
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    env = _Scripted([[_mid(0.5, _obs(1))] * 3 + [_last()]] * 3)
    with rlds_writer.EnvLogger(env, data_directory=str(tmp_path / "a")) as logged:
        logged.reset()
        assert type(logged.step).__name__ == "StepKernel"
        assert logged.step(action=1).step_type == dm_env.StepType.MID  # by keyword, as dm_env
        with pytest.raises(TypeError, match="one argument"):
            logged.step()
        with pytest.raises(TypeError, match="one argument"):
            logged.step(1, 2)
    # With a user function to call per step, the Python step runs.
    env = _Scripted([[_mid(0.5, _obs(1))] * 3 + [_last()]])
    path = str(tmp_path / "b")
    with rlds_writer.EnvLogger(env, data_directory=path, episode_fn=lambda *a: None) as logged:
        logged.reset()
        assert "step" not in logged.__dict__


def test_the_c_step_keeps_no_reference_to_what_it_records_and_lets_the_env_go(tmp_path, step_path):
    observation = _obs(3)
    reward = float("0.125")  # one object, counted below
    action = int("1000003")  # an int object of its own (not a cached small int)
    # The last step goes to the Python step: the C step hands its timestep over.
    last = lambda: dm_env.termination(reward=reward, observation=observation)  # noqa: E731
    steps = [_mid(reward, observation)] * 50 + [last]
    env = _Scripted([steps] * 20)
    counts = sys.getrefcount(observation), sys.getrefcount(reward), sys.getrefcount(action)
    logged = rlds_writer.EnvLogger(env, data_directory=str(tmp_path / "d"))
    for _ in range(20):
        logged.reset()
        for _ in steps:
            logged.step(action)
    logged.close()
    del steps, last
    env._episodes = None
    assert (sys.getrefcount(observation), sys.getrefcount(reward), sys.getrefcount(action)) == (
        counts[0] - 1,  # the scripted mid step's function held one
        counts[1] - 1,
        counts[2],
    )
    gone = weakref.ref(env)
    del env, logged
    gc.collect()
    assert gone() is None
    assert len(load_episodes(tmp_path / "d")) == 20


def test_an_install_with_a_c_compiler_builds_the_c_step():
    if step_kernel.disabled():
        pytest.skip(f"{step_kernel.PURE_PYTHON_ENV} is set: no C step is built or used")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None and shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here: the package records with its Python step")
    assert step_kernel.available(), (
        "a C compiler is here but rlds_writer.record._step_kernel is not built: "
        "reinstall (pip install -e .) to build it"
    )


def test_without_the_built_c_step_the_python_step_records(tmp_path, monkeypatch):
    # As after an install without a C compiler: the module cannot be imported.
    monkeypatch.setitem(sys.modules, "rlds_writer.record._step_kernel", None)
    monkeypatch.delenv(step_kernel.PURE_PYTHON_ENV, raising=False)
    step_kernel._module.cache_clear()
    try:
        assert not step_kernel.available()
        env = _Scripted([[_mid(0.5, _obs(1))] * 3 + [_last()]] * 2)
        with rlds_writer.EnvLogger(env, data_directory=str(tmp_path / "d")) as logged:
            for _ in range(2):
                logged.reset()
                assert type(logged.step).__name__ == "function"
                for _ in range(4):
                    logged.step(1)
    finally:
        step_kernel._module.cache_clear()
    episodes = load_episodes(tmp_path / "d")
    assert [len(e["steps"]) for e in episodes] == [5, 5]


# --- RecordRLDS (Gymnasium): the same, with results (obs, reward, terminated, truncated, info).


def _gym_env(episodes: list[list[tuple]], action_space: Any = None) -> Any:
    gymnasium = pytest.importorskip("gymnasium")

    class Scripted(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(-1e9, 1e9, _SHAPE, np.float32)

        def __init__(self) -> None:
            self.action_space = action_space or gymnasium.spaces.Discrete(5)
            self._episode, self._t = -1, 0

        def reset(self, *, seed: Any = None, options: Any = None) -> tuple:
            super().reset(seed=seed)
            self._episode += 1
            self._t = 0
            return _obs(0), {}

        def step(self, action: Any) -> tuple:
            result = episodes[self._episode][self._t]
            self._t += 1
            return result() if callable(result) else result

    return Scripted()


def _gym_result(reward: Any, obs: Any, terminated: Any = False, truncated: Any = False) -> tuple:
    return (obs, reward, terminated, truncated, {"ignored": 1})


_GYM_EPISODES = [
    # Taken by the C step, then the end.
    [_gym_result(0.5, _obs(1)), _gym_result(-1.0, _obs(2)), _gym_result(1.0, _obs(3), True)],
    # Left to the Python step: numpy bools, a Fortran-order observation, a
    # list (a numpy reward too, where the column is a list); then a float64 observation, refused
    # (a float32 Box): the episode is cut short there.
    [
        _gym_result(np.float32(0.25), _obs(1)),
        _gym_result(0.5, _obs(2), np.bool_(False), np.bool_(False)),
        _gym_result(0.5, _fortran()),
        _gym_result(0.5, _obs(4).tolist()),
        _gym_result(0.5, _obs(5).astype(np.float64)),
        _gym_result(0.5, _obs(6), False, True),
    ],
    # A refused observation: cut short there; the env's next steps are not recorded.
    [
        _gym_result(0.5, _obs(1)),
        _gym_result(0.5, np.zeros((2, 3), np.float32)),
        _gym_result(0.5, _obs(3)),
        _gym_result(0.5, _obs(4), True),
    ],
    # Rewards of other types: float() of each, as the Python step stores it.
    [
        _gym_result(2, _obs(1)),
        _gym_result(np.float64(0.1), _obs(2)),
        _gym_result(2**24 + 1, _obs(3)),
        _gym_result(np.float16(0.3), _obs(4)),
        _gym_result(-(2**24), _obs(5), True),
    ],
]


def _record_gym(path: Path, pure_python: bool, monkeypatch, **kwargs: Any) -> tuple[list, set]:
    if pure_python:
        monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
    else:
        monkeypatch.delenv(step_kernel.PURE_PYTHON_ENV, raising=False)
    from rlds_writer import RecordRLDS

    actions = kwargs.pop("actions", None)
    env = RecordRLDS(_gym_env(_GYM_EPISODES, kwargs.pop("action_space", None)), path, **kwargs)
    errors, kinds = [], set()
    for e, steps in enumerate(_GYM_EPISODES):
        env.reset(seed=e)
        kinds.add(type(env.step).__name__)
        for t in range(len(steps)):
            action = actions[t % len(actions)] if actions else t % 5
            try:
                env.step(action)
            except StepValueError as err:
                errors.append(str(err))
    env.close()
    return errors, kinds


@pytest.mark.parametrize("discount", [False, True])
def test_record_rlds_c_step_records_the_same_shards_as_its_python_step(
    tmp_path, monkeypatch, discount
):
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    c = _record_gym(tmp_path / "c", False, monkeypatch, discount=discount)
    py = _record_gym(tmp_path / "py", True, monkeypatch, discount=discount)
    assert c[1] == {"StepKernel"} and py[1] == {"method"}
    assert c[0] == py[0] and len(c[0]) == 2
    c_shards = _shards(tmp_path / "c")
    assert c_shards and c_shards == _shards(tmp_path / "py")
    episodes = load_episodes(tmp_path / "c")
    assert [len(e["steps"]) for e in episodes] == [4, 5, 2, 6]
    rewards = [float(s["reward"]) for s in episodes[3]["steps"]]
    assert rewards == [2, np.float32(0.1), 2**24, np.float32(np.float16(0.3)), -(2**24), 0]
    np.testing.assert_array_equal(episodes[1]["steps"][3]["observation"], _fortran())


def test_record_rlds_c_step_takes_box_actions_of_the_column_dtype_only(tmp_path, monkeypatch):
    gymnasium = pytest.importorskip("gymnasium")
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    box = gymnasium.spaces.Box(-1, 1, (2,), np.float32)
    # float64 actions are cast to the space's float32 by the Python step.
    actions = [np.array([0.5, -0.5], np.float32), np.array([0.25, 0.125], np.float64)]
    kwargs = {"action_space": box, "actions": actions}
    c = _record_gym(tmp_path / "c", False, monkeypatch, **dict(kwargs))
    py = _record_gym(tmp_path / "py", True, monkeypatch, **dict(kwargs))
    assert c[1] == {"StepKernel"} and c[0] == py[0]
    assert _shards(tmp_path / "c") == _shards(tmp_path / "py")
    steps = load_episodes(tmp_path / "c")[0]["steps"]
    assert steps[1]["action"].dtype == np.float32
    np.testing.assert_array_equal(steps[1]["action"], [0.25, 0.125])


def test_record_rlds_with_the_c_step_lets_the_wrapper_go(tmp_path, step_path):
    from rlds_writer import RecordRLDS

    env = RecordRLDS(_gym_env(_GYM_EPISODES[:1]), tmp_path / "d")
    env.reset(seed=0)
    env.step(1)
    gone = weakref.ref(env)
    del env
    gc.collect()
    assert gone() is None  # and exit wrote the open episode, cut short


# --- Made when the recorder is created: the first reset pays no compile or load.


def test_envlogger_makes_its_first_episodes_step_when_it_is_created(tmp_path, step_path):
    env = _Scripted([[_mid(0.5, _obs(1))] * 3 + [_last()]])
    with rlds_writer.EnvLogger(env, data_directory=str(tmp_path / "d")) as logged:
        made = list(logged._fused.values())
        assert len(made) == 1
        logged.reset()
        assert logged.step is made[0]
        assert type(made[0]).__name__ == ("StepKernel" if step_path == "c" else "function")
        for _ in range(4):
            logged.step(1)
    assert [len(e["steps"]) for e in load_episodes(tmp_path / "d")] == [5]


def test_record_rlds_makes_its_first_episodes_c_step_when_it_is_created(tmp_path):
    from rlds_writer import RecordRLDS

    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    env = RecordRLDS(_gym_env(_GYM_EPISODES[:1]), tmp_path / "d")
    made = [k for k in env._recording._kernels.values() if k is not None]
    assert len(made) == 1
    env.reset(seed=0)
    assert env.step is made[0]
    for _ in range(3):
        env.step(1)
    env.close()
    assert [len(e["steps"]) for e in load_episodes(tmp_path / "d")] == [4]


class _IntActions(_Scripted):
    """Actions of an integer dtype other than int64 (dm_env's `DiscreteArray` is int32)."""

    def __init__(self, episodes, dtype):
        super().__init__(episodes)
        self._dtype = dtype

    def action_spec(self) -> specs.Array:
        return specs.Array((), self._dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint16, np.uint64])
def test_python_int_actions_in_any_int_dtype_are_taken_at_the_step_and_bounded(
    tmp_path, monkeypatch, dtype
):
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    # Per episode, the actions of its steps; an out-of-range one ends its episode.
    episodes = [[1, lo, hi, np.int64(2), True, 0], [3, hi + 1], [4, lo - 1]]
    results = {}
    for pure in (False, True):
        if pure:
            monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
        else:
            monkeypatch.delenv(step_kernel.PURE_PYTHON_ENV, raising=False)
        casts: list[Any] = []
        cast = scalar_columns.cast_value
        for kind in (scalar_columns, row_columns, chunk_columns):
            monkeypatch.setattr(
                kind,
                "cast_value",
                lambda f, v, casts=casts, cast=cast: casts.append(v) or cast(f, v),
            )
        scripts = [[_mid(0.5, _obs(t)) for t in range(len(a) - 1)] + [_last()] for a in episodes]
        path = tmp_path / ("py" if pure else "c")
        errors = []
        with rlds_writer.EnvLogger(_IntActions(scripts, dtype), data_directory=str(path)) as logged:
            for actions in episodes:
                logged.reset()
                for action in actions:
                    try:
                        logged.step(action)
                    except StepValueError as e:
                        errors.append(str(e))
        # Only the numpy scalar and the bool are cast; ints out of range are refused by name.
        assert [type(v) for v in casts] == [np.int64, bool], casts
        results[pure] = errors, _shards(path)
    assert results[False] == results[True]
    errors, shards = results[False]
    assert shards and len(errors) == 2 and all("steps/action" in e for e in errors)
    assert "out of range" in errors[0] and str(hi + 1) in errors[0]
    recorded = load_episodes(tmp_path / "c")
    assert [int(s["action"]) for s in recorded[0]["steps"][:5]] == [1, lo, hi, 2, 1]


def test_a_row_buffer_keeps_rows_end_to_end_and_refuses_a_row_of_another_size():
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    rows = step_kernel.row_buffer_type()(4)
    for i in range(40):  # past the first allocation (16 rows)
        rows.append(bytes([i]) * 4)
    assert len(rows) == 40
    assert rows.take() == b"".join(bytes([i]) * 4 for i in range(40))
    with pytest.raises(ValueError, match="a row of 4 bytes expected, got 3"):
        rows.append(b"abc")
    rows.append(np.arange(4, dtype=np.uint8))  # any bytes-like row
    rows.truncate(2)
    assert rows.take() == b"\x00" * 4 + b"\x01" * 4
    rows.truncate(5)  # never grows
    assert len(rows) == 2
    rows.clear()
    assert len(rows) == 0 and rows.take() == b""
    rows.append(b"wxyz")
    assert rows.take() == b"wxyz"
    big = step_kernel.row_buffer_type()(4096)
    for _ in range(3000):  # 12 MB: let go at clear, then grown again
        big.append(bytes(4096))
    big.clear()
    big.append(b"\x01" * 4096)
    assert big.take() == b"\x01" * 4096


def test_a_row_buffer_packs_numbers_as_numpy_casts_them_and_refuses_the_rest():
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    taken = [1.5, np.float64(0.1), np.float32(0.3), 7, -(2**24), 2**24, -0.0, 1e39, float("nan")]
    refused = [2**24 + 1, 2**70, True, np.float16(1), np.int64(2), "1", None, np.array(1.0)]
    f32 = step_kernel.row_buffer_type()(4)
    f64 = step_kernel.row_buffer_type()(8)
    for value in taken:
        assert f32.append_number(value) is True and f64.append_number(value) is True
    for value in refused[:1]:  # float64 holds it exactly: taken there only
        assert f32.append_number(value) is False and f64.append_number(value) is True
    for value in refused[1:]:
        assert f32.append_number(value) is False and f64.append_number(value) is False
    assert len(f32) == len(taken) and len(f64) == len(taken) + 1
    with np.errstate(over="ignore"):
        expected32 = np.array([np.float32(v) for v in taken], np.float32)
    assert f32.take() == expected32.tobytes()  # NaN and -0.0 bit for bit
    expected64 = np.array([np.float64(v) for v in taken + [2**24 + 1]], np.float64)
    assert f64.take() == expected64.tobytes()
    with pytest.raises(TypeError, match="rows of 4 or 8 bytes"):
        step_kernel.row_buffer_type()(2).append_number(1.0)


def test_a_row_buffer_packs_int64s_and_gives_small_ones_as_one_byte_each():
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    taken = [0, 127, np.int64(3), np.longlong(4), np.int32(5), np.int16(6), np.int8(7)]
    taken += [np.uint8(8), np.uint16(9), np.uint32(10)]
    refused = [2**63, -(2**63) - 1, True, np.uint64(1), 1.0, np.float32(1), "1", None]
    rows = step_kernel.row_buffer_type()(8)
    for value in taken:
        assert rows.append_int(value) is True
    for value in refused:
        assert rows.append_int(value) is False
    assert rows.take_small_ints() == bytes(int(v) for v in taken)
    assert rows.take() == np.array(taken, np.int64).tobytes()
    for big in (128, -1, 2**63 - 1, -(2**63)):
        rows.append_int(big)
        assert rows.take_small_ints() is None
        rows.truncate(len(taken))
        assert rows.take_small_ints() is not None
    with pytest.raises(TypeError, match="rows of 8 bytes"):
        step_kernel.row_buffer_type()(4).append_int(1)


# --- A Python int too large for a float field (issue 46, item 9).


class _FloatRewards(_Scripted):
    def __init__(self, episodes: list, dtype: Any):
        super().__init__(episodes)
        self._dtype = dtype

    def reward_spec(self) -> specs.Array:
        return specs.Array((), self._dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("step_path", ["c", "python"])
def test_an_int_too_large_for_a_float_reward_is_refused_at_the_step_by_name(
    tmp_path, monkeypatch, dtype, step_path
):
    if step_path == "python":
        monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
    elif not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    largest = 2**1024 - 2**970 - 1  # the largest int a double holds: taken
    assert float(largest) == sys.float_info.max
    with pytest.raises(OverflowError):
        float(largest + 1)
    refused = [largest + 1, 2**1024, -(2**1024), 2**20000]  # the last: too long to print
    scripts = [[_mid(0.5, _obs(1)), _mid(largest, _obs(2)), _mid(bad, _obs(3))] for bad in refused]
    errors = []
    path = tmp_path / "d"
    with rlds_writer.EnvLogger(_FloatRewards(scripts, dtype), data_directory=str(path)) as logged:
        for _ in scripts:
            logged.reset()
            kind = type(logged.step).__name__
            logged.step(1)
            logged.step(2)
            with pytest.raises(StepValueError) as refusal:
                logged.step(3)  # at the step, not at the episode's end
            errors.append(str(refusal.value))
    assert kind == ("StepKernel" if step_path == "c" else "function")
    assert all("steps/reward" in e and "int too large to convert to float" in e for e in errors)
    assert "int of 20001 bits" in errors[-1]
    # Nothing is lost: each episode keeps the steps before the refused one.
    episodes = load_episodes(path)
    assert len(episodes) == len(refused)
    stored = np.asarray(np.array([0.5, largest], dtype), np.float32)  # TFDS stores float32
    for episode in episodes:
        rewards = [s["reward"] for s in episode["steps"]]
        assert np.array_equal(rewards[:2], stored), rewards


# --- The C step's construction and counting (issue 46, item 10): what the
# extension is given is checked, whatever calls it.


def _kernel_or_skip() -> Any:
    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    return step_kernel._module()


class _Count:
    """The episode buffer's part the C step uses: its `num_steps` slot and `_rollback`."""

    __slots__ = ("num_steps",)

    def _rollback(self, n: int) -> None:
        raise AssertionError("no rollback expected")


def _array_kernel(rows: Any, nbytes: int, buffer: Any, handed: list) -> Any:
    """A C step of (reward, observation) results: a float reward, a float32 (3, 2) observation."""
    rewards: list = []
    leaves = (
        step_kernel.NO_FIELD,
        ("scalar", rewards, frozenset({float}), True, None, (), 0),
        step_kernel.NO_FIELD,
        ("array", rows, None, False, np.dtype(np.float32), _SHAPE, nbytes),
    )
    return step_kernel.step_kernel(
        lambda action: (0.5, _obs(action)),
        (tuple, 2),
        (),
        (0, (1.0,), 1),
        lambda action, result: handed.append(action) or result,
        buffer,
        leaves,
    )


@pytest.mark.parametrize("nbytes", [23, 25, 24 + 4096, 1])
@pytest.mark.parametrize("rows", ["list", "RowBuffer"])
def test_an_array_leaf_whose_nbytes_is_not_its_rows_size_is_refused(nbytes, rows):
    # 24 bytes a row: a larger nbytes would copy past the array, a smaller cut it.
    module = _kernel_or_skip()
    column = module.RowBuffer(nbytes) if rows == "RowBuffer" else []
    buffer = _Count()
    buffer.num_steps = 1
    try:
        step = _array_kernel(column, nbytes, buffer, [])
    except ValueError as e:
        assert f"itemsize times its shape's size, 24; got {nbytes}" in str(e)
    else:  # what the check prevents: rows copied as nbytes from 24-byte arrays
        step(3)
        pytest.fail(f"an array leaf of 24-byte rows was taken with nbytes={nbytes}")
    column = module.RowBuffer(24) if rows == "RowBuffer" else []
    step = _array_kernel(column, 24, buffer, [])
    step(3)
    taken = column.take() if rows == "RowBuffer" else b"".join(column)
    assert taken == _obs(3).tobytes() and buffer.num_steps == 2


def test_an_array_leaf_of_a_negative_size_is_refused():
    _kernel_or_skip()
    with pytest.raises(ValueError, match="negative size"):
        step_kernel.step_kernel(
            lambda a: None,
            (tuple, 2),
            (),
            (0, (1.0,), 1),
            lambda a, r: r,
            _Count(),
            (step_kernel.NO_FIELD, step_kernel.NO_FIELD, step_kernel.NO_FIELD,
             ("array", [], None, False, np.dtype(np.float32), (-2, -3), 24)),
        )  # fmt: skip


def test_a_step_at_sys_maxsize_steps_is_left_to_the_python_step():
    # The C step counts in a Py_ssize_t: the step past sys.maxsize must not wrap.
    module = _kernel_or_skip()
    buffer, handed = _Count(), []
    rows = module.RowBuffer(24)
    step = _array_kernel(rows, 24, buffer, handed)
    buffer.num_steps = sys.maxsize - 1
    step(1)
    assert buffer.num_steps == sys.maxsize and handed == [] and len(rows) == 1
    step(2)
    assert handed == [2] and buffer.num_steps == sys.maxsize and len(rows) == 1


# Signalling NaNs: float32 0x7f800001 and 0xffa0000a, float64 0x7ff0000000000001.
_SNAN32 = np.frombuffer(bytes.fromhex("0100807f0a00a0ff"), np.float32)
_SNAN64 = float(np.frombuffer(bytes.fromhex("010000000000f07f"), np.float64)[0])


def test_a_row_buffer_stores_the_bits_numpys_cast_gives_a_signalling_nan():
    _kernel_or_skip()
    values = [_SNAN32[0], _SNAN32[1], _SNAN64, np.float64(_SNAN64), 1.5]
    for dtype in (np.float32, np.float64):
        rows = step_kernel.row_buffer_type()(np.dtype(dtype).itemsize)
        for value in values:
            assert rows.append_number(value) is True
        with np.errstate(invalid="ignore"):  # numpy's cast of a signalling NaN says so
            expected = b"".join(np.asarray(v, dtype).tobytes() for v in values)
        assert rows.take().hex() == expected.hex()
    # An np.float32 one keeps its bits in a float32 row: still signalling, as in numpy.
    rows = step_kernel.row_buffer_type()(4)
    rows.append_number(_SNAN32[0])
    assert rows.take() == _SNAN32[:1].tobytes()
