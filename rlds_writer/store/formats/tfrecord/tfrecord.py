"""TFRecord framing: the one place that writes and parses record frames.

A TFRecord file is a sequence of records, each laid out as::

    uint64 length (little endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

The mask is `((crc >> 15) | (crc << 17)) + 0xa282ead8` modulo 2**32. Every
reader (the TF-free reader, recover, info, validate, stats, merge) walks files
through `read_record` and `scan`, so a damaged record is described the same
way everywhere, and no length field is trusted beyond the file's size.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

from rlds_writer import _native
from rlds_writer.errors import CorruptRecordError

# The optional SSE4.2 extension: spares every new writer google_crc32c's import.
_native_crc = _native.load("rlds_writer.store.formats.tfrecord._crc32c")
if _native_crc is not None:
    _crc32c_extend = _native_crc.extend
    _crc32c_parts = _native_crc.extend_parts
    _TAKES_MEMORYVIEW = True
else:  # not built, no SSE4.2, or stale: the same values from google_crc32c
    from google_crc32c import extend as _crc32c_extend

    _TAKES_MEMORYVIEW = False  # it takes bytes and arrays

    def _crc32c_parts(crc: int, parts: list) -> int:
        for part in parts:
            crc = _crc32c_extend(crc, part)
        return crc


_MASK_DELTA = 0xA282EAD8
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_SIZE = 12
FOOTER_SIZE = 4
FRAMING = HEADER_SIZE + FOOTER_SIZE
# Every record TFDS writes is a tf.train.Example, whose first byte is the tag of
# its `features` field; resynchronisation only tries offsets followed by it.
_EXAMPLE_TAG = b"\x0a"
# The tails a writer killed while it wrote ahead leaves (`store.formats.tfrecord.write_ahead`):
# zeros after its last record, or a record torn by the kill followed by zeros.
ZEROS_AHEAD = "zeros written ahead of the next record (the shard was never closed)"
TORN_INTO_ZEROS = "record torn by a crash (zeros written ahead follow it)"
CRASH_TAILS = (ZEROS_AHEAD, TORN_INTO_ZEROS)


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes | memoryview) -> int:
    """Returns the masked CRC32C of `data`, as TFRecord stores it."""
    if not _TAKES_MEMORYVIEW and isinstance(data, memoryview):
        data = bytes(data)
    return _mask(_crc32c_extend(0, data))


def frame(record: bytes) -> bytes:
    """Returns the record framed as TFRecord bytes (header, data, footer)."""
    header, footer = frame_parts_of([record], len(record))
    return b"".join((header, record, footer))


# Record headers by data length: episodes of one length (fixed-length envs)
# share one, and its CRC is then computed once.
_HEADERS: dict[int, bytes] = {}


def frame_parts_of(parts: list, length: int) -> tuple[bytes, bytes]:
    """Returns (header, footer) for a record given as parts.

    Parts are `bytes` or read-only numpy uint8 arrays (CRC32C hashes them in
    place, without a copy).
    """
    header = _HEADERS.get(length)
    if header is None:
        if len(_HEADERS) >= 256:  # record lengths vary: keep the recent ones
            _HEADERS.clear()
        header = _LEN.pack(length)
        header = _HEADERS[length] = header + _CRC.pack(masked_crc32c(header))
    return header, _CRC.pack(_mask(_crc32c_parts(0, parts)))


def parse_header(header: bytes) -> int | None:
    """Returns the data length of a 12-byte record header, or None if it is damaged."""
    if len(header) < HEADER_SIZE:
        return None
    if masked_crc32c(header[:8]) != _CRC.unpack_from(header, 8)[0]:
        return None
    return _LEN.unpack_from(header, 0)[0]


def read_record(
    read_at: Any, offset: int, file_size: int, verify: bool = True
) -> tuple[bytes | None, int, str | None]:
    """Reads the record at `offset`, trusting no length beyond the file's size.

    Args:
      read_at: `read_at(offset, n)` returning up to n bytes at offset.
      offset: where the record starts.
      file_size: the file's size: a length field pointing past it is damage,
        never a reason to allocate.
      verify: check the data CRC.

    Returns:
      (data or None, offset of the next record or -1 if the framing is lost,
      problem or None).
    """
    header = read_at(offset, HEADER_SIZE)
    if len(header) < HEADER_SIZE:
        return None, -1, "truncated record header" if header else "unexpected end of file"
    length = parse_header(header)
    if length is None:
        return None, -1, "length CRC mismatch (garbage or torn header)"
    end = offset + FRAMING + length
    if end > file_size:
        return (
            None,
            -1,
            f"truncated record (needs {FRAMING + length} bytes, has {file_size - offset})",
        )
    body = read_at(offset + HEADER_SIZE, length + FOOTER_SIZE)
    if len(body) < length + FOOTER_SIZE:
        return None, -1, "truncated record"
    data = body[:length]
    if verify and masked_crc32c(data) != _CRC.unpack_from(body, length)[0]:
        return None, end, "data CRC mismatch"
    return data, end, None


def file_reader(f: BinaryIO) -> Any:
    """Returns `read_at(offset, n)` over a binary file object."""

    def read_at(offset: int, n: int) -> bytes:
        f.seek(offset)
        return f.read(n)

    return read_at


def iter_records(
    f: BinaryIO, path: str = "<file>", verify: bool = True
) -> Iterator[tuple[int, bytes]]:
    """Yields (offset, data) for each record of a whole file; raises on a bad one.

    Raises:
      CorruptRecordError: on a torn or corrupt record, with its offset and index.
    """
    size = os.fstat(f.fileno()).st_size
    read_at = file_reader(f)
    offset = 0
    index = 0
    while offset < size:
        data, nxt, problem = read_record(read_at, offset, size, verify)
        if problem:
            raise CorruptRecordError(path, offset, problem, index=index)
        yield offset, data
        offset = nxt
        index += 1


class Scan:
    """What a scan of a TFRecord file found.

    A plain class, not a dataclass: making one costs about 0.4 ms at import,
    which every new writer would pay (it imports this module to frame records).

    Attributes:
      spans: (offset, data length) of every good record, in file order.
      file_size: the file's size.
      tail_problem: why the bytes after the last good record (if any) are no
        record, or None.
      tail_offset: where that tail starts (the file size if there is none).
      dropped: (offset, size, reason) of each damaged region between good records.
    """

    __slots__ = ("spans", "file_size", "tail_problem", "tail_offset", "dropped")

    def __init__(
        self,
        spans: list[tuple[int, int]],
        file_size: int,
        tail_problem: str | None,
        tail_offset: int,
        dropped: list[tuple[int, int, str]],
    ):
        self.spans = spans
        self.file_size = file_size
        self.tail_problem = tail_problem
        self.tail_offset = tail_offset
        self.dropped = dropped

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Scan({fields})"

    @property
    def num_bytes(self) -> int:
        return sum(length for _, length in self.spans)

    def errors(self, path: str | os.PathLike) -> list[CorruptRecordError]:
        """The damage found, as the errors every tool reports (file, offset, record index).

        A record's index counts the good records before it, as a reader
        walking the file would.
        """
        out = []
        offsets = [offset for offset, _ in self.spans]
        damage = [(offset, reason) for offset, _, reason in self.dropped]
        if self.tail_problem:
            damage.append((self.tail_offset, self.tail_problem))
        for offset, reason in damage:
            index = sum(1 for good in offsets if good < offset)
            out.append(CorruptRecordError(os.fspath(path), offset, reason, index=index))
        return out

    @property
    def kept_end(self) -> int:
        """Offset just past the last good record."""
        if not self.spans:
            return 0
        offset, length = self.spans[-1]
        return offset + FRAMING + length


def scan(path: str | os.PathLike, verify_data: bool = True, resync: bool = False) -> Scan:
    """Walks a TFRecord file record by record.

    A record with a good header whose data fails its CRC is dropped and the
    walk goes on after it. A bad header loses the framing: without `resync`
    everything from there is the tail; with `resync` the walk looks for the
    next offset where a whole record checks (length CRC and data CRC), drops
    the bytes in between, and goes on, so one flipped bit costs one record.

    Args:
      path: a local file (opened without following symbolic links) or an
        object (`s3://...`: read with range requests through the storage
        seam; without `verify_data` only the 12-byte headers are fetched).
      verify_data: check every data CRC (without it only headers are checked).
      resync: resynchronise after a bad header (see above).

    Returns:
      A `Scan`.
    """
    from rlds_writer.store.storage import storage

    if storage.is_remote(path):
        remote = storage.storage_for(path).open_random(os.fspath(path))
        try:
            if remote.size == 0:
                return Scan([], 0, None, 0, [])
            return _scan(_RangeBuffer(remote), remote.size, verify_data, resync)
        finally:
            remote.close()
    fd = storage.open_regular(os.fspath(path), getattr(os, "O_NOFOLLOW", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return Scan([], 0, None, 0, [])
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as buf:
            return _scan(buf, size, verify_data, resync)
    finally:
        os.close(fd)


class _RangeBuffer:
    """The slicing and `find` that `_scan` uses, over a storage `RandomAccess`."""

    _CHUNK = 1 << 20

    def __init__(self, remote: Any):
        self._remote = remote

    def __getitem__(self, span: slice) -> bytes:
        return self._remote.read_at(span.start, span.stop - span.start)

    def find(self, tag: bytes, start: int, end: int) -> int:
        pos = start
        while pos < end:
            stop = min(end, pos + self._CHUNK + len(tag) - 1)
            found = self._remote.read_at(pos, stop - pos).find(tag)
            if found >= 0:
                return pos + found
            pos += self._CHUNK
        return -1


def _scan(buf: Any, size: int, verify_data: bool, resync: bool) -> Scan:
    def read_at(offset: int, n: int) -> bytes:
        return buf[offset : offset + n]

    spans: list[tuple[int, int]] = []
    dropped: list[tuple[int, int, str]] = []
    offset = 0
    while offset < size:
        if not verify_data:
            # Headers only: a remote shard is then never read past its frames.
            length, nxt, problem = _read_frame(read_at, offset, size)
            if problem is None:
                spans.append((offset, length))
                offset = nxt
                continue
            data = None
        else:
            data, nxt, problem = read_record(read_at, offset, size, verify_data)
        if problem is None:
            spans.append((offset, len(data)))
            offset = nxt
            continue
        if nxt >= 0:  # header fine, data damaged: the next record is known
            if nxt < size and _all_zeros(buf, nxt, size):
                # Killed while writing it into space written ahead: a crash's tail.
                return Scan(spans, size, TORN_INTO_ZEROS, offset, dropped)
            dropped.append((offset, nxt - offset, problem))
            offset = nxt
            continue
        found = _next_record(buf, read_at, offset + 1, size) if resync else None
        if found is None:
            if _all_zeros(buf, offset, size):
                problem = ZEROS_AHEAD
            return Scan(spans, size, problem, offset, dropped)
        dropped.append((offset, found - offset, problem))
        offset = found
    return Scan(spans, size, None, size, dropped)


def _all_zeros(buf: Any, start: int, end: int) -> bool:
    """True if `buf[start:end]` holds zero bytes only (read 1 MiB at a time)."""
    while start < end:
        chunk = buf[start : min(end, start + _ZERO_CHUNK)]
        if not chunk or chunk.count(0) != len(chunk):
            return False
        start += len(chunk)
    return True


_ZERO_CHUNK = 1 << 20


def _read_frame(read_at: Any, offset: int, file_size: int) -> tuple[int, int, str | None]:
    """(data length, next offset, problem) from a record's header alone."""
    header = read_at(offset, HEADER_SIZE)
    if len(header) < HEADER_SIZE:
        return 0, -1, "truncated record header" if header else "unexpected end of file"
    length = parse_header(header)
    if length is None:
        return 0, -1, "length CRC mismatch (garbage or torn header)"
    end = offset + FRAMING + length
    if end > file_size:
        return 0, -1, f"truncated record (needs {FRAMING + length} bytes, has {file_size - offset})"
    return length, end, None


def _next_record(buf: Any, read_at: Any, start: int, size: int) -> int | None:
    """Returns the first offset >= start holding a whole valid record, or None."""
    pos = start + HEADER_SIZE
    while True:
        pos = buf.find(_EXAMPLE_TAG, pos, size)
        if pos < 0:
            return None
        candidate = pos - HEADER_SIZE
        _, _, problem = read_record(read_at, candidate, size, verify=True)
        if problem is None:
            return candidate
        pos += 1


class _Window:
    """A `RandomAccess` (`size`, `read_at`) seen as the bytes `_scan` walks (slices, `find`)."""

    _CHUNK = 1 << 20

    def __init__(self, source: Any):
        self.source = source

    def __getitem__(self, item: slice) -> bytes:
        return self.source.read_at(item.start, item.stop - item.start)

    def find(self, sub: bytes, start: int, end: int) -> int:
        pos = start
        while pos < end:
            stop = min(end, pos + self._CHUNK)
            found = self.source.read_at(pos, stop - pos).find(sub)
            if found >= 0:
                return pos + found
            pos = stop
        return -1


def scan_random(source: Any, verify_data: bool = True, resync: bool = False) -> Scan:
    """`scan` over an opened file or object (`size`, `read_at(offset, n)`): object storage."""
    if source.size == 0:
        return Scan([], 0, None, 0, [])
    return _scan(_Window(source), source.size, verify_data, resync)


def walk_headers(source: Any, limit: int) -> tuple[list[int], int, str | None]:
    """Finds the offsets of the first `limit` records by their headers alone.

    Reads 12 bytes per record (never the data), so indexing a shard in object
    storage fetches its headers, not its records.

    Args:
      source: the file (`size`, `read_at(offset, n)`).
      limit: how many records to find at most.

    Returns:
      (offsets, offset where the walk stopped, problem there or None: None
      also when the file ends cleanly before `limit` records).
    """
    offsets: list[int] = []
    offset = 0
    size = source.size
    while len(offsets) < limit:
        if offset >= size:  # fewer records than asked for, the file ends cleanly
            return offsets, offset, None
        header = source.read_at(offset, HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            return offsets, offset, "truncated record header"
        length = parse_header(header)
        if length is None:
            return offsets, offset, "length CRC mismatch (garbage or torn header)"
        end = offset + FRAMING + length
        if end > size:
            return (
                offsets,
                offset,
                f"truncated record (needs {FRAMING + length} bytes, has {size - offset})",
            )
        offsets.append(offset)
        offset = end
    return offsets, offset, None
