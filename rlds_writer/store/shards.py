"""Shard file formats: one `FileFormat` object per format, in one table.

Like TFDS's `file_adapters.ADAPTER_FOR_FORMAT`: `FORMATS[file_format]` (or
`adapter(file_format)`) gives the writer of a new shard (`open_writer`), the
walk over a whole shard every tool uses (`records`), and what `recover` needs:
`check` (scan a shard: its good records, damage, a crash's torn tail) and the
repairs (`rewrite` with the good records, `cut` a torn tail). TFRecord frames
come from `store.tfrecord`; array_record from its own library. Nothing else in
store/ branches on the file format; a third format is one more class here.
Shards on object storage go through `store.storage` (uploaded whole at close).
"""

from __future__ import annotations

import contextlib
import dataclasses
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


@dataclasses.dataclass
class ShardCheck:
    """What checking one shard file found, and the repair it needs.

    Attributes:
      records: complete, valid records kept.
      num_bytes: their data bytes.
      file_size: the file's size.
      detail: what was wrong, one line each.
      removable: no record and only a crash's torn start: the file may be deleted
        (otherwise a file without records is set aside).
      rewrite: damage between records: rewrite the shard with its good records
        (the original set aside first).
      cut_to: a crash's torn tail: cut the file to this size.
    """

    records: int
    num_bytes: int
    file_size: int
    detail: list[str] = dataclasses.field(default_factory=list)
    removable: bool = False
    rewrite: bool = False
    cut_to: int | None = None
    scan: Any = None


class FileFormat:
    """One shard file format: its name (as in shard names and `fileFormat`),
    writing, reading every record, checking and repairing a shard.

    Attributes:
      name: `tfrecord`, `array_record`.
    """

    name = ""

    def open_writer(self, path: epath.Path, fsync: bool = False) -> ShardWriter:
        raise NotImplementedError

    def records(self, path: epath.PathLike) -> Iterator[bytes]:
        """The good records of a whole shard, in order."""
        raise NotImplementedError

    def check(self, path: Any, *, listed: int | None, last: bool, full: bool) -> ShardCheck:
        """Checks a shard (`last`: the end of its split, where a crash tears;
        `full`: check every record's data too)."""
        raise NotImplementedError

    def rewrite(self, path: Any, check: ShardCheck) -> str:
        """Rewrites a damaged shard with its good records; returns the name the
        original is kept under."""
        raise NotImplementedError

    def cut(self, path: Any, size: int) -> None:
        """Cuts a crash's torn tail off the shard."""
        raise NotImplementedError


class TFRecordFormat(FileFormat):
    """TFRecord: length-prefixed, CRC-framed records (`store.tfrecord`)."""

    name = "tfrecord"

    def open_writer(self, path: epath.Path, fsync: bool = False) -> ShardWriter:
        return TFRecordShardWriter(path, fsync)

    def records(self, path: epath.PathLike) -> Iterator[bytes]:
        return tfrecord_records(path)

    def check(self, path: Any, *, listed: int | None, last: bool, full: bool) -> ShardCheck:
        # Headers only where the listing agrees (a quick check); the last shard,
        # where a crash leaves its tear, and any disagreement get a full check.
        scan = tfrecord.scan(path, verify_data=full or last, resync=True)
        if not (full or last) and (listed is None or len(scan.spans) != listed):
            scan = tfrecord.scan(path, verify_data=True, resync=True)
        check = ShardCheck(len(scan.spans), scan.num_bytes, scan.file_size, scan=scan)
        if scan.tail_problem:
            cut = scan.file_size - scan.tail_offset
            check.detail.append(f"{scan.tail_problem} at byte {scan.tail_offset}, {cut} bytes")
        for offset, size, reason in scan.dropped:
            check.detail.append(f"{reason} at byte {offset} ({size} bytes dropped)")
        if not scan.spans:
            if scan.file_size:
                check.detail.append("no complete record")
            # Only the start of a first record cut short by a crash may be deleted.
            check.removable = bool(
                last and not scan.dropped and (scan.tail_problem or "").startswith("truncated")
            )
            return check
        # A crash tears only the end of the shard being written (the last one);
        # anything else is damage, kept aside before the shard is rewritten.
        crash_tail = last and not scan.dropped and scan.kept_end == scan.tail_offset
        if scan.dropped or (scan.kept_end < scan.file_size and not crash_tail):
            check.rewrite = True
        elif scan.kept_end < scan.file_size:
            check.cut_to = scan.kept_end
        return check

    def rewrite(self, path: Any, check: ShardCheck) -> str:
        if not layout.is_local(path):
            return _rewrite_remote_tfrecord(path, check.scan)
        tmp = path.parent / f".{path.name}.recover-tmp"
        try:
            # A fixed name: a leftover (or planted link) there is removed, never written through.
            dst_file = os.fdopen(layout.create_exclusive(tmp, replace_stale=True), "wb")
            with path.open("rb") as src, dst_file as dst:
                for offset, length in check.scan.spans:
                    src.seek(offset)
                    dst.write(src.read(length + tfrecord.FRAMING))
            layout.fsync_file(tmp)
        except BaseException:
            # The original is untouched; do not leave a partial copy filling the disk.
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        keep = path.parent / layout.quarantine_name(path.name)
        os.link(path, keep)
        tmp.replace(path)
        return keep.name

    def cut(self, path: Any, size: int) -> None:
        if layout.is_local(path):
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        # An object cannot be cut: its first `size` bytes replace it (one shard).
        store = storage.storage_for(path)
        store.replace_bytes(os.fspath(path), store.read_bytes(os.fspath(path), limit=size))


def _rewrite_remote_tfrecord(path: Any, scan: tfrecord.Scan) -> str:
    # The good records, by range reads, into a local file; the original object
    # is copied aside, then replaced whole by one upload.
    import tempfile

    store = storage.storage_for(path)
    with tempfile.TemporaryDirectory(prefix="rlds_writer-recover-") as tmp:
        local = os.path.join(tmp, path.name)
        source = store.open_random(os.fspath(path))
        try:
            with open(local, "wb") as dst:
                for offset, length in scan.spans:
                    dst.write(source.read_at(offset, length + tfrecord.FRAMING))
        finally:
            source.close()
        keep = path.parent / layout.quarantine_name(path.name)
        store.copy(os.fspath(path), os.fspath(keep))
        store.upload(local, os.fspath(path))
    return keep.name


class ArrayRecordFormat(FileFormat):
    """array_record: durable per closed shard; a damaged shard is set aside whole."""

    name = "array_record"

    def open_writer(self, path: epath.Path, fsync: bool = False) -> ShardWriter:
        return ArrayRecordShardWriter(path, fsync)

    def records(self, path: epath.PathLike) -> Iterator[bytes]:
        return array_record_records(path)

    def check(self, path: Any, *, listed: int | None, last: bool, full: bool) -> ShardCheck:
        size = as_path(path).stat().length
        records = nbytes = 0
        problem = None
        if size:
            try:
                for record in array_record_records(path):
                    records += 1
                    nbytes += len(record)
            except Exception as e:  # noqa: BLE001 - a torn file raises many kinds
                records, nbytes, problem = 0, 0, f"unreadable: {e}"
        check = ShardCheck(records, nbytes, size)
        if problem:
            check.detail.append(problem)
        return check


# The file formats, by the name shard names and `fileFormat` use. A third format
# is one more `FileFormat` here.
FORMATS: dict[str, FileFormat] = {f.name: f for f in (TFRecordFormat(), ArrayRecordFormat())}
# Kept under its first name for the tools that walk whole shards.
ADAPTERS = FORMATS


def adapter(file_format: str) -> FileFormat:
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
