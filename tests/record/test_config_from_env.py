"""`config_from_env` turns dm_env specs into TFDS features; recording with them round-trips."""

from __future__ import annotations

import dm_env
import numpy as np
import pytest
from dm_env import specs
from helpers_core import NUMERIC_DTYPES as NUMERIC
from helpers_core import assert_same, load_episodes

import rlds_writer


def _observation_spec():
    return {
        "pixels": specs.Array((6, 5, 3), np.uint8, name="pixels"),
        "state": specs.BoundedArray((3,), np.float32, minimum=-1.0, maximum=1.0),
        "nested": {"count": specs.Array((), np.int32), "flags": specs.Array((2,), np.bool_)},
        "pair": (specs.Array((), np.float64), specs.Array((2,), np.int16)),
        "name": specs.StringArray(()),
        "small_u8": specs.Array((4,), np.uint8),
        "all": {np.dtype(d).name: specs.Array((2,), d) for d in NUMERIC},
    }


def _action_spec():
    return [specs.DiscreteArray(4), specs.BoundedArray((2,), np.float32, -1.0, 1.0)]


def _value(spec, t):
    """A deterministic value for a spec (or nest of specs) at step t."""
    if isinstance(spec, dict):
        return {k: _value(v, t) for k, v in spec.items()}
    if isinstance(spec, list | tuple):
        return type(spec)(_value(v, t) for v in spec)
    if isinstance(spec, specs.StringArray):
        return f"step {t} ✓"
    dtype = np.dtype(spec.dtype)
    size = int(np.prod(spec.shape, dtype=np.int64))
    if dtype.kind == "b":
        flat = (np.arange(size) + t) % 2 == 0
    elif isinstance(spec, specs.DiscreteArray):
        flat = np.array([t % spec.num_values])
    elif isinstance(spec, specs.BoundedArray):
        flat = np.linspace(-1, 1, size) * (1 / (t + 1))
    else:
        flat = (np.arange(size) * 7 + t) % 100 - (50 if dtype.kind in "if" else 0)
        if dtype.kind == "f":
            flat = flat / 4  # exact in every float dtype
    return flat.astype(dtype).reshape(spec.shape)


class SpecsEnv(dm_env.Environment):
    """A dm_env env whose timesteps fill its specs with deterministic values."""

    def __init__(self, length=3):
        self.length = length
        self.t = 0

    def reset(self):
        self.t = 0
        return dm_env.restart(_value(self.observation_spec(), 0))

    def step(self, action):
        self.t += 1
        obs = _value(self.observation_spec(), self.t)
        reward = np.float32(self.t / 2)
        if self.t >= self.length:
            return dm_env.termination(reward, obs)
        return dm_env.transition(reward, obs, discount=np.float32(0.5))

    def observation_spec(self):
        return _observation_spec()

    def action_spec(self):
        return _action_spec()

    def reward_spec(self):
        return specs.Array((), np.float32)

    def discount_spec(self):
        return specs.BoundedArray((), np.float32, 0.0, 1.0)


def _encoding(feature):
    return feature._encoding.value  # TFDS keeps no public getter


def test_config_from_env_maps_every_spec_kind_to_the_right_feature():
    import tensorflow_datasets as tfds

    config = rlds_writer.config_from_env(SpecsEnv(), "specs")
    obs = config.observation_info
    pixels = obs["pixels"]
    # The default changed from a bytes-encoded Tensor to a PNG Image (issue 12).
    assert isinstance(pixels, tfds.features.Image)
    assert (pixels.shape, pixels.np_dtype, pixels.encoding_format) == ((6, 5, 3), np.uint8, "png")
    assert (obs["state"].shape, obs["state"].np_dtype) == ((3,), np.float32)
    assert _encoding(obs["state"]) == "none"
    assert obs["nested"]["count"].shape == () and obs["nested"]["count"].np_dtype == np.int32
    assert obs["nested"]["flags"].np_dtype == np.bool_
    assert sorted(obs["pair"]) == ["0", "1"]
    assert obs["pair"]["1"].shape == (2,) and obs["pair"]["1"].np_dtype == np.int16
    assert isinstance(obs["name"], tfds.features.Text)
    # Only rank-3 uint8 arrays are images.
    assert _encoding(obs["small_u8"]) == "none"
    for dtype in NUMERIC:
        feature = obs["all"][np.dtype(dtype).name]
        assert (feature.shape, np.dtype(feature.np_dtype)) == ((2,), np.dtype(dtype))
    action = config.action_info
    assert sorted(action) == ["0", "1"]
    assert (action["0"].shape, action["0"].np_dtype) == ((), np.int32)  # DiscreteArray default
    assert (action["1"].shape, action["1"].np_dtype) == ((2,), np.float32)
    assert config.reward_info.np_dtype == np.float32 and config.reward_info.shape == ()
    assert config.discount_info.np_dtype == np.float32
    assert config.name == "specs"


@pytest.mark.parametrize("encoding", ["bytes", "zlib", "none"])
def test_image_encoding_can_be_changed(encoding):
    config = rlds_writer.config_from_env(SpecsEnv(), "specs", image_encoding=encoding)
    assert _encoding(config.observation_info["pixels"]) == encoding


def test_metadata_infos_and_config_fields_pass_through():
    import tensorflow_datasets as tfds

    config = rlds_writer.config_from_env(
        SpecsEnv(),
        "specs",
        step_metadata_info={"ts": np.int64},
        episode_metadata_info={"seed": np.int64, "who": tfds.features.Text()},
        description="d",
    )
    assert config.step_metadata_info == {"ts": np.int64}
    assert sorted(config.episode_metadata_info) == ["seed", "who"]
    assert config.description == "d"


def test_unsupported_specs_raise_spec_error_naming_the_path():
    with pytest.raises(rlds_writer.errors.SpecError, match="observation/bad"):
        rlds_writer.record.feature_from_spec(
            {"bad": specs.Array((2,), np.complex64)}, "observation"
        )
    with pytest.raises(rlds_writer.errors.SpecError, match="observation/odd"):
        rlds_writer.record.feature_from_spec({"odd": object()}, "observation")


def test_recording_an_env_built_from_its_specs_round_trips(tmp_path):
    env = SpecsEnv(length=3)
    actions = [[1, np.array([0.5, -0.5], np.float32)], (3, [0.25, 1.0]), [0, (-1.0, 0.0)]]
    with rlds_writer.EnvLogger(env, data_directory=str(tmp_path), name="specs") as logged:
        logged.reset()
        for action in actions:
            logged.step(action)
    (episode,) = load_episodes(tmp_path)
    steps = episode["steps"]
    assert len(steps) == 4

    def as_stored(value):
        """What TFDS gives back: dicts keyed by index, text as bytes."""
        if isinstance(value, dict):
            return {k: as_stored(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return {str(i): as_stored(v) for i, v in enumerate(value)}
        if isinstance(value, str):
            return value.encode()
        return value

    for t, step in enumerate(steps):
        assert_same(step["observation"], as_stored(_value(_observation_spec(), t)))
    expected_actions = [
        {"0": np.int32(1), "1": np.array([0.5, -0.5], np.float32)},
        {"0": np.int32(3), "1": np.array([0.25, 1.0], np.float32)},
        {"0": np.int32(0), "1": np.array([-1.0, 0.0], np.float32)},
        {"0": np.int32(0), "1": np.zeros(2, np.float32)},
    ]
    assert_same([s["action"] for s in steps], expected_actions)
    assert_same(np.array([s["reward"] for s in steps]), np.array([0.5, 1.0, 1.5, 0.0], np.float32))
    assert_same(
        np.array([s["discount"] for s in steps]), np.array([0.5, 0.5, 0.0, 0.0], np.float32)
    )
    assert [bool(s["is_terminal"]) for s in steps] == [False, False, False, True]
