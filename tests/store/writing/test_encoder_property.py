"""Property test: TFDS decodes our encoder's bytes to what it decodes from its own.

Hypothesis draws random RLDS dataset configs (numeric dtypes, shapes up to rank
3, encodings none/bytes/zlib, text, nested and empty dicts in every slot, and
now and then a PNG image (uint8, uint16, float32) or a class label), with or
without a reward and a discount, and random episodes. Each episode goes
through rlds_writer's `EpisodeBuffer` +
`EpisodeEncoder` on one side and TFDS's `FeaturesDict.encode_example` +
`ExampleSerializer` on the other; both serialized `tf.train.Example`s are
decoded by TFDS, with its TensorFlow parser (what `as_dataset` uses) and its
numpy parser (what `as_data_source` uses), and must be identical; our TF-free
reader, reading the `features.json` TFDS writes for the config, must decode
them to the same values too.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers_core import EpisodeSpec, assert_same, random_episodes, rlds_example
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlds_writer

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
]
NAMES = st.sampled_from(["a", "b", "obs", "x_1", "Ünï", "deep"])


@st.composite
def tensor_specs(draw, min_dim=1):
    """('tensor', dtype, shape, encoding), ('text',), ('image', h, w, c) or ('label', n).

    Specs that TFDS writes but cannot read back, and that rlds_writer refuses
    (tested in test_feature_roundtrip), are not drawn: zero-sized dimensions
    in per-step tensors and uint32 tensors with an encoding.
    """
    kind = draw(st.integers(0, 15))
    if kind < 2:
        return ("text",)
    if kind == 2:  # PNG images of every dtype and channel count TFDS allows
        dtype = draw(st.sampled_from(["uint8", "uint16", "float32"]))
        channels = {"uint8": [1, 3], "uint16": [1, 3, 4], "float32": [1]}[dtype]
        channels = draw(st.sampled_from(channels))
        return ("image", draw(st.integers(1, 4)), draw(st.integers(1, 4)), channels, dtype)
    if kind == 3:
        return ("label", draw(st.integers(1, 5)))
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(min_dim, 3), max_size=3)))
    encoding = (
        "none" if dtype == "uint32" else draw(st.sampled_from(["none", "none", "bytes", "zlib"]))
    )
    return ("tensor", dtype, shape, encoding)


def nested_specs(max_leaves=4, min_dim=1, empty=False):
    """Nests of specs; `empty` draws empty dicts too (OXE's `episode_metadata: {}`).

    TFDS cannot read an empty dict back inside steps (the writer refuses it):
    those are drawn at episode level only.
    """
    return st.recursive(
        tensor_specs(min_dim),
        lambda children: st.dictionaries(NAMES, children, min_size=0 if empty else 1, max_size=3),
        max_leaves=max_leaves,
    )


def _feature(spec):
    import tensorflow_datasets as tfds

    if isinstance(spec, dict):
        return {k: _feature(v) for k, v in spec.items()}
    if spec[0] == "text":
        return tfds.features.Text()
    if spec[0] == "image":
        return tfds.features.Image(shape=spec[1:4], dtype=np.dtype(spec[4]).type)
    if spec[0] == "label":
        return tfds.features.ClassLabel(num_classes=spec[1])
    _, dtype, shape, encoding = spec
    return tfds.features.Tensor(shape=shape, dtype=np.dtype(dtype).type, encoding=encoding)


@st.composite
def configs(draw):
    def optional(strategy):
        return draw(st.one_of(st.none(), strategy))

    return {
        "observation_info": draw(nested_specs()),
        "action_info": draw(nested_specs(3)),
        "reward_info": optional(nested_specs(2)),
        "discount_info": optional(nested_specs(2)),
        "step_metadata_info": draw(st.dictionaries(NAMES, nested_specs(2), max_size=2)),
        "episode_metadata_info": draw(
            st.dictionaries(NAMES, nested_specs(2, min_dim=0, empty=True), max_size=2)
        ),
    }


def _build(spec_config):
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    kwargs = {k: (_feature(v) if v is not None else None) for k, v in spec_config.items()}
    config = rlds_writer.DatasetConfig(name="prop", **kwargs)
    identity = tfds.core.DatasetIdentity(
        name="prop", version=tfds.core.Version("0.0.1"), data_dir="/tmp/unused", module_name=""
    )
    return config, rlds_base.build_info(config, identity).features


def _ours(features, episode: EpisodeSpec) -> bytes:
    from rlds_writer.record import episode as steps
    from rlds_writer.store.writing import encoding

    encoder = encoding.EpisodeEncoder(features)
    buffer = steps.StepFields(encoder.fields, empty_dicts=encoder.empty_dicts).new_buffer()
    meta = episode.step_metadata
    buffer.start(episode.observations[0], meta[0] if meta else None)
    for t, action in enumerate(episode.actions):
        buffer.add(
            action,
            episode.rewards[t],
            episode.discounts[t],
            episode.observations[t + 1],
            meta[t + 1] if meta else None,
        )
    if episode.episode_metadata:
        buffer.set_episode_metadata(episode.episode_metadata)
    finished = buffer.finish(episode.terminated)
    try:
        return encoder.encode(finished.columns, finished.episode_values)
    finally:
        encoder.close()


def _theirs(features, config, episode: EpisodeSpec) -> bytes:
    from tensorflow_datasets.core import example_serializer

    serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
    return serializer.serialize_example(features.encode_example(rlds_example(config, episode)))


def _decode_tf(features, data: bytes):
    import tensorflow_datasets as tfds

    decoded = tfds.as_numpy(features.deserialize_example(data))
    decoded = dict(decoded)
    decoded["steps"] = [dict(s) for s in decoded["steps"]]
    return decoded


def _decode_np(features, data: bytes):
    decoded = dict(features.deserialize_example_np(data))
    decoded["steps"] = [dict(s) for s in decoded["steps"]]
    return decoded


# 30 random configs, each encoded by us and by TFDS: slow (the roundtrip tests of
# tests/store/features/test_feature_roundtrip.py check every feature kind in the quick loop).
@pytest.mark.slow
@settings(
    # A deeper search:
    # RLDS_WRITER_PROPERTY_EXAMPLES=500 pytest tests/store/writing/test_encoder_property.py
    max_examples=int(os.environ.get("RLDS_WRITER_PROPERTY_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    spec_config=configs(),
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(1, 4),
    terminated=st.booleans(),
)
def test_tfds_decodes_our_bytes_like_its_own(spec_config, seed, length, terminated):
    config, features = _build(spec_config)
    (episode,) = random_episodes(config, np.random.default_rng(seed), lengths=[length])
    episode.terminated = terminated

    ours = _ours(features, episode)
    theirs = _theirs(features, config, episode)
    as_dataset = _decode_tf(features, theirs)
    assert_same(_decode_tf(features, ours), as_dataset)
    # Our reader gives what `as_dataset` gives (TFDS's numpy parser differs from
    # it on uint32, and needs OpenCV for uint16 images; ours does not).
    assert_same(_decode_ours(features, ours), as_dataset)
    if "'uint16'" in repr(spec_config):
        return
    try:
        expected = _decode_np(features, theirs)
    except OverflowError:
        # TFDS's numpy parser cannot read uint64 values >= 2**63, from its own
        # bytes either; ours must fail the same way, not differently.
        with pytest.raises(OverflowError):
            _decode_np(features, ours)
        return
    assert_same(_decode_np(features, ours), expected)


def _decode_ours(features, data: bytes):
    """Our TF-free reader's decoding, steps as a list of dicts like TFDS's."""
    import tempfile

    from rlds_writer.read.decode import Decoder
    from rlds_writer.read.nest import rows
    from rlds_writer.store.features.features import load_features

    with tempfile.TemporaryDirectory() as directory:
        features.save_config(directory)
        decoder = Decoder(load_features(os.path.join(directory, "features.json")))
    decoded = decoder.decode(data, "<property>")
    decoded["steps"] = list(rows(decoded["steps"]))
    return decoded
