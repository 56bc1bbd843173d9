"""The per-step `add` compiled from the step layout records what the checked path records.

`record.appender.compile_step_add` generates one function per dataset that
takes exact-typed values; anything else goes through the checked closures.
These tests record the same episode through both (exact values, and values in
the other forms a recorder accepts), load both with TFDS, and compare; and
they check that field names are data, never code, in the generated function.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import assert_same, load_episodes

import rlds_writer
from rlds_writer.errors import StepValueError
from rlds_writer.record import appender

# Keys that would break or inject code if they were pasted into the source.
ODD_KEYS = ("it's", "{v}", 'x"]+__import__("os").getcwd()+["', "a b/c")


@pytest.fixture(autouse=True)
def compiled_from_the_first_call(monkeypatch):
    """These tests are of the compiled step: no warm-up through the closures."""
    monkeypatch.setattr(appender, "COMPILE_AFTER", 0)


def _config() -> rlds_writer.DatasetConfig:
    return rlds_writer.DatasetConfig(
        name="compiled",
        observation_info={
            "pos": tfds.features.Tensor(shape=(3,), dtype=np.float32),
            "grid": tfds.features.Tensor(shape=(4, 4), dtype=np.uint8),
            "count": np.int64,
            "odd": {key: np.float32 for key in ODD_KEYS},
        },
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"note": tfds.features.Text(), "flag": np.bool_},
    )


def _exact(t: int) -> tuple:
    observation = {
        "pos": np.full(3, t, np.float32),
        "grid": np.full((4, 4), t, np.uint8),
        "count": t,
        "odd": {key: float(i + t) for i, key in enumerate(ODD_KEYS)},
    }
    action = np.array([t, -t], np.float32)
    return action, 0.5 * t, 1.0, observation, {"note": f"step {t}", "flag": t % 2 == 0}


def _other_forms(t: int) -> tuple:
    """The same values as `_exact(t)`, in forms only the checked path takes."""
    action, reward, discount, observation, meta = _exact(t)
    observation = {
        "pos": [float(t)] * 3,  # a list, not an array
        "grid": np.full((4, 4), t, np.int64).astype(np.uint8).tolist(),
        "count": np.int32(t),  # another integer type
        "odd": {key: np.float64(v) for key, v in observation["odd"].items()},
    }
    return list(action), np.float64(reward), np.float32(discount), observation, meta


def _record(path, make_step, steps: int = 6) -> None:
    with rlds_writer.TFDSBackendWriter(str(path), _config()) as backend:
        for episode in range(2):
            _, _, _, first, meta = make_step(0)
            backend.begin_episode(first, meta)
            for t in range(1, steps):
                backend.add_step(*make_step(t + 10 * episode))
            backend.end_episode(terminated=True)


def test_values_in_other_forms_are_recorded_as_the_exact_ones(tmp_path):
    _record(tmp_path / "exact", _exact)
    _record(tmp_path / "other", _other_forms)
    exact, other = load_episodes(tmp_path / "exact"), load_episodes(tmp_path / "other")
    assert len(exact) == 2
    assert_same(other, exact)
    step = exact[1]["steps"][2]
    assert step["observation"]["count"] == 12
    assert step["observation"]["odd"][ODD_KEYS[2]] == pytest.approx(14.0)
    assert step["action"].tolist() == [13.0, -13.0]  # a_t is taken after o_t


def test_field_names_are_never_code_in_the_compiled_step(tmp_path):
    _record(tmp_path / "ds", _exact, steps=3)
    episode = load_episodes(tmp_path / "ds")[0]
    assert sorted(episode["steps"][1]["observation"]["odd"]) == sorted(ODD_KEYS)


@pytest.mark.parametrize(
    "field, bad",
    [
        ("count", 2**63),  # a Python int out of int64's range
        ("pos", np.zeros(3, np.float64)),  # wrong dtype
        ("grid", np.zeros((4, 5), np.uint8)),  # wrong shape
    ],
)
def test_a_refused_value_leaves_the_step_unrecorded_and_recording_goes_on(tmp_path, field, bad):
    with rlds_writer.TFDSBackendWriter(str(tmp_path / "ds"), _config()) as backend:
        _, _, _, first, meta = _exact(0)
        backend.begin_episode(first, meta)
        backend.add_step(*_exact(1))
        action, reward, discount, observation, meta = _exact(2)
        with pytest.raises(StepValueError, match=f"observation/{field}"):
            backend.add_step(action, reward, discount, {**observation, field: bad}, meta)
        backend.add_step(*_exact(3))
        backend.end_episode(terminated=False)
    (episode,) = load_episodes(tmp_path / "ds")
    counts = [int(step["observation"]["count"]) for step in episode["steps"]]
    assert counts == [0, 1, 3]
    assert [step["action"].tolist() for step in episode["steps"]] == [
        [1.0, -1.0],
        [3.0, -3.0],
        [0.0, 0.0],
    ]


def test_missing_or_extra_step_metadata_is_refused_by_name(tmp_path):
    with rlds_writer.TFDSBackendWriter(str(tmp_path / "ds"), _config()) as backend:
        _, _, _, first, meta = _exact(0)
        backend.begin_episode(first, meta)
        action, reward, discount, observation, meta = _exact(1)
        with pytest.raises(StepValueError, match="step metadata"):
            backend.add_step(action, reward, discount, observation, None)
        with pytest.raises(StepValueError, match="unexpected keys"):
            backend.add_step(action, reward, discount, observation, {**meta, "more": 1})
        backend.add_step(action, reward, discount, observation, meta)
        backend.end_episode(terminated=True)
    (episode,) = load_episodes(tmp_path / "ds")
    assert len(episode["steps"]) == 2


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize(
    "rewards",
    [
        [0.1, np.float32(2.5), 3, -(2**62) + 1, np.float64(1e-46), float("nan"), 1 / 3],
        [np.float32(2.5), 0.1, 3],  # the first value is not a Python float
        [0.5, 1e39, 0.25],  # struct refuses the float32 overflow: numpy's inf
    ],
)
def test_scalar_columns_of_python_numbers_store_what_numpy_casts_them_to(tmp_path, rewards):
    """Scalar columns of Python numbers are packed with `struct`; they must hold
    what numpy's cast gives, for mixed types and for values struct refuses."""
    config = rlds_writer.DatasetConfig(
        name="scalars",
        observation_info=np.float32,
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float64,
    )
    actions = [0, 2**62 + 1, -5, np.int64(7), 2**63 - 1, np.int32(-3), 1][: len(rewards)]
    discounts = [1.0, 1 / 3, 2**60 + 1, np.float32(0.3), -0.0, 1e300, 0.5][: len(rewards)]
    with rlds_writer.TFDSBackendWriter(tmp_path / "d", config) as backend:
        backend.begin_episode(np.float32(0))
        for t, (a, r, d) in enumerate(zip(actions, rewards, discounts)):
            backend.add_step(a, r, d, np.float32(t))
        backend.end_episode(terminated=True)
    steps = load_episodes(tmp_path / "d")[0]["steps"][:-1]
    np.testing.assert_array_equal([s["reward"] for s in steps], np.array(rewards, np.float32))
    assert [int(s["action"]) for s in steps] == [int(a) for a in actions]
    # TFDS stores float64 as float32 (tf.train.Example has no double list).
    want = np.array(discounts, np.float64).astype(np.float32)
    np.testing.assert_array_equal([s["discount"] for s in steps], want)


def test_a_value_the_test_passes_but_its_packed_column_refuses_is_cast_not_lost(
    tmp_path, monkeypatch
):
    """The compiled test's types are `RowBuffer.append_number`'s (the C module's
    list); were they to drift, a value passing the test that the buffer
    refuses is cast, not lost."""
    from rlds_writer.record import scalar_columns, step_kernel

    if not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    accepts = scalar_columns.packed_accepts

    def drifted(kind: str, itemsize: int) -> tuple[frozenset, tuple[int, int]]:
        types, ints = accepts(kind, itemsize)
        return (types | {np.float16} if kind == "float" else types), ints

    monkeypatch.setattr(scalar_columns, "packed_accepts", drifted)
    config = rlds_writer.DatasetConfig(
        name="drift", observation_info=np.float32, action_info=np.int64, reward_info=np.float32
    )
    rewards = [np.float16(0.3), 0.5, np.float16(-2.5)]
    with rlds_writer.TFDSBackendWriter(tmp_path / "d", config) as backend:
        backend.begin_episode(np.float32(0))
        for t, reward in enumerate(rewards):
            backend.add_step(1, reward, 1.0, np.float32(t))
        assert "or _c" in backend.step_adder().source  # the packed append and its fallback
        backend.end_episode(terminated=True)
    steps = load_episodes(tmp_path / "d")[0]["steps"]
    assert [float(s["reward"]) for s in steps] == [float(np.float32(r)) for r in rewards] + [0]


def test_the_compiled_step_shows_its_source_to_inspect_and_tracebacks(tmp_path):
    import inspect
    import traceback

    with rlds_writer.TFDSBackendWriter(str(tmp_path / "ds"), _config()) as backend:
        _, _, _, first, meta = _exact(0)
        backend.begin_episode(first, meta)
        (buffer,) = backend.recorder._buffers.values()
        source = inspect.getsource(buffer.add)
        assert source == buffer.add.source
        assert source.startswith("def add(action, reward, discount, next_observation")
        action, reward, discount, observation, meta = _exact(1)
        with pytest.raises(StepValueError) as refused:
            buffer.add(action, "not a reward", discount, observation, meta)
    frames = traceback.format_tb(refused.value.__traceback__)
    # The generated frame, with its line: the value failed a test and was handed on.
    assert any("<rlds_writer step add" in f and "_checked(action, reward" in f for f in frames)


def test_the_step_is_compiled_after_its_first_calls_and_records_the_same(tmp_path, monkeypatch):
    """`add` takes its first `COMPILE_AFTER` steps through the checked closures, then
    the generated code becomes its own (the same function object, so whatever holds
    it steps compiled); the dataset is the one compiled from the first step makes."""
    _record(tmp_path / "compiled_at_once", _exact)
    monkeypatch.setattr(appender, "COMPILE_AFTER", 4)
    files = []
    with rlds_writer.TFDSBackendWriter(str(tmp_path / "warmed_up"), _config()) as backend:
        for episode in range(2):
            _, _, _, first, meta = _exact(0)
            backend.begin_episode(first, meta)
            (buffer,) = backend.recorder._buffers.values()
            for t in range(1, 6):
                files.append(buffer.add.__code__.co_filename)
                backend.add_step(*_exact(t + 10 * episode))
            backend.end_episode(terminated=True)
    # One buffer, reused: compiled at its fourth call, in the first episode.
    assert files[:4] == ["<rlds_writer step add, not compiled yet>"] * 4
    assert all(f.startswith("<rlds_writer step add ") for f in files[4:])
    assert len(set(files[4:])) == 1 and files[4] != files[0]

    def shard_bytes(path):
        return [p.read_bytes() for p in sorted(path.glob("*.tfrecord-*"))]

    assert shard_bytes(tmp_path / "warmed_up") == shard_bytes(tmp_path / "compiled_at_once")
    assert len(load_episodes(tmp_path / "warmed_up")) == 2


class _ScriptedEnv:
    """A dm_env env whose steps give the scripted (reward, observation) pairs, then end."""

    def __init__(self, script: list[tuple]):
        import dm_env
        from dm_env import specs

        self._dm_env = dm_env
        self._spec = specs.Array((2,), np.float32)
        self._script = script
        self._t = 0

    def reset(self):
        self._t = 0
        return self._dm_env.restart(np.zeros(2, np.float32))

    def step(self, action):
        reward, observation = self._script[self._t]
        self._t += 1
        if self._t == len(self._script):
            return self._dm_env.termination(reward=reward, observation=observation)
        return self._dm_env.transition(reward=reward, observation=observation)

    def observation_spec(self):
        return self._spec

    def action_spec(self):
        from dm_env import specs

        return specs.DiscreteArray(300, dtype=np.int64)

    def reward_spec(self):
        from dm_env import specs

        return specs.Array((), np.float32)

    def discount_spec(self):
        from dm_env import specs

        return specs.BoundedArray((), np.float32, 0.0, 1.0)

    def close(self):
        pass


def test_env_logger_steps_through_its_own_compiled_step(tmp_path, step_path):
    """EnvLogger inlines the buffer's test and appends into its mid-episode step (or
    hands the env's step to the C step, which calls that Python step for the rest);
    values in other forms and refused values take the checked path as before."""
    import inspect

    def obs(t):
        return np.full(2, t, np.float32)

    script = [
        (0.5, obs(1)),
        (np.float32(1.5), obs(2)),  # not a Python float: the checked path
        (2, [3.0, 3.0]),  # an int reward, a list observation
        (0.25, obs(4)),
        (0.75, obs(5)),
    ]
    path = str(tmp_path / "d")
    logged = rlds_writer.EnvLogger(_ScriptedEnv(script), data_directory=path)
    logged.reset()
    step = logged.step
    if step_path == "c":
        assert type(step).__name__ == "StepKernel"
        # The kernel takes the mid-episode steps; what it leaves goes the checked way.
        assert not hasattr(step.after, "source")
    else:
        assert "timestep = _env_step(action)" in step.source
        assert inspect.getsource(step) == step.source
        assert ".tobytes())" in step.source  # the observation's append, inlined
    actions = [1, 200, 7, 3, 2]
    for action in actions:
        logged.step(action)
    # A refused value mid-episode: the episode is cut short there, and recording
    # resumes at the next reset.
    bad = [(0.5, obs(1)), (0.5, np.zeros(3, np.float32)), (0.5, obs(3))]
    logged._env._script = bad
    logged.reset()
    logged.step(1)
    with pytest.raises(StepValueError, match="steps/observation"):
        logged.step(1)
    logged.step(1)  # the env's last step: not recorded
    logged._env._script = script
    logged.reset()
    for action in actions:
        logged.step(action)
    logged.close()
    first, cut, again = load_episodes(tmp_path / "d")
    for episode in (first, again):
        steps = episode["steps"]
        assert [int(s["action"]) for s in steps[:-1]] == actions
        np.testing.assert_array_equal(
            [s["reward"] for s in steps[:-1]], np.float32([0.5, 1.5, 2, 0.25, 0.75])
        )
        np.testing.assert_array_equal([s["observation"] for s in steps], [obs(t) for t in range(6)])
        assert bool(steps[-1]["is_terminal"])
    assert len(cut["steps"]) == 2
    assert cut["end_reason"] == b"cut_short"
