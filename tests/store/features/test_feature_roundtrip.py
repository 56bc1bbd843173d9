"""Every feature kind decodes, through TFDS, to what TFDS's own writer produces.

Each test records the same random episodes twice: through rlds_writer's
recorder API and through TFDS's own path (`FeaturesDict.encode_example` +
`ExampleSerializer` inside `tfds.core.SequentialWriter`, with the features of
`tfds.rlds.rlds_base.build_info`). Both directories are loaded with
`tfds.builder_from_directory(...).as_dataset()` and must decode to identical
values, dtypes and shapes.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers_core import (
    NUMERIC_DTYPES,
    EpisodeSpec,
    assert_same,
    load_episodes,
    random_episodes,
    write_with_rlds_writer,
    write_with_tfds,
)

import rlds_writer


def _tfds():
    import tensorflow_datasets as tfds

    return tfds


def _config(observation_info, **kwargs):
    kwargs.setdefault("action_info", np.int64)
    kwargs.setdefault("reward_info", np.float32)
    kwargs.setdefault("discount_info", np.float32)
    return rlds_writer.DatasetConfig(name="roundtrip", observation_info=observation_info, **kwargs)


def _roundtrip(tmp_path, config, episodes, **backend_kwargs):
    """Writes episodes both ways; returns (ours, tfds's) loaded episodes."""
    write_with_rlds_writer(tmp_path / "ours", config, episodes, **backend_kwargs)
    write_with_tfds(tmp_path / "tfds", config, episodes)
    ours = load_episodes(tmp_path / "ours")
    reference = load_episodes(tmp_path / "tfds")
    assert len(ours) == len(episodes)
    assert_same(ours, reference)
    return ours, reference


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numeric_tensor_and_scalar_roundtrip_like_tfds(tmp_path, dtype):
    tfds = _tfds()
    config = _config(
        {
            "tensor": tfds.features.Tensor(shape=(2, 3), dtype=dtype),
            "scalar": tfds.features.Scalar(dtype=dtype),
            "plain": dtype,  # a bare dtype is a scalar Tensor
        },
        action_info=tfds.features.Tensor(shape=(2,), dtype=dtype),
        step_metadata_info={"meta": tfds.features.Tensor(shape=(3,), dtype=dtype)},
        episode_metadata_info={"ep": tfds.features.Tensor(shape=(2, 2), dtype=dtype)},
    )
    rng = np.random.default_rng(list(np.dtype(dtype).name.encode()))
    ours, _ = _roundtrip(tmp_path, config, random_episodes(config, rng))
    # Decoded with the feature's own dtype, and exact for every dtype but float64.
    step = ours[2]["steps"][1]
    assert step["observation"]["tensor"].dtype == np.dtype(dtype)
    if np.dtype(dtype) != np.float64:
        episodes = random_episodes(
            config, np.random.default_rng(list(np.dtype(dtype).name.encode()))
        )
        assert_same(step["observation"]["tensor"], episodes[2].observations[1]["tensor"])


def test_float64_is_stored_with_float32_precision_like_tfds(tmp_path):
    config = _config({"x": np.float64}, reward_info=np.float64, discount_info=np.float64)
    values = [0.1, 1 / 3, 1e-30, 123456789.123456789]
    episode = EpisodeSpec(
        observations=[{"x": v} for v in values],
        actions=[0, 1, 2],
        rewards=values[1:],
        discounts=[1.0, 1.0, 0.0],
    )
    ours, _ = _roundtrip(tmp_path, config, [episode])
    got = np.array([s["observation"]["x"] for s in ours[0]["steps"]])
    assert got.dtype == np.float64
    assert_same(got, np.array(values, dtype=np.float32).astype(np.float64))


@pytest.mark.parametrize("encoding", ["bytes", "zlib"])
def test_encoded_tensors_roundtrip_like_tfds_and_keep_float64(tmp_path, encoding):
    tfds = _tfds()

    def enc(shape, dtype):
        return tfds.features.Tensor(shape=shape, dtype=dtype, encoding=encoding)

    config = _config(
        {
            "pixels": enc((4, 5, 3), np.uint8),
            "f64": enc((2, 2), np.float64),
            "i16": enc((3,), np.int16),
            "flags": enc((2,), np.bool_),
            "scalar": enc((), np.float32),
            "u64": enc((2,), np.uint64),
        },
        step_metadata_info={"meta": enc((2,), np.int64)},
        episode_metadata_info={"ep": enc((3,), np.float64)},
    )
    episodes = random_episodes(config, np.random.default_rng(7))
    ours, _ = _roundtrip(tmp_path, config, episodes)
    # Encoded float64 keeps all 64 bits.
    assert_same(ours[2]["steps"][3]["observation"]["f64"], episodes[2].observations[3]["f64"])
    assert_same(ours[1]["ep"], episodes[1].episode_metadata["ep"])


def test_images_png_and_jpeg_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config(
        {
            "png": tfds.features.Image(shape=(8, 6, 3)),
            "jpeg": tfds.features.Image(shape=(8, 8, 3), encoding_format="jpeg"),
            "gray": tfds.features.Image(shape=(5, 5, 1)),
            "any_size": tfds.features.Image(shape=(None, None, 3)),
        },
        step_metadata_info={"thumb": tfds.features.Image(shape=(4, 4, 1))},
        episode_metadata_info={"cover": tfds.features.Image(shape=(3, 3, 3))},
    )
    episodes = random_episodes(config, np.random.default_rng(3))
    ours, _ = _roundtrip(tmp_path, config, episodes, image_workers=2)
    # PNG is lossless: the exact pixels come back.
    assert_same(ours[2]["steps"][2]["observation"]["png"], episodes[2].observations[2]["png"])
    assert_same(ours[2]["steps"][1]["thumb"], episodes[2].step_metadata[1]["thumb"])


def test_images_encoded_on_the_env_thread_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config({"png": tfds.features.Image(shape=(4, 4, 3))})
    episodes = random_episodes(config, np.random.default_rng(4), lengths=(1, 5))
    _roundtrip(tmp_path, config, episodes, image_workers=0)


def test_text_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config(
        {"text": tfds.features.Text(), "n": np.int32},
        action_info=tfds.features.Text(),
        step_metadata_info={"note": tfds.features.Text()},
        episode_metadata_info={"title": tfds.features.Text()},
    )
    episodes = random_episodes(config, np.random.default_rng(5))
    # bytes are accepted as well as str.
    episodes[2].observations[0]["text"] = "bytes ü".encode()
    episodes[2].observations[1]["text"] = ""
    ours, _ = _roundtrip(tmp_path, config, episodes)
    assert ours[2]["steps"][0]["observation"]["text"] == "bytes ü".encode()


def test_nested_dicts_in_observation_and_step_metadata_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config(
        {
            "a": {
                "b": {"c": tfds.features.Tensor(shape=(2,), dtype=np.float32)},
                "d": tfds.features.Text(),
            },
            "e": tfds.features.Tensor(shape=(2, 2, 3), dtype=np.uint8, encoding="bytes"),
            "f": tfds.features.Image(shape=(4, 4, 3)),
        },
        action_info={"move": np.int32, "aim": {"dx": np.float32, "dy": np.float32}},
        step_metadata_info={
            "info": {"x": np.int64, "y": {"z": tfds.features.Text(), "w": np.bool_}},
            "timestamp": np.float64,
        },
    )
    _roundtrip(tmp_path, config, random_episodes(config, np.random.default_rng(6)))


def test_episode_metadata_of_every_kind_roundtrips_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config(
        np.float32,
        episode_metadata_info={
            "seed": np.int64,
            "score": np.float32,
            "precise": np.float64,
            "ok": np.bool_,
            "agent": tfds.features.Text(),
            "vec": tfds.features.Tensor(shape=(3,), dtype=np.float32),
            "blob": tfds.features.Tensor(shape=(2, 2), dtype=np.int32, encoding="zlib"),
            "nested": {"a": np.uint8, "b": {"c": tfds.features.Text()}},
            "outcome": tfds.features.ClassLabel(names=["lost", "won", "draw"]),
            "ids": tfds.features.Tensor(shape=(None,), dtype=np.int64),
        },
    )
    _roundtrip(tmp_path, config, random_episodes(config, np.random.default_rng(8)))


def test_class_label_and_other_fallback_kinds_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config(
        {
            "label": tfds.features.ClassLabel(names=["cat", "dog", "bird"]),
            # Per-step unknown dimensions need an encoding to be readable by TFDS.
            "ragged": tfds.features.Tensor(shape=(None,), dtype=np.float32, encoding="zlib"),
            "ragged_bytes": tfds.features.Tensor(shape=(None, 2), dtype=np.int16, encoding="bytes"),
            "strings": tfds.features.Tensor(shape=(2,), dtype=np.object_),
        },
        action_info=tfds.features.ClassLabel(num_classes=4),
        step_metadata_info={"tag": tfds.features.ClassLabel(names=["x", "y"])},
    )
    ours, _ = _roundtrip(tmp_path, config, random_episodes(config, np.random.default_rng(9)))
    assert ours[2]["steps"][3]["action"] == 0  # final step's action: zero of the label


def test_values_given_as_python_scalars_and_lists_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    config = _config(
        {
            "vec": tfds.features.Tensor(shape=(3,), dtype=np.float32),
            "count": np.int64,
            "flag": np.bool_,
            "small": np.uint8,
        },
        reward_info=np.float32,
        discount_info=np.float32,
    )
    observations = [
        {"vec": [1, 2.5, -3], "count": 7, "flag": True, "small": 255},
        {"vec": (0.1, 0.2, 0.3), "count": np.int32(-4), "flag": np.True_, "small": np.int64(3)},
        {"vec": np.array([1e30, -1e-30, 0], dtype=np.float32), "count": 2.9, "flag": 0, "small": 0},
    ]
    episode = EpisodeSpec(
        observations=observations,
        actions=[1, np.int64(2)],
        rewards=[np.float64(0.1), 1],  # float64 scalar and int for a float32 reward
        discounts=[1.0, np.float64(0.99)],
    )
    _roundtrip(tmp_path, config, [episode])


def test_long_episodes_and_python_episode_metadata_roundtrip_like_tfds(tmp_path):
    tfds = _tfds()
    # Columns start small and grow: episodes of 1, 33, 70 and 130 steps cross that.
    config = _config(
        {
            "pixels": tfds.features.Tensor(shape=(3, 3, 3), dtype=np.uint8, encoding="bytes"),
            "state": tfds.features.Tensor(shape=(4,), dtype=np.float32),
            "note": tfds.features.Text(),
            "label": tfds.features.ClassLabel(num_classes=3),
        },
        reward_info={"task": np.float32, "bonus": tfds.features.Tensor(shape=(2,), dtype=np.int16)},
        discount_info={"task": np.float32, "bonus": np.float64},
        step_metadata_info={"t": np.int64},
        episode_metadata_info={
            "seed": np.int64,
            "ret": np.float32,
            "ok": np.bool_,
            "who": tfds.features.Text(),
            "vec": tfds.features.Tensor(shape=(2,), dtype=np.int32),
        },
    )
    episodes = random_episodes(config, np.random.default_rng(12), lengths=(1, 33, 70, 130))
    for i, episode in enumerate(episodes):
        # Python values, as an episode_fn would return them.
        episode.episode_metadata = {
            "seed": i,
            "ret": 1.5 * i,
            "ok": bool(i % 2),
            "who": f"agent {i}",
            "vec": [i, -i],
        }
    ours, _ = _roundtrip(tmp_path, config, episodes)
    assert [len(e["steps"]) for e in ours] == [1, 33, 70, 130]


def test_float64_precision_warning_is_logged_once(tmp_path, caplog):
    tfds = _tfds()
    config = _config(
        {"a": np.float64, "b": tfds.features.Tensor(shape=(2,), dtype=np.float64)},
        reward_info=np.float64,
    )
    with caplog.at_level(logging.WARNING, logger="rlds_writer"):
        with rlds_writer.TFDSBackendWriter(tmp_path / "lossy", config) as backend:
            for _ in range(3):
                backend.begin_episode({"a": 0.1, "b": [0.1, 0.2]})
                backend.add_step(0, 0.1, 1.0, {"a": 0.3, "b": [0.1, 0.2]})
                backend.end_episode(terminated=True)
    warnings = [r for r in caplog.records if "float64" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    for key in ("steps/observation/a", "steps/observation/b", "steps/reward"):
        assert key in message
    assert "encoding" in message  # it says how to keep the precision


def test_no_float64_warning_when_float64_is_bytes_encoded(tmp_path, caplog):
    tfds = _tfds()
    config = _config(
        {"a": tfds.features.Tensor(shape=(), dtype=np.float64, encoding="bytes")},
        reward_info=np.float32,
    )
    with caplog.at_level(logging.WARNING, logger="rlds_writer"):
        rlds_writer.TFDSBackendWriter(tmp_path / "exact", config).close()
    assert not [r for r in caplog.records if "float64" in r.getMessage()]


def test_per_step_tensor_with_unknown_dimension_is_refused_before_writing(tmp_path):
    tfds = _tfds()
    # TFDS's SequentialWriter writes this, but builder_from_directory cannot read it.
    config = _config({"ragged": tfds.features.Tensor(shape=(None,), dtype=np.float32)})
    with pytest.raises(
        rlds_writer.errors.SpecError, match=r"steps/observation/ragged.*encoding='zlib'"
    ):
        rlds_writer.TFDSBackendWriter(tmp_path, config)
    assert not list(tmp_path.iterdir())


def _tfds_bytes(config, episode):
    """TFDS's own serialized episode, and the dataset's features."""
    import tensorflow_datasets as tfds
    from helpers_core import rlds_example
    from tensorflow_datasets.core import example_serializer
    from tensorflow_datasets.rlds import rlds_base

    identity = tfds.core.DatasetIdentity(
        name="x", version=tfds.core.Version("0.0.1"), data_dir="/tmp/unused", module_name=""
    )
    features = rlds_base.build_info(config, identity).features
    serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
    return features, serializer.serialize_example(
        features.encode_example(rlds_example(config, episode))
    )


def test_per_step_tensor_with_a_zero_sized_dimension_is_refused(tmp_path):
    tfds = _tfds()
    config = _config({"empty": tfds.features.Tensor(shape=(0, 2), dtype=np.float32)})
    # TFDS writes it, but cannot parse it back (TensorFlow's parser even dies on
    # it with SIGFPE, so only the numpy parser is tried here).
    episode = EpisodeSpec(
        observations=[{"empty": np.zeros((0, 2), np.float32)}] * 2,
        actions=[0],
        rewards=[0.0],
        discounts=[1.0],
    )
    features, data = _tfds_bytes(config, episode)
    with pytest.raises(ValueError, match="reshape"):
        features.deserialize_example_np(data)
    with pytest.raises(rlds_writer.errors.SpecError, match=r"steps/observation/empty.*zero-sized"):
        rlds_writer.TFDSBackendWriter(tmp_path, config)
    # Encoded, or at the episode level, a zero-sized tensor is fine.
    fine = _config(
        {"empty": tfds.features.Tensor(shape=(0, 2), dtype=np.float32, encoding="bytes")},
        episode_metadata_info={"none_yet": tfds.features.Tensor(shape=(0,), dtype=np.int64)},
    )
    _roundtrip(tmp_path, fine, random_episodes(fine, np.random.default_rng(11)))


def test_uint32_tensor_with_an_encoding_is_refused(tmp_path):
    tfds = _tfds()
    config = _config({"ids": tfds.features.Tensor(shape=(2,), dtype=np.uint32, encoding="zlib")})
    episode = EpisodeSpec(
        observations=[{"ids": np.array([1, 2], np.uint32)}],
        actions=[],
        rewards=[],
        discounts=[],
    )
    features, data = _tfds_bytes(config, episode)
    with pytest.raises(TypeError, match="uint32"):  # TFDS's as_dataset decoding path
        features.deserialize_example(data)
    with pytest.raises(
        rlds_writer.errors.SpecError, match=r"steps/observation/ids.*uint32.*'zlib'"
    ):
        rlds_writer.TFDSBackendWriter(tmp_path, config)
