"""Shard formats: one adapter per file format, in one table.

Like TFDS's `file_adapters.ADAPTER_FOR_FORMAT`: `ADAPTERS[file_format]` gives
the writer of a new shard (`open_writer`) and the readers every tool uses
to walk a whole shard (`records`, `count`). TFRecord frames come from
`store.tfrecord`; array_record from its own library. Nothing else in the
package branches on the file format.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Protocol

from etils import epath

from rlds_writer.store import layout, storage, tfrecord
from rlds_writer.store.object_path import as_path

_IOV_MAX = 1024
# Records smaller than this are joined into one bytes object before writing.
_JOIN_BELOW = 1 << 18
# array_record records read per call when walking a whole shard.
_ARRAY_RECORD_BATCH = 64


class ShardWriter(Protocol):
    """A shard being written: records in, `flush` to the OS, `close`."""

    file_format: str
    path: epath.Path
    num_records: int
    num_bytes: int

    def write(self, record: bytes | list[Any], length: int | None = None) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def _parts(record: bytes | list[Any], length: int | None) -> tuple[list[Any], int]:
    parts = [record] if isinstance(record, bytes | bytearray | memoryview) else record
    if length is None:
        length = sum(len(p) for p in parts)
    if len(parts) > 1 and length < _JOIN_BELOW:
        # Small record: one join beats per-part CRC and iovec handling.
        parts = [b"".join(parts)]
    return parts, length


class TFRecordShardWriter:
    """A TFRecord shard. Locally unbuffered: each record reaches the OS in one
    `writev`, so a written record is already flushed.

    Args:
      path: the new shard's path (must not exist; never a link).
      fsync: call `fsync` at every flush.
    """

    file_format = "tfrecord"

    def __init__(self, path: epath.Path, fsync: bool = False):
        self.path = path
        self.fsync = fsync
        self.num_records = 0
        self.num_bytes = 0
        self._fd: int | None = None
        self._f: Any = None
        if layout.is_local(path):
            # O_EXCL also refuses a symbolic link planted under the shard's name.
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if fsync:  # make the new directory entry durable too
                layout.fsync_directory(path.parent)
        else:
            # An object store: the shard is uploaded whole when it closes.
            self._f = storage.storage_for(path).open_shard_sink(os.fspath(path))

    def write(self, record: bytes | list[Any], length: int | None = None) -> None:
        """Appends one record, given whole or as bytes-like parts (no copy)."""
        parts, length = _parts(record, length)
        header, footer = tfrecord.frame_parts_of(parts, length)
        if self._fd is not None:
            _writev_all(self._fd, [header, *parts, footer], len(header) + length + len(footer))
        else:
            self._f.write_parts([header, *parts, footer])
        self.num_records += 1
        self.num_bytes += length

    def flush(self) -> None:
        """Hands everything written so far to the OS (and to the disk with fsync)."""
        if self._fd is not None:
            if self.fsync:
                os.fsync(self._fd)
            return
        self._f.flush()  # an object reaches the store only whole, at close

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        else:
            self._f.close()


class ArrayRecordShardWriter:
    """An array_record shard. Its writer cannot flush an open file: a shard is
    durable once closed."""

    file_format = "array_record"

    def __init__(self, path: epath.Path, fsync: bool = False):
        from array_record.python import array_record_module

        if path.exists() or (layout.is_local(path) and os.path.islink(path)):
            raise FileExistsError(f"shard file {path} already exists")  # its writer truncates
        self.path = path
        self.fsync = fsync
        self.num_records = 0
        self.num_bytes = 0
        self._local = os.fspath(path)
        self._upload: str | None = None
        if not layout.is_local(path):
            # Its writer needs a local file: written there, uploaded whole at close.
            import tempfile

            fd, self._local = tempfile.mkstemp(prefix="rlds_writer-", suffix=".array_record")
            os.close(fd)
            self._upload = os.fspath(path)
        self._f = array_record_module.ArrayRecordWriter(self._local, "group_size:1")

    def write(self, record: bytes | list[Any], length: int | None = None) -> None:
        parts, length = _parts(record, length)
        self._f.write(parts[0] if len(parts) == 1 else b"".join(parts))
        self.num_records += 1
        self.num_bytes += length

    def flush(self) -> None:
        """Nothing to do: array_record data reaches the file when the shard closes."""

    def close(self) -> None:
        self._f.close()
        if self._upload is not None:
            try:
                storage.storage_for(self._upload).upload(self._local, self._upload)
            finally:
                os.unlink(self._local)
            return
        if self.fsync and layout.is_local(self.path):
            layout.fsync_file(self.path)
            layout.fsync_directory(self.path.parent)


def _writev_all(fd: int, parts: list[Any], total: int) -> None:
    """Writes all parts (`total` bytes) with as few syscalls as possible, handling short writes.

    A record usually goes out in one `writev`; only a short write (or more
    than `_IOV_MAX` parts) leads to another.
    """
    views = [memoryview(p).cast("B") if not isinstance(p, bytes) else p for p in parts]
    i = 0
    while True:
        written = os.writev(fd, views[i : i + _IOV_MAX])
        total -= written
        if not total:
            return
        # Drop what this call wrote: whole parts, then the head of a part cut short.
        while written >= len(views[i]):
            written -= len(views[i])
            i += 1
        if written:
            views[i] = memoryview(views[i])[written:]


def tfrecord_records(path: epath.PathLike) -> Iterator[bytes]:
    """Yields the good records of a TFRecord shard in file order, skipping damage."""
    scan = tfrecord.scan(path, verify_data=True, resync=True)
    with as_path(path).open("rb") as f:
        for offset, length in scan.spans:
            f.seek(offset + tfrecord.HEADER_SIZE)
            yield f.read(length)


def array_record_records(path: epath.PathLike) -> Iterator[bytes]:
    """Yields the records of an array_record shard in order (raises if it is unreadable)."""
    from array_record.python import array_record_module

    layout.refuse_symlink(path, "shard file")
    with local_copy(path) as local:
        reader = array_record_module.ArrayRecordReader(local)
        try:
            n = reader.num_records()
            for start in range(0, n, _ARRAY_RECORD_BATCH):
                yield from reader.read(start, min(n, start + _ARRAY_RECORD_BATCH))
        finally:
            reader.close()


@contextlib.contextmanager
def local_copy(path: epath.PathLike) -> Iterator[str]:
    """A local file name for `path`: itself, or a temporary download of a remote object.

    For the array_record library, which opens files by name; TFRecord never
    needs it (range reads through the seam).
    """
    if layout.is_local(path):
        yield os.fspath(path)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlds_writer-") as tmp:
        local = os.path.join(tmp, as_path(path).name)
        storage.storage_for(path).download(os.fspath(path), local)
        yield local


class _Adapter:
    def __init__(self, file_format: str, writer: type, records: Any):
        self.file_format = file_format
        self._writer = writer
        self.records = records

    def open_writer(self, path: epath.Path, fsync: bool = False) -> ShardWriter:
        return self._writer(path, fsync)


ADAPTERS = {
    "tfrecord": _Adapter("tfrecord", TFRecordShardWriter, tfrecord_records),
    "array_record": _Adapter("array_record", ArrayRecordShardWriter, array_record_records),
}


def adapter(file_format: str) -> _Adapter:
    """Returns the adapter of a file format; raises ValueError for an unknown one."""
    try:
        return ADAPTERS[file_format]
    except KeyError:
        raise ValueError(
            f"file_format must be one of {tuple(ADAPTERS)}, got {file_format!r}"
        ) from None


def open_writer(path: epath.Path, file_format: str, fsync: bool = False) -> ShardWriter:
    """Opens a new shard file of `file_format` for writing."""
    return adapter(file_format).open_writer(path, fsync)
