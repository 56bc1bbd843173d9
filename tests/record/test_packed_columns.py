"""Small numeric columns leave the episode buffer as their packed wire payload.

A float32 column is handed to the encoder as its little-endian bytes, and an
integer or bool column whose values all lie in [0, 128) as one byte per value
(`store.episodes.episode_data.PackedColumn`); everything else as arrays, as before.
These tests check both forms: the record is the `tf.train.Example` TFDS's own
encoder and serializer make of the same episode, on the packed path and on
every way off it (ints of 128 and above, negative ints, a float32 reward out
of range, float64 and int32 fields), and the packed columns give their values
to numpy.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import EpisodeSpec, rlds_example

import rlds_writer
from rlds_writer.store.episodes.episode_data import PackedColumn


def _config() -> rlds_writer.DatasetConfig:
    return rlds_writer.DatasetConfig(
        name="packed",
        observation_info={
            "grid": tfds.features.Tensor(shape=(2, 3), dtype=np.float32),
            "ids": tfds.features.Tensor(shape=(2,), dtype=np.int64),
        },
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float64,
        step_metadata_info={"flag": np.bool_, "count": np.int32},
    )


def _features(config: rlds_writer.DatasetConfig):
    from tensorflow_datasets.rlds import rlds_base

    identity = tfds.core.DatasetIdentity(
        name="packed", version=tfds.core.Version("0.0.1"), data_dir="/tmp/unused", module_name=""
    )
    return rlds_base.build_info(config, identity).features


def _episode(
    actions: list, rewards: list, counts: list, discounts: list | None = None
) -> EpisodeSpec:
    n = len(actions) + 1
    observations = [
        {"grid": np.full((2, 3), t / 3, np.float32), "ids": np.array([t, 2 * t], np.int64)}
        for t in range(n)
    ]
    return EpisodeSpec(
        observations=observations,
        actions=actions,
        rewards=rewards,
        discounts=discounts or [1.0] * (n - 1),
        step_metadata=[{"flag": t % 2 == 0, "count": counts[t]} for t in range(n)],
        terminated=True,
    )


def _finish(features, episode: EpisodeSpec):
    from rlds_writer.record import episode as steps
    from rlds_writer.store.writing import encoding

    encoder = encoding.EpisodeEncoder(features)
    buffer = steps.StepFields(encoder.fields, empty_dicts=encoder.empty_dicts).new_buffer()
    meta = episode.step_metadata
    buffer.start(episode.observations[0], meta[0])
    for t, action in enumerate(episode.actions):
        reward, discount = episode.rewards[t], episode.discounts[t]
        buffer.add(action, reward, discount, episode.observations[t + 1], meta[t + 1])
    return encoder, buffer.finish(episode.terminated)


# Signalling NaNs: float32 0x7f800001 and 0xffa0000a, float16 0x7c01, float64 0x7ff0000000000001.
_SNAN32 = list(np.frombuffer(bytes.fromhex("0100807f0a00a0ff"), np.float32))
_SNAN16 = np.frombuffer(bytes.fromhex("017c"), np.float16)[0]
_SNAN64 = float(np.frombuffer(bytes.fromhex("010000000000f07f"), np.float64)[0])
_NANS = [*_SNAN32, _SNAN16, _SNAN64, np.float64(_SNAN64)]


def _with_grid_value(episode: EpisodeSpec, value: np.float32) -> EpisodeSpec:
    """The episode with `value` in one cell of its second observation's grid."""
    grid = episode.observations[1]["grid"].copy()
    grid[1, 2] = value  # numpy's item assignment keeps the bits
    episode.observations[1] = {**episode.observations[1], "grid": grid}
    return episode


EPISODES = {
    "packed": _episode([0, 1, 2, 127], [0.5, -1.25, 3.0, 1e-3], [0, 5, 127, 1, 2]),
    "action 128 and up": _episode([1, 128, 300, 2**40], [0.5] * 4, [0, 1, 2, 3, 4]),
    "action 128 alone": _episode([1, 128, 2, 3], [0.5] * 4, [0, 1, 2, 3, 4]),
    "negative action": _episode([1, -1, -(2**63), 2**63 - 1], [0.5] * 4, [0, -7, 2, 3, 4]),
    "reward beyond float32": _episode([1, 2], [1e300, np.float32(2.5)], [0, 1, 200]),
    "numpy scalars": _episode([np.int64(3), np.int32(4)], [np.float32(0.5), 2], [1, 2, 3]),
    # After a float, values the float32 cast rounds (np.int64 straight, as
    # TFDS, not through a double), an int it holds exactly, and others.
    "reward types": _episode(
        [1] * 7,
        [0.5, np.int64(2**60 + 2**36 + 1), 2**24, np.float64(0.1), np.float16(0.3), -0.0, True],
        [0] * 8,
    ),
    # numpy (and TFDS) keep an np.float32's or np.float16's signalling NaN one in
    # a float32 column, whatever comes first; a float64 column gets it quieted.
    "signalling NaNs after a float": _episode(
        [1] * 6, [0.5, *_NANS], [0] * 7, discounts=[0.25, *_NANS]
    ),
    "signalling NaNs first": _episode([1] * 5, [*_NANS], [0] * 6, discounts=[*_NANS]),
    "a signalling NaN in an array": _with_grid_value(
        _episode([1] * 3, [0.5] * 3, [0] * 4), _SNAN32[1]
    ),
    # The ints a double holds: numpy casts them (float32 inf past its range).
    "ints a double holds": _episode(
        [1] * 4, [0.5, 2**1024 - 2**970 - 1, 2**200, -(2**100)], [0] * 5
    ),
}


@pytest.mark.parametrize("pure_python", [False, True], ids=["c", "python"])
@pytest.mark.parametrize("name", EPISODES)
def test_records_are_the_example_tfds_serializes(name, pure_python, monkeypatch):
    from tensorflow_datasets.core import example_serializer

    from rlds_writer.record import step_kernel

    if pure_python:  # scalar columns of Python numbers, cast at the episode's end
        monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
    elif not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    config = _config()
    features = _features(config)
    episode = EPISODES[name]
    # 1e300 is float32 inf, in TFDS too; a signalling NaN's cast is "invalid".
    with np.errstate(over="ignore", invalid="ignore"):
        encoder, finished = _finish(features, episode)
    try:
        ours = encoder.encode(finished.columns, finished.episode_values)
    finally:
        encoder.close()
    serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = serializer.serialize_example(
            features.encode_example(rlds_example(config, episode))
        )
    import tensorflow as tf

    # The same message (map entries may come in another order than TFDS's), field
    # by field as bytes: a NaN is unequal to itself, and its bits are the point.
    ours, theirs = tf.train.Example.FromString(ours), tf.train.Example.FromString(theirs)
    assert ours.features.feature.keys() == theirs.features.feature.keys()
    for key, feature in theirs.features.feature.items():
        assert ours.features.feature[key].SerializeToString() == feature.SerializeToString(), key


@pytest.mark.skipif(sys.byteorder != "little", reason="packed float32 is little-endian")
def test_small_numeric_columns_are_handed_over_packed_and_read_as_arrays():
    config = _config()
    encoder, finished = _finish(_features(config), EPISODES["packed"])
    encoder.close()
    columns = finished.columns
    packed = {k for k, v in columns.items() if type(v) is PackedColumn}
    assert packed == {
        "steps/observation/grid",
        "steps/action",
        "steps/reward",
        "steps/flag",
        "steps/count",
        "steps/is_first",
        "steps/is_last",
        "steps/is_terminal",
    }
    # float64 is stored as float32 and int64 rows as varints: arrays, as before.
    assert isinstance(columns["steps/discount"], np.ndarray)
    assert isinstance(columns["steps/observation/ids"], np.ndarray)
    grid = np.asarray(columns["steps/observation/grid"])
    assert grid.dtype == np.float32 and grid.shape == (5, 2, 3)
    np.testing.assert_array_equal(grid[4], np.full((2, 3), 4 / 3, np.float32))
    np.testing.assert_array_equal(np.asarray(columns["steps/action"]), [0, 1, 2, 127, 0])
    assert np.asarray(columns["steps/action"]).dtype == np.int64
    np.testing.assert_array_equal(
        np.asarray(columns["steps/reward"]), np.float32([0.5, -1.25, 3.0, 1e-3, 0])
    )
    assert columns["steps/count"][2] == 127
    assert np.asarray(columns["steps/flag"]).tolist() == [True, False, True, False, True]
    assert np.asarray(columns["steps/is_terminal"]).tolist() == [False] * 4 + [True]
    assert len(columns["steps/action"]) == 5


def test_an_action_of_128_is_not_packed():
    config = _config()
    encoder, finished = _finish(_features(config), EPISODES["action 128 and up"])
    encoder.close()
    action = finished.columns["steps/action"]
    assert not isinstance(action, PackedColumn)
    np.testing.assert_array_equal(action, [1, 128, 300, 2**40, 0])


@pytest.mark.parametrize("pure_python", [False, True], ids=["c", "python"])
@pytest.mark.parametrize("name", ["signalling NaNs after a float", "signalling NaNs first"])
def test_a_signalling_nans_column_holds_the_bits_tfds_encode_example_gives(
    name, pure_python, monkeypatch
):
    """Both steps, whatever value comes first, hold numpy's cast, as TFDS's
    `encode_example` gives it (an np.float32's bits: still signalling); the
    record (above) holds what TFDS's serializer makes of it (quieted)."""
    from rlds_writer.record import step_kernel

    if pure_python:
        monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
    elif not step_kernel.available():
        pytest.skip("the C step is not built (no C compiler at install)")
    config = _config()
    features = _features(config)
    episode = EPISODES[name]
    with np.errstate(invalid="ignore"):
        encoder, finished = _finish(features, episode)
        theirs = features.encode_example(rlds_example(config, episode))["steps"]
    encoder.close()
    for key in ("reward", "discount"):
        assert all(type(v) is np.ndarray for v in theirs[key])  # each step's, cast
        want = np.stack(theirs[key])
        ours = np.asarray(finished.columns[f"steps/{key}"])
        assert ours.dtype == want.dtype
        assert ours.tobytes().hex() == want.tobytes().hex(), key
    assert _SNAN32[0].tobytes() in np.stack(theirs["reward"]).tobytes()  # still signalling
