"""Values are cast by TFDS's rules; bad steps fail at once, clearly, and lose nothing.

For every rejected value the test also checks that TFDS's own encoder rejects
it, and for accepted ones (see also test_feature_roundtrip) that TFDS accepts
and decodes them the same way.
"""

from __future__ import annotations

import copy

import dm_env
import numpy as np
import pytest
from dm_env import specs
from helpers_core import EpisodeSpec, assert_same, load_episodes, rlds_example

import rlds_writer

F32 = np.float32


def _config():
    import tensorflow_datasets as tfds

    return rlds_writer.DatasetConfig(
        name="errors",
        observation_info={
            "pos": tfds.features.Tensor(shape=(2,), dtype=F32),
            "flag": np.bool_,
            "level": np.uint8,
            "label": tfds.features.Text(),
        },
        action_info=np.int64,
        reward_info=F32,
        discount_info=F32,
        step_metadata_info={"info": {"n": np.int32}},
    )


def _obs(i):
    return {"pos": np.array([i, -i], dtype=F32), "flag": bool(i % 2), "level": i, "label": f"o{i}"}


def _good_step(i):
    """(action, reward, discount, next_observation, step_metadata) of transition i."""
    return {
        "action": i,
        "reward": F32(i + 0.5),
        "discount": F32(1.0),
        "obs": _obs(i + 1),
        "meta": {"info": {"n": i + 1}},
    }


def _replace(path):
    def apply(step, value):
        node = step
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return apply


def _drop(path):
    def apply(step, value):
        node = step
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return apply


# id -> (how to break a good step, value, fragments the message must hold, TFDS rejects too)
BAD_STEPS = {
    "ndarray_of_wrong_dtype": (
        _replace(("obs", "pos")),
        np.zeros(2, dtype=np.float64),
        ["steps/observation/pos", "float32[2]", "float64[2]"],
        True,
    ),
    "wrong_shape_array": (
        _replace(("obs", "pos")),
        np.zeros((2, 1), dtype=F32),
        ["steps/observation/pos", "float32[2]", "float32[2,1]"],
        True,
    ),
    "wrong_shape_list": (
        _replace(("obs", "pos")),
        [1.0, 2.0, 3.0],
        ["steps/observation/pos", "float32[2]", "[3]"],
        True,
    ),
    "missing_key": (
        _drop(("obs", "flag")),
        None,
        ["steps/observation", "missing keys ['flag']"],
        True,
    ),
    "unexpected_key": (
        _replace(("obs", "velocity")),
        np.zeros(2, dtype=F32),
        ["steps/observation", "unexpected keys ['velocity']"],
        True,
    ),
    "none_for_a_tensor": (
        _replace(("obs", "pos")),
        None,
        ["steps/observation/pos", "float32[2]", "None"],
        True,
    ),
    # TFDS would silently store NaN for a None float scalar; a missing reward is
    # almost always a bug (dm_env's first timestep), so it is refused.
    "none_for_the_reward": (
        _replace(("reward",)),
        None,
        ["steps/reward", "float32[]", "None"],
        False,
    ),
    "str_for_a_bool": (
        _replace(("obs", "flag")),
        "False",
        ["steps/observation/flag", "bool", "str"],
        True,
    ),
    "out_of_range_for_uint8": (
        _replace(("obs", "level")),
        300,
        ["steps/observation/level", "uint8[]", "300"],
        True,
    ),
    "zero_dim_array_of_wrong_dtype_for_action": (
        _replace(("action",)),
        np.array(1, dtype=np.int32),
        ["steps/action", "int64[]", "int32[]"],
        True,
    ),
    "dict_for_a_tensor": (
        _replace(("obs", "pos")),
        {"x": 1.0},
        ["steps/observation/pos", "float32[2]", "dict"],
        True,
    ),
    "step_metadata_missing_nested_key": (
        _replace(("meta", "info")),
        {},
        ["steps/<step metadata>/info", "missing keys ['n']"],
        True,
    ),
    "non_dict_step_metadata": (
        _replace(("meta",)),
        [("info", {"n": 1})],
        ["steps/<step metadata>", "expected a dict"],
        True,
    ),
}


def _tfds_step(features, step):
    """The RLDS step TFDS's encoder would get for this transition's values."""
    out = {
        "observation": step["obs"],
        "action": step["action"],
        "reward": step["reward"],
        "discount": step["discount"],
        "is_first": False,
        "is_last": False,
        "is_terminal": False,
    }
    if isinstance(step["meta"], dict):
        out.update(step["meta"])
    else:
        out["info"] = step["meta"]
    return out


def _step_features():
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    identity = tfds.core.DatasetIdentity(
        name="errors", version=tfds.core.Version("0.0.1"), data_dir="/tmp", module_name=""
    )
    return rlds_base.build_info(_config(), identity).features["steps"].feature


def _add(backend, step):
    backend.add_step(step["action"], step["reward"], step["discount"], step["obs"], step["meta"])


@pytest.mark.parametrize("case", list(BAD_STEPS), ids=list(BAD_STEPS))
def test_bad_step_is_refused_with_field_expected_and_received(tmp_path, case):
    breaker, value, fragments, tfds_rejects = BAD_STEPS[case]
    bad = copy.deepcopy(_good_step(1))
    breaker(bad, value)

    features = _step_features()
    features.encode_example(_tfds_step(features, _good_step(1)))  # the good step is fine
    if tfds_rejects:
        with pytest.raises(Exception):  # noqa: B017 - TFDS raises various types
            features.encode_example(_tfds_step(features, bad))

    backend = rlds_writer.TFDSBackendWriter(tmp_path, _config())
    # Episode 0 finishes before the error.
    backend.begin_episode(_obs(0), {"info": {"n": 0}})
    _add(backend, _good_step(0))
    backend.end_episode(terminated=True)
    # Episode 1: a good transition, the bad one, then more good ones.
    backend.begin_episode(_obs(0), {"info": {"n": 0}})
    _add(backend, _good_step(0))
    with pytest.raises(rlds_writer.errors.StepValueError) as excinfo:
        _add(backend, bad)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    backend.flush()
    # What was finished before the error is already loadable.
    assert len(load_episodes(tmp_path)) == 1
    # The bad transition was rolled back: the writer keeps going.
    _add(backend, _good_step(1))
    _add(backend, _good_step(2))
    backend.end_episode(terminated=False)
    backend.close()

    episodes = load_episodes(tmp_path)
    assert [len(e["steps"]) for e in episodes] == [2, 4]
    assert [int(s["info"]["n"]) for s in episodes[1]["steps"]] == [0, 1, 2, 3]
    assert [int(s["action"]) for s in episodes[1]["steps"]] == [0, 1, 2, 0]
    assert [s["observation"]["label"] for s in episodes[1]["steps"]] == [b"o0", b"o1", b"o2", b"o3"]


def test_bad_first_observation_is_refused_and_the_next_episode_records(tmp_path):
    backend = rlds_writer.TFDSBackendWriter(tmp_path, _config())
    bad = _obs(0)
    bad["pos"] = np.zeros(2, dtype=np.int32)
    with pytest.raises(
        rlds_writer.errors.StepValueError, match=r"steps/observation/pos.*int32\[2\]"
    ):
        backend.begin_episode(bad, {"info": {"n": 0}})
    assert not backend.in_episode
    backend.begin_episode(_obs(5), {"info": {"n": 5}})
    backend.close()
    (episode,) = load_episodes(tmp_path)
    assert_same(episode["steps"][0]["observation"]["pos"], np.array([5, -5], dtype=F32))


def test_bad_episode_metadata_is_refused_naming_the_field(tmp_path):
    import tensorflow_datasets as tfds

    config = _config()
    config.episode_metadata_info = {"seed": np.int64, "agent": tfds.features.Text()}
    backend = rlds_writer.TFDSBackendWriter(tmp_path, config)
    backend.begin_episode(_obs(0), {"info": {"n": 0}})
    with pytest.raises(rlds_writer.errors.StepValueError, match=r"seed.*int64.*float64\[3\]"):
        backend.set_episode_metadata({"seed": np.zeros(3), "agent": "x"})
    with pytest.raises(rlds_writer.errors.StepValueError, match=r"unexpected keys \['extra'\]"):
        backend.set_episode_metadata({"seed": 1, "agent": "x", "extra": 1})
    backend.set_episode_metadata({"seed": 3, "agent": "ok"})
    backend.close()
    (episode,) = load_episodes(tmp_path)
    assert (episode["seed"], episode["agent"]) == (3, b"ok")


def test_nan_reward_is_stored_as_nan_like_tfds(tmp_path):
    config = _config()
    episode = EpisodeSpec(
        observations=[_obs(0), _obs(1), _obs(2)],
        actions=[0, 1],
        rewards=[float("nan"), np.float32("nan")],
        discounts=[1.0, 0.0],
        step_metadata=[{"info": {"n": i}} for i in range(3)],
    )
    backend = rlds_writer.TFDSBackendWriter(tmp_path, config)
    backend.begin_episode(episode.observations[0], episode.step_metadata[0])
    for t in range(2):
        backend.add_step(
            episode.actions[t],
            episode.rewards[t],
            episode.discounts[t],
            episode.observations[t + 1],
            episode.step_metadata[t + 1],
        )
    backend.end_episode(terminated=True)
    backend.close()
    (loaded,) = load_episodes(tmp_path)
    rewards = np.array([s["reward"] for s in loaded["steps"]])
    assert rewards.dtype == F32
    assert np.isnan(rewards[:2]).all() and rewards[2] == 0.0
    # TFDS's encoder turns the same input into NaN too.
    expected = _step_features().encode_example(rlds_example(config, episode)["steps"][0])
    assert np.isnan(expected["reward"])


class _TinyEnv(dm_env.Environment):
    def __init__(self):
        self.t = 0

    def reset(self):
        self.t = 0
        return dm_env.restart(np.float32(0))

    def step(self, action):
        self.t += 1
        if self.t >= 2:
            return dm_env.termination(F32(1), np.float32(self.t))
        return dm_env.transition(F32(1), np.float32(self.t))

    def observation_spec(self):
        return specs.Array((), F32)

    def action_spec(self):
        return specs.Array((), np.int64)


def test_non_dict_from_step_fn_fails_and_earlier_episodes_stay_loadable(tmp_path):
    calls = {"n": 0}

    def step_fn(timestep, action, env):
        calls["n"] += 1
        return (1, 2) if calls["n"] == 5 else {"n": calls["n"]}

    config = rlds_writer.DatasetConfig(
        name="tiny",
        observation_info=F32,
        action_info=np.int64,
        reward_info=F32,
        discount_info=F32,
        step_metadata_info={"n": np.int64},
    )
    backend = rlds_writer.TFDSBackendWriter(tmp_path, config)
    env = rlds_writer.EnvLogger(_TinyEnv(), backend, step_fn=step_fn)
    env.reset()
    env.step(0)
    env.step(0)  # episode 0 done: step_fn called 3 times
    env.reset()
    with pytest.raises(rlds_writer.errors.StepValueError, match=r"step metadata.*dict.*tuple"):
        env.step(0)
    env.flush()
    # The env moved on past the refused step: its episode was ended right there,
    # cut short, rather than left open with a hole.
    assert len(load_episodes(tmp_path)) == 2
    env.close()
    episodes = load_episodes(tmp_path)
    assert [[int(s["n"]) for s in e["steps"]] for e in episodes] == [[1, 2, 3], [4]]


def test_steps_after_close_are_refused_and_the_cut_short_episode_stays_whole(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="tiny", observation_info=F32, action_info=np.int64, reward_info=F32
    )
    env = rlds_writer.EnvLogger(_TinyEnv(), rlds_writer.TFDSBackendWriter(tmp_path, config))
    env.reset()
    env.step(0)
    env.close()
    with pytest.raises(rlds_writer.errors.WriterClosedError):
        env.step(0)
    (episode,) = load_episodes(tmp_path)
    assert [float(s["observation"]) for s in episode["steps"]] == [0.0, 1.0]


def test_step_metadata_for_a_dataset_without_any_is_refused(tmp_path):
    config = _config()
    config.step_metadata_info = {}
    backend = rlds_writer.TFDSBackendWriter(tmp_path, config)
    with pytest.raises(
        rlds_writer.errors.StepValueError, match=r"declares no step metadata.*'info'"
    ):
        backend.begin_episode(_obs(0), {"info": {"n": 0}})
    backend.begin_episode(_obs(0))
    backend.close()
    assert len(load_episodes(tmp_path)) == 1


_CAST_DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32]
_CAST_INPUTS = {
    "py_int": 3,
    "py_negative_int": -2,
    "py_big_int": 2**40,
    "py_float": 2.75,
    "py_bool": True,
    "np_float64_scalar": np.float64(1.5),
    "np_int32_scalar": np.int32(7),
    "np_bool_scalar": np.True_,
    "numeric_string": "3",
    "zero_d_array_float64": np.array(1.5),
}


def _cast_with_tfds(feature, value):
    try:
        return True, feature.encode_example(value)
    except Exception:  # noqa: BLE001 - TFDS raises several types
        return False, None


@pytest.mark.parametrize("dtype", _CAST_DTYPES, ids=lambda d: np.dtype(d).name)
def test_scalar_casting_accepts_and_rejects_exactly_like_tfds(dtype):
    import warnings

    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    from rlds_writer.record import episode as steps
    from rlds_writer.store.features import field_specs

    config = rlds_writer.DatasetConfig(name="cast", observation_info=dtype)
    identity = tfds.core.DatasetIdentity(
        name="cast", version=tfds.core.Version("0.0.1"), data_dir="/tmp/unused", module_name=""
    )
    features = rlds_base.build_info(config, identity).features
    feature = features["steps"]["observation"]
    layout = steps.StepFields(field_specs.compile_fields(features))
    for name, value in _CAST_INPUTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tfds_ok, expected = _cast_with_tfds(feature, value)
        buffer = layout.new_buffer()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's overflow warning, as in TFDS
            try:
                buffer.start(value)
                ours_ok = True
            except rlds_writer.errors.StepValueError as e:
                ours_ok = False
                assert "steps/observation" in str(e)
            assert ours_ok == tfds_ok, (
                f"{name}: TFDS {'accepts' if tfds_ok else 'rejects'} {value!r}"
            )
            if ours_ok:
                got = buffer.finish(terminated=False).columns["steps/observation"][0]
                assert_same(got, np.asarray(expected))


@pytest.mark.parametrize("fn", ["step_fn", "episode_fn"])
def test_user_fn_returning_a_non_dict_is_refused_naming_the_option(tmp_path, fn):
    import gymnasium as gym

    from rlds_writer.errors import StepValueError

    env = rlds_writer.RecordRLDS(
        gym.make("CartPole-v1"), tmp_path / "ds", **{fn: lambda *args: [1, 2]}
    )
    with pytest.raises(StepValueError, match=rf"{fn} must return a dict or None, got list"):
        env.reset(seed=0)
    env.close()
