"""One field's map entry, as `field_encoding.entry_writer` writes it, parsed by TensorFlow.

The encoder writes numeric fields through per-field writers that cache their
heads by payload length and take one-byte varints from a shortcut; these
tests parse the bytes with TensorFlow's own `tf.train.Example` and compare the
values, for the inputs where a shortcut could go wrong.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from rlds_writer.store.features import field_encoding, field_specs
from rlds_writer.store.features.wire import varint


def _field(feature, key="steps/x") -> field_specs.FieldSpec:
    kind, shape, dtype = field_specs._classify(feature)
    path = tuple(key.split("/"))
    return field_specs.FieldSpec(path, key, feature, kind, path[0] == "steps", shape, dtype)


def _parse(field: field_specs.FieldSpec, values) -> tf.train.Feature:
    parts: list = []
    length = field_encoding.entry_writer(field)(values, parts)
    entries = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert len(entries) == length
    example = tf.train.Example.FromString(b"\x0a" + varint(length) + entries)
    return example.features.feature[field.key]


@pytest.mark.parametrize(
    "values",
    [
        [0, 1, 127],
        [128, 255, 256, 384],  # low bytes that are ASCII (0, 0x80 → not, 0, 0x80)
        [256, 512, 1 << 40],  # low byte 0: ASCII, but not the value
        [-1, -128, -(1 << 63)],
        [(1 << 63) - 1, 5, 0],
        [],
    ],
)
def test_int64_values_round_trip_through_tensorflow(values):
    field = _field(tfds.features.Tensor(shape=(), dtype=np.int64))
    parsed = _parse(field, np.array(values, dtype=np.int64))
    assert list(parsed.int64_list.value) == values


def test_uint64_and_bool_columns_round_trip_through_tensorflow():
    big = np.array([0, 1, (1 << 64) - 1, 1 << 63], dtype=np.uint64)
    parsed = _parse(_field(tfds.features.Tensor(shape=(), dtype=np.uint64)), big)
    assert np.array(parsed.int64_list.value, dtype=np.int64).view(np.uint64).tolist() == [
        int(v) for v in big
    ]
    flags = np.array([True, False, False, True])
    parsed = _parse(_field(tfds.features.Tensor(shape=(), dtype=np.bool_)), flags)
    assert list(parsed.int64_list.value) == [1, 0, 0, 1]


def test_float_columns_in_any_layout_round_trip_through_tensorflow():
    field = _field(tfds.features.Tensor(shape=(2, 3), dtype=np.float32))
    base = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    for values in (
        base,  # the recorder's own columns: contiguous float32
        np.asfortranarray(base),  # not C-contiguous
        base.astype(np.float64),  # another dtype
        base.astype(">f4"),  # big-endian
        base[::2],  # a strided view
        np.zeros((0, 2, 3), np.float32),  # no steps: an empty list
    ):
        parsed = _parse(field, values)
        np.testing.assert_array_equal(
            np.array(parsed.float_list.value, np.float32), np.asarray(values, np.float32).ravel()
        )


def test_heads_stay_right_past_the_cache_of_lengths():
    """More distinct episode lengths than the writer keeps heads for."""
    field = _field(tfds.features.Tensor(shape=(), dtype=np.float32))
    write = field_encoding.entry_writer(field)
    for n in list(range(300)) + [5, 299, 0, 17]:
        values = np.arange(n, dtype=np.float32)
        parts: list = []
        length = write(values, parts)
        entries = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
        example = tf.train.Example.FromString(b"\x0a" + varint(length) + entries)
        assert list(example.features.feature["steps/x"].float_list.value) == values.tolist()


def test_varints_match_protobufs_own_encoder_at_every_width_boundary():
    from google.protobuf.internal.encoder import _VarintBytes

    for bits in range(0, 64, 7):
        for n in {(1 << bits) - 1, 1 << bits, (1 << bits) + 1, 3 << bits}:
            if 0 <= n < 1 << 63:
                assert varint(n) == _VarintBytes(n), n
