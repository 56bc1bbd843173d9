"""Large bytes-encoded rows are written from the chunks the recorder copied them into.

An episode of large rows (raw camera frames, `encoding="bytes"`) longer than
one chunk reaches the encoder as `ChunkedRows`; its record is made of
views of those chunks, never of a joined copy of the whole episode, and its
bytes are those of the joined rows.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from rlds_writer.store.episodes.episode_data import ChunkedRows
from rlds_writer.store.features import field_encoding, field_specs


def _field() -> field_specs.FieldSpec:
    feature = tfds.features.Tensor(shape=(84, 84, 3), dtype=np.uint8, encoding="bytes")
    kind, shape, dtype = field_specs._classify(feature)
    return field_specs.FieldSpec(
        ("steps", "observation"), "steps/observation", feature, kind, True, shape, dtype
    )


def _joined(parts) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts)


def test_rows_of_several_chunks_are_written_from_the_chunks_with_the_joined_rows_bytes():
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 256, (5, 84, 84, 3), dtype=np.uint8) for _ in range(3)]
    rows = ChunkedRows(chunks, 12)  # the last chunk partly used
    field = _field()
    parts, length = field_encoding.encode_field_parts(field, rows)
    joined = np.concatenate([chunks[0], chunks[1], chunks[2][:2]])
    expected, expected_length = field_encoding.encode_field_parts(field, joined)
    assert length == expected_length
    assert _joined(parts) == _joined(expected)
    # Every row's bytes are a view of the chunk it was recorded into.
    from_chunks = [
        p
        for p in parts
        if isinstance(p, np.ndarray) and any(np.shares_memory(p, c) for c in chunks)
    ]
    assert len(from_chunks) == 12
    # And TensorFlow reads the rows back.
    feature = tf.train.Feature.FromString(_joined(parts))
    values = feature.bytes_list.value
    assert len(values) == 12
    assert values[7] == joined[7].tobytes()
