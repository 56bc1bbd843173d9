"""A small decoder for `tf.train.Example` protobuf wire bytes, without TensorFlow.

Wire layout (tensorflow/core/example/{example,feature}.proto)::

    Example  { 1: Features }
    Features { 1: repeated map entry { 1: key (string), 2: Feature } }
    Feature  { oneof: 1: BytesList, 2: FloatList, 3: Int64List }
    *List    { 1: repeated value }   (numbers packed, but unpacked is legal too)

`parse_example` walks only the map entries (tens per episode) in Python and
returns where each list's payload sits in the buffer; the payloads themselves
are decoded with numpy: packed floats with `np.frombuffer`, packed varints with
a vectorised decoder, and equal-length byte strings as one 2-D array.

The writing side (`store.features.field_encoding`, and the image-encoding processes) takes
its varints and `BytesList` entries from here too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlds_writer.errors import WireError

BYTES_LIST = 1
FLOAT_LIST = 2
INT64_LIST = 3
LIST_NAMES = {
    0: "no list",
    BYTES_LIST: "bytes_list",
    FLOAT_LIST: "float_list",
    INT64_LIST: "int64_list",
}

_LEN = 2  # wire type of length-delimited fields


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Lengths of keys, headers and small features repeat: look them up. Two-byte
# ones are kept as they are met (all 16,256 made at import cost 1.5 ms).
_ONE_BYTE = [bytes((i,)) for i in range(128)]
_TWO_BYTES: dict[int, bytes] = {}


def varint(n: int) -> bytes:
    """Encodes a non-negative int as a protobuf varint."""
    if n < 128:
        return _ONE_BYTE[n]
    if n < 16384:
        v = _TWO_BYTES.get(n)
        if v is None:
            v = _TWO_BYTES[n] = bytes((n & 0x7F | 0x80, n >> 7))
        return v
    if n < 1 << 21:  # a record of a short episode: 3 bytes, without the loop
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    return _varint_slow(n)


def bytes_entry_head(length: int) -> bytes:
    """The bytes before one `value` of `length` bytes in a `BytesList`."""
    return b"\x0a" + varint(length)


def bytes_entries(items: Sequence[bytes]) -> bytes:
    """The `value` entries of a `BytesList` holding `items` (the list's payload)."""
    return b"".join([bytes_entry_head(len(x)) + x for x in items])


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Reads one varint at `pos`; returns (value, next position).

    Raises:
      WireError: if the varint is cut off by the end of `buf` or is longer than 10 bytes.
    """
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        result = b & 0x7F
        shift = 7
        pos += 1
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift > 63:
                raise WireError(f"varint longer than 10 bytes at byte {pos}")
    except IndexError:
        raise WireError(f"truncated varint at byte {pos}") from None


def _skip(buf: bytes, pos: int, wire_type: int) -> int:
    """Returns the position after a field of the given wire type."""
    if wire_type == 0:
        return read_varint(buf, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == _LEN:
        n, pos = read_varint(buf, pos)
        return pos + n
    if wire_type == 5:
        return pos + 4
    raise WireError(f"unsupported wire type {wire_type}")


def parse_example(buf: bytes) -> dict[str, tuple[int, int, int]]:
    """Locates every feature list of a serialized `tf.train.Example`.

    Args:
      buf: the serialized example.

    Returns:
      key -> (list type, start, end): the list type is `BYTES_LIST`,
      `FLOAT_LIST`, `INT64_LIST` (or 0 for an empty `Feature`), and
      `buf[start:end]` is the list message's payload.

    Raises:
      WireError: if the bytes are not a well-formed example.
    """
    out: dict[str, tuple[int, int, int]] = {}
    try:
        pos, end = 0, len(buf)
        while pos < end:
            tag, pos = read_varint(buf, pos)
            if tag != 0x0A:  # not Example.features
                pos = _skip(buf, pos, tag & 7)
                continue
            n, pos = read_varint(buf, pos)
            _parse_features(buf, pos, pos + n, out)
            pos += n
        if pos != end:
            raise WireError("message runs past the end of the record")
    except IndexError as e:
        raise WireError("truncated message") from e
    except UnicodeDecodeError as e:
        raise WireError("feature key is not UTF-8") from e
    return out


def _parse_features(buf: bytes, pos: int, end: int, out: dict) -> None:
    while pos < end:
        tag, pos = read_varint(buf, pos)
        if tag != 0x0A:  # not Features.feature
            pos = _skip(buf, pos, tag & 7)
            continue
        n, pos = read_varint(buf, pos)
        entry_end = pos + n
        key = None
        located = (0, 0, 0)
        while pos < entry_end:
            tag, pos = read_varint(buf, pos)
            if tag == 0x0A:
                n, pos = read_varint(buf, pos)
                key = bytes(buf[pos : pos + n]).decode("utf-8")
                pos += n
            elif tag == 0x12:
                n, pos = read_varint(buf, pos)
                located = _locate_list(buf, pos, pos + n)
                pos += n
            else:
                pos = _skip(buf, pos, tag & 7)
        if pos != entry_end or key is None:
            raise WireError("malformed feature map entry")
        out[key] = located


def _locate_list(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """Returns (list type, start, end) of the list inside a `Feature` message."""
    found = (0, pos, pos)
    while pos < end:
        tag, pos = read_varint(buf, pos)
        field, wire_type = tag >> 3, tag & 7
        if wire_type == _LEN and field in (BYTES_LIST, FLOAT_LIST, INT64_LIST):
            n, pos = read_varint(buf, pos)
            found = (field, pos, pos + n)  # last one wins, as in protobuf
            pos += n
        else:
            pos = _skip(buf, pos, wire_type)
    if pos != end:
        raise WireError("malformed Feature message")
    return found


def _chunks(buf: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """Returns (wire type, start, end) of each `value` field of a list message."""
    out = []
    pos = start
    while pos < end:
        tag, pos = read_varint(buf, pos)
        field, wire_type = tag >> 3, tag & 7
        if field != 1:
            pos = _skip(buf, pos, wire_type)
            continue
        if wire_type == _LEN:
            n, pos = read_varint(buf, pos)
            out.append((_LEN, pos, pos + n))
            pos += n
        elif wire_type == 5:
            out.append((5, pos, pos + 4))
            pos += 4
        elif wire_type == 0:
            _, nxt = read_varint(buf, pos)
            out.append((0, pos, nxt))
            pos = nxt
        else:
            raise WireError(f"unexpected wire type {wire_type} in a list")
    if pos != end:
        raise WireError("list runs past its message")
    return out


def float_list(buf: bytes, start: int, end: int) -> np.ndarray:
    """Decodes a `FloatList` payload to a float32 array (a view when packed)."""
    if start == end:
        return np.empty(0, np.float32)
    if buf[start] == 0x0A:
        n, pos = read_varint(buf, start + 1)
        if pos + n == end:  # one packed run: the common case
            if n % 4:
                raise WireError("packed float list length is not a multiple of 4")
            return np.frombuffer(buf, "<f4", n // 4, pos)
    parts = []
    for _, a, b in _chunks(buf, start, end):
        if (b - a) % 4:
            raise WireError("packed float list length is not a multiple of 4")
        parts.append(np.frombuffer(buf, "<f4", (b - a) // 4, a))
    return np.concatenate(parts) if parts else np.empty(0, np.float32)


def decode_varints(data: np.ndarray) -> np.ndarray:
    """Decodes concatenated protobuf varints, vectorised.

    Args:
      data: uint8 array of back-to-back varints.

    Returns:
      The values as int64 (two's complement, as protobuf stores negatives).

    Raises:
      WireError: if the last varint is cut off or one is longer than 10 bytes.
    """
    if data.size == 0:
        return np.empty(0, np.int64)
    if int(data.max()) < 0x80:  # every value in [0, 127]: one byte each
        return data.astype(np.int64)
    ends = np.flatnonzero(data < 0x80)
    if ends.size == 0 or ends[-1] != data.size - 1:
        raise WireError("truncated varint")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) > 10:
        raise WireError("varint longer than 10 bytes")
    position = np.arange(data.size) - np.repeat(starts, lengths)
    groups = (data & 0x7F).astype(np.uint64) << (position.astype(np.uint64) * np.uint64(7))
    # The 7-bit groups never overlap, so their sum is their bitwise or.
    return np.add.reduceat(groups, starts).view(np.int64)


def int64_list(buf: bytes, start: int, end: int) -> np.ndarray:
    """Decodes an `Int64List` payload to an int64 array."""
    if start == end:
        return np.empty(0, np.int64)
    if buf[start] == 0x0A:
        n, pos = read_varint(buf, start + 1)
        if pos + n == end:
            return decode_varints(np.frombuffer(buf, np.uint8, n, pos))
    parts = []
    for _, a, b in _chunks(buf, start, end):
        parts.append(decode_varints(np.frombuffer(buf, np.uint8, b - a, a)))
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def bytes_list(buf: bytes, start: int, end: int) -> list[bytes]:
    """Decodes a `BytesList` payload to a list of byte strings."""
    out = []
    pos = start
    while pos < end:
        tag, pos = read_varint(buf, pos)
        if tag != 0x0A:
            pos = _skip(buf, pos, tag & 7)
            continue
        n, pos = read_varint(buf, pos)
        out.append(bytes(buf[pos : pos + n]))
        pos += n
    if pos != end:
        raise WireError("bytes list runs past its message")
    return out


def fixed_bytes_list(buf: bytes, start: int, end: int) -> np.ndarray | None:
    """Decodes a `BytesList` whose entries all have one length, without a loop.

    Args:
      buf: the buffer.
      start: start of the list payload.
      end: its end.

    Returns:
      A read-only uint8 array of shape (entries, length) viewing `buf`, or
      None if the entries do not all have the same length.
    """
    if start == end:
        return np.empty((0, 0), np.uint8)
    if buf[start] != 0x0A:
        return None
    width, pos = read_varint(buf, start + 1)
    header = pos - start
    stride = header + width
    total = end - start
    if total % stride:
        return None
    rows = np.frombuffer(buf, np.uint8, total, start).reshape(total // stride, stride)
    if rows.shape[0] > 1 and not (rows[1:, :header] == rows[0, :header]).all():
        return None
    return rows[:, header:]


def count_varints(buf: bytes, start: int, end: int) -> int:
    """Counts the values of an `Int64List` payload without decoding them."""
    if start == end:
        return 0
    if buf[start] == 0x0A:
        n, pos = read_varint(buf, start + 1)
        if pos + n == end:
            return int(np.count_nonzero(np.frombuffer(buf, np.uint8, n, pos) < 0x80))
    return int(
        sum(
            int(np.count_nonzero(np.frombuffer(buf, np.uint8, b - a, a) < 0x80))
            for _, a, b in _chunks(buf, start, end)
        )
    )


def count_values(buf: bytes, located: tuple[int, int, int]) -> int:
    """Counts the values of a located list without decoding them.

    Args:
      buf: the example's buffer.
      located: (list type, start, end) from `parse_example`.

    Returns:
      The number of values (floats, ints or byte strings) in the list.
    """
    kind, start, end = located
    if kind == FLOAT_LIST:
        if start == end:
            return 0
        if buf[start] == 0x0A:
            n, pos = read_varint(buf, start + 1)
            if pos + n == end:
                return n // 4
        return int(sum((b - a) // 4 for _, a, b in _chunks(buf, start, end)))
    if kind == INT64_LIST:
        return count_varints(buf, start, end)
    if kind == BYTES_LIST:
        rows = fixed_bytes_list(buf, start, end)
        if rows is not None:
            return rows.shape[0]
        return len(_chunks(buf, start, end))
    return 0


def list_type_name(kind: int) -> str:
    return LIST_NAMES.get(kind, f"list {kind}")


def expect_list(key: str, located: tuple[int, int, int], allowed: Sequence[int]) -> None:
    """Raises WireError if a located list is not of an allowed type."""
    if located[0] not in allowed and located[0] != 0:
        names = " or ".join(list_type_name(k) for k in allowed)
        raise WireError(f"{key}: expected {names}, found {list_type_name(located[0])}")
