"""Protobuf wire encoding of one field's values, straight from numpy columns.

Wire format reminder (tensorflow/core/example/{example,feature}.proto):
`Example{1: Features{1: map<string, Feature>}}`, where a map entry is
`{1: key, 2: value}` and `Feature` is one of `1: BytesList`, `2: FloatList`,
`3: Int64List`, each a `repeated ... value = 1` (packed for numbers).

Values are given as bytes-like parts, so that large columns reach the shard
file without a copy.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from rlds_writer import _native, errors
from rlds_writer.store.episodes.episode_data import ChunkedRows, PackedColumn, RowBytes
from rlds_writer.store.features.field_specs import BYTES, FLOAT, INT, TEXT, ZLIB, FieldSpec
from rlds_writer.store.features.wire import bytes_entries, bytes_entry_head, read_varint
from rlds_writer.store.features.wire import varint as _varint

# --------------------------------------------------------------------------
# Protobuf wire primitives.


_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_POSITIONS = np.arange(10)


def encode_varints(values: np.ndarray) -> bytes:
    """Encodes int64 values as concatenated protobuf varints, vectorised.

    Negative values take 10 bytes (two's complement), as protobuf does.

    Args:
      values: an integer array (any shape); it is read as int64.

    Returns:
      The packed varint bytes.
    """
    if isinstance(values, np.ndarray) and values.dtype == np.bool_:
        # 0 and 1 are one-byte varints: the bools' own bytes (tobytes is C order).
        return values.tobytes()
    arr = np.ascontiguousarray(values, dtype=np.int64)
    # Values in [0, 128) are one-byte varints: their low bytes, if those are
    # ASCII and give the values back (cheaper than numpy's max on short columns).
    low = arr.astype(np.uint8)
    out = low.tobytes()
    if out.isascii() and low.astype(np.int64).tobytes() == arr.tobytes():
        return out
    u = arr.reshape(-1).view(np.uint64)
    groups = (u[:, None] >> _SHIFTS[None, :]) & np.uint64(0x7F)
    nonzero = groups != 0
    length = 10 - np.argmax(nonzero[:, ::-1], axis=1)
    length[~nonzero.any(axis=1)] = 1
    cont = _POSITIONS[None, :] < (length[:, None] - 1)
    out = (groups | (cont.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
    return out[_POSITIONS[None, :] < length[:, None]].tobytes()


def _len_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def bytes_feature(items: list[bytes]) -> bytes:
    """Returns serialized `Feature{bytes_list}` bytes for the items."""
    inner = bytes_entries(items)
    return _len_delimited(b"\x0a", inner)


def bytes_list_of_entries(pieces: list[bytes]) -> tuple[list[Any], int]:
    """`Feature{bytes_list}` around `BytesList` entries given in pieces: (parts, length)."""
    inner = sum(map(len, pieces))
    head = b"\x0a" + _varint(inner)
    return [head, *pieces], len(head) + inner


def bytes_list_parts(items: list[bytes]) -> tuple[list[Any], int]:
    """`bytes_feature` as parts, without copying large items: (parts, total length)."""
    if items and sum(map(len, items)) < _ROW_PARTS_MIN * len(items):
        out = bytes_feature(items)
        return [out], len(out)
    pieces = []
    for item in items:
        pieces.append(bytes_entry_head(len(item)))
        pieces.append(item)
    return bytes_list_of_entries(pieces)


def _read_only(arr: np.ndarray) -> np.ndarray:
    """A read-only view, for parts hashed by CRC32C (its C function takes
    read-only buffers, `y#`)."""
    view = arr.view()
    view.setflags(write=False)
    return view


# Rows at least this large are written as separate parts (no interleave copy).
_ROW_PARTS_MIN = 4096


def _row_bytes_parts(rows: list[bytes]) -> tuple[list[Any], int]:
    """`bytes_feature` of equal-length rows given as bytes, without copying them."""
    if not rows:
        out = _len_delimited(b"\x0a", b"")
        return [out], len(out)
    width = len(rows[0])
    row_header = bytes_entry_head(width)
    inner_len = len(rows) * (len(row_header) + width)
    head = b"\x0a" + _varint(inner_len)
    if width < _ROW_PARTS_MIN:
        body = row_header + row_header.join(rows)
        return [head, body], len(head) + inner_len
    parts: list[Any] = [head]
    for row in rows:
        parts.append(row_header)
        parts.append(row)
    return parts, len(head) + inner_len


def _framed_parts(rows: ChunkedRows) -> tuple[list[Any], int] | None:
    """`bytes_feature` of rows kept behind their entry heads: a part per chunk.

    None if the chunks hold another prefix than this encoding's.
    """
    width = rows.chunks[0][0].nbytes
    row_header = bytes_entry_head(width)
    if rows.prefix != row_header:
        return None
    inner_len = rows.n * (len(row_header) + width)
    head = b"\x0a" + _varint(inner_len)
    parts = [_read_only(chunk.reshape(-1)) for chunk in rows.framed_parts()]
    return [head, *parts], len(head) + inner_len


def _fixed_bytes_parts(rows: np.ndarray | ChunkedRows) -> tuple[list[Any], int]:
    """`bytes_feature` for equal-length rows, as parts: (parts, total length)."""
    if isinstance(rows, ChunkedRows):
        if rows.framed is not None and rows.n:
            framed = _framed_parts(rows)
            if framed is not None:
                return framed
        chunks = rows.parts()
        if len(chunks) > 1 and chunks[0][0].nbytes >= _ROW_PARTS_MIN:
            return _row_bytes_parts([_read_only(r.reshape(-1).view(np.uint8)) for r in rows])
        rows = np.asarray(rows)
    n = rows.shape[0]
    width = int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.dtype.itemsize
    if n == 0:
        out = _len_delimited(b"\x0a", b"")
        return [out], len(out)
    row_header = bytes_entry_head(width)
    inner_len = n * (len(row_header) + width)
    head = b"\x0a" + _varint(inner_len)
    flat = np.ascontiguousarray(rows).reshape(n, -1).view(np.uint8)  # (n, width) bytes
    if width >= _ROW_PARTS_MIN:
        parts: list[Any] = [head]
        rows_ro = _read_only(flat)
        for i in range(n):
            parts.append(row_header)
            parts.append(rows_ro[i])
        return parts, len(head) + inner_len
    header = np.frombuffer(row_header, dtype=np.uint8)
    out = np.empty((n, header.size + width), dtype=np.uint8)
    out[:, : header.size] = header
    out[:, header.size :] = flat
    return [head, out.tobytes()], len(head) + inner_len


@functools.lru_cache(maxsize=4096)
def map_entry_header(key: bytes, feature_len: int) -> bytes:
    """The bytes of a map entry that precede its `Feature` value.

    Cached: with fixed-shape fields and recurring episode lengths, the same
    (key, length) pairs come back episode after episode.
    """
    key_part = _len_delimited(b"\x0a", key)
    value_head = b"\x12" + _varint(feature_len)
    entry_len = len(key_part) + len(value_head) + feature_len
    return b"\x0a" + _varint(entry_len) + key_part + value_head


def example_entries(example_bytes: bytes) -> bytes:
    """Strips the `Example` and `Features` headers, leaving the map entries."""
    if not example_bytes:
        return b""
    if example_bytes[0] != 0x0A:
        raise errors.EncodingError("unexpected tf.train.Example layout from TFDS serializer")
    length, pos = read_varint(example_bytes, 1)
    if pos + length != len(example_bytes):
        raise errors.EncodingError("unexpected tf.train.Example layout from TFDS serializer")
    return example_bytes[pos:]


# --------------------------------------------------------------------------
# Encoding one field.


def _as_text_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8")


def _packed_head(tag: bytes, payload_len: int) -> bytes:
    """The bytes of `Feature{<tag>: List{packed}}` before a payload of `payload_len` bytes."""
    inner_head = b"\x0a" + _varint(payload_len)
    return tag + _varint(len(inner_head) + payload_len) + inner_head


def encode_field_parts(field: FieldSpec, values: Any) -> tuple[list[Any], int]:
    """Encodes a `BYTES`, `ZLIB` or `TEXT` column (per-step field) or value (episode field).

    Numeric fields are written by `entry_writer`'s own path.

    Args:
      field: the field.
      values: for a per-step field, an array with a leading step axis of the
        field's dtype (rows as `RowBytes`; a list of str/bytes for text); for
        an episode-level field, one value already cast to the field's dtype.

    Returns:
      The serialized `Feature` (without the map entry around it) as a list of
      bytes-like parts, and its total length.
    """
    kind = field.kind
    if kind == BYTES and field.in_steps:
        if isinstance(values, RowBytes):
            return _row_bytes_parts(values.rows)
        if isinstance(values, ChunkedRows):
            # Rows where the recorder copied them: joining the chunks would copy
            # the whole episode once more (a long episode of large rows).
            return _fixed_bytes_parts(values)
        return _fixed_bytes_parts(np.asarray(values))
    if kind == TEXT:
        items = [_as_text_bytes(v) for v in values] if field.in_steps else [_as_text_bytes(values)]
    elif kind == BYTES:
        items = [np.asarray(values).tobytes()]
    elif kind == ZLIB:
        arr = np.asarray(values)
        items = (
            [zlib.compress(row.tobytes()) for row in arr]
            if field.in_steps
            else [zlib.compress(arr.tobytes())]
        )
    else:
        raise errors.EncodingError(f"{field.key}: kind {kind} has no direct encoder")
    out = bytes_feature(items)
    return [out], len(out)


# Entry heads kept per field, by payload length (episode lengths recur).
_HEADS_KEPT = 256
_F4 = np.dtype("<f4")
_BOOL = np.dtype(np.bool_)
_U64 = np.dtype(np.uint64)


def numpy_quiet_nans(payload: Any) -> Any:
    """A float32 payload with each signalling NaN quieted, as TFDS's serializer makes it.

    TFDS hands a float column to `FloatList` value by value, each through a
    Python float (a double) and back: a signalling NaN comes out quiet (its
    sign and payload kept), whatever the column held (numpy's cast keeps an
    np.float32's bits). The payload as it is when it holds no NaN.

    `quiet_nans` is this, or where it is built the same scan in C
    (`_float_bits.c`): numpy's two passes cost about 1.5 µs a column, paid
    for every float column of every episode.
    """
    floats = np.frombuffer(payload, _F4)
    nans = np.isnan(floats)
    if not nans.any():
        return payload
    bits = floats.view(np.uint32).copy()
    bits[nans] |= 0x00400000  # the quiet bit
    return bits.view(np.uint8)


# The optional extension (setup.py), the same bytes; numpy where it is not built,
# on a big-endian machine, or built from other sources.
_float_bits = _native.load("rlds_writer.store.features._float_bits")
quiet_nans = numpy_quiet_nans if _float_bits is None else _float_bits.quiet_nans


def entry_writer(field: FieldSpec) -> Callable[[Any, list[Any]], int]:
    """The function that appends `field`'s whole map entry to an `Example`'s parts.

    `write(values, parts)` appends the entry (key, `Feature` head and payload)
    as bytes-like parts and returns their length. Numeric fields, which short
    episodes consist of, take a lookup of their head by payload length and
    their payload without a copy; other kinds go through `encode_field_parts`.

    Args:
      field: a numeric, `BYTES`, `ZLIB` or `TEXT` field (PNG, JPEG and
        fallback fields are `EpisodeEncoder`'s).
    """
    key = field.key.encode("utf-8")
    if field.kind == TEXT and not field.in_steps:
        # An episode's text (its `end_reason`, a task name) takes a few values
        # again and again: their whole entries are kept.
        entries: dict[Any, bytes] = {}

        def write_text(value: Any, parts: list[Any]) -> int:
            entry = entries.get(value) if type(value) in (str, bytes) else None
            if entry is None:
                feature_parts, feature_len = encode_field_parts(field, value)
                entry = map_entry_header(key, feature_len) + b"".join(feature_parts)
                if type(value) in (str, bytes) and len(value) <= 256:
                    if len(entries) >= 64:
                        entries.clear()
                    entries[value] = entry
            parts.append(entry)
            return len(entry)

        return write_text
    if field.kind not in (FLOAT, INT):

        def write_any(values: Any, parts: list[Any]) -> int:
            feature_parts, feature_len = encode_field_parts(field, values)
            head = map_entry_header(key, feature_len)
            parts.append(head)
            parts.extend(feature_parts)
            return len(head) + feature_len

        return write_any

    tag = b"\x12" if field.kind == FLOAT else b"\x1a"
    heads: dict[int, bytes] = {}

    def head_of(payload_len: int) -> bytes:
        if len(heads) >= _HEADS_KEPT:
            heads.clear()
        # An empty list is the tag and a zero length, as TFDS writes it.
        feature = _packed_head(tag, payload_len) if payload_len else tag + b"\x00"
        head = heads[payload_len] = map_entry_header(key, len(feature) + payload_len) + feature
        return head

    if field.kind == FLOAT:

        def payload_of(values: Any) -> Any:
            if type(values) is np.ndarray and values.dtype is _F4 and values.flags.c_contiguous:
                payload = values.reshape(-1).view(np.uint8)
            else:
                with np.errstate(invalid="ignore"):  # a signalling NaN's cast says so
                    payload = np.ascontiguousarray(values, dtype=_F4).reshape(-1).view(np.uint8)
            payload.setflags(write=False)  # our own view: see `_read_only`
            return payload

    else:

        def payload_of(values: Any) -> Any:
            if type(values) is np.ndarray and values.dtype is _BOOL:
                return values.tobytes()  # 0 and 1 are one-byte varints
            if type(values) is np.ndarray and values.dtype is not _U64:
                return encode_varints(values)
            arr = np.asarray(values)
            return encode_varints(arr.view(np.int64) if arr.dtype == np.uint64 else arr)

    def write_numbers(values: Any, parts: list[Any]) -> int:
        # A packed column is its own payload (float32 or one-byte varints).
        payload = values.payload if type(values) is PackedColumn else payload_of(values)
        if tag == b"\x12":
            payload = quiet_nans(payload)
        n = len(payload)
        head = heads.get(n) or head_of(n)
        parts.append(head)
        if n:
            parts.append(payload)
        return len(head) + n

    return write_numbers
