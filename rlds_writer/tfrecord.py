"""TFRecord framing: writing and scanning records without TensorFlow.

A TFRecord file is a sequence of records, each laid out as::

    uint64 length (little endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

The mask is `((crc >> 15) | (crc << 17)) + 0xa282ead8` modulo 2**32.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_SIZE = 12
FOOTER_SIZE = 4


def masked_crc32c(data: bytes | memoryview) -> int:
    """Returns the masked CRC32C of `data`, as TFRecord stores it."""
    crc = (
        google_crc32c.value(bytes(data))
        if isinstance(data, memoryview)
        else google_crc32c.value(data)
    )
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """Returns the record framed as TFRecord bytes (header, data, footer)."""
    length = _LEN.pack(len(record))
    return b"".join(
        (length, _CRC.pack(masked_crc32c(length)), record, _CRC.pack(masked_crc32c(record)))
    )


def frame_parts_of(parts: list, length: int) -> tuple[bytes, bytes]:
    """Returns (header, footer) for a record given as parts.

    Parts are `bytes` or read-only numpy uint8 arrays (CRC32C hashes them in
    place, without a copy).
    """
    header = _LEN.pack(length)
    header += _CRC.pack(masked_crc32c(header))
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    masked = (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
    return header, _CRC.pack(masked)


class CorruptRecordError(IOError):
    """A TFRecord record failed its length or CRC check.

    Attributes:
      path: the file.
      offset: byte offset of the bad record.
    """

    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(f"{path}: corrupt TFRecord at byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


@dataclasses.dataclass
class ScanResult:
    """What a scan of a TFRecord file found.

    Attributes:
      num_records: complete, valid records from the start of the file.
      num_bytes: sum of their data lengths (what TFDS counts as `numBytes`).
      valid_size: byte offset just past the last valid record.
      file_size: size of the file.
      problem: why scanning stopped before the end of the file, or None.
    """

    num_records: int
    num_bytes: int
    valid_size: int
    file_size: int
    problem: str | None = None


def iter_records(
    f: BinaryIO, path: str = "<file>", verify: bool = True
) -> Iterator[tuple[int, bytes]]:
    """Yields (offset, data) for each record; raises on a bad one.

    Args:
      f: a binary file positioned at the start of a record.
      path: the file's name, for error messages.
      verify: check the data CRC of every record.

    Raises:
      CorruptRecordError: on a torn or corrupt record.
    """
    offset = f.tell()
    while True:
        header = f.read(HEADER_SIZE)
        if not header:
            return
        if len(header) < HEADER_SIZE:
            raise CorruptRecordError(path, offset, "truncated header")
        (length,) = _LEN.unpack_from(header, 0)
        (length_crc,) = _CRC.unpack_from(header, 8)
        if masked_crc32c(header[:8]) != length_crc:
            raise CorruptRecordError(path, offset, "length CRC mismatch")
        data = f.read(length)
        footer = f.read(FOOTER_SIZE)
        if len(data) < length or len(footer) < FOOTER_SIZE:
            raise CorruptRecordError(path, offset, "truncated record")
        if verify and masked_crc32c(data) != _CRC.unpack(footer)[0]:
            raise CorruptRecordError(path, offset, "data CRC mismatch")
        yield offset, data
        offset += HEADER_SIZE + length + FOOTER_SIZE


def scan(f: BinaryIO, file_size: int, path: str = "<file>") -> ScanResult:
    """Counts the valid records of a TFRecord file, stopping at the first bad one.

    Args:
      f: the file, opened for binary reading at offset 0.
      file_size: its size in bytes.
      path: the file's name, for messages.

    Returns:
      A `ScanResult`.
    """
    count = 0
    nbytes = 0
    valid = 0
    try:
        for offset, data in iter_records(f, path):
            count += 1
            nbytes += len(data)
            valid = offset + HEADER_SIZE + len(data) + FOOTER_SIZE
    except CorruptRecordError as e:
        return ScanResult(count, nbytes, valid, file_size, e.reason)
    return ScanResult(count, nbytes, valid, file_size, None)
