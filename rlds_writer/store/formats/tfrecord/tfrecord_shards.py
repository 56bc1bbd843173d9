"""TFRecord shards: the `FileFormat` of length-prefixed, CRC-framed records.

Written unbuffered (each record has reached the OS when its write returns,
in one `writev` or, past 1 MiB, several: `storage.writev_all`; so an episode
is durable when it ends; small records go into zeros written ahead of them,
`store.formats.tfrecord.write_ahead`, cut off at close), walked and checked by
`store.formats.tfrecord.tfrecord`'s scan (length and data CRCs, resynchronising after a
damaged header), repaired by rewriting the good records or cutting a crash's
torn tail (zeros written ahead included), and read at random through
`store.formats.tfrecord.tfrecord_reader.TFRecordShard` (an index of record offsets).
Shards on object storage go through `store.storage.storage` (uploaded whole at close).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rlds_writer.store.formats.shard_format import (
    FileFormat,
    ShardCheck,
    ShardWalk,
    join_parts,
    quarantine_name,
)
from rlds_writer.store.formats.tfrecord import tfrecord, write_ahead
from rlds_writer.store.storage import file_io, storage
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath


def write_parts(fd: int, parts: list[Any], total: int) -> None:
    """`storage.writev_all`; a record over 1 MiB in C where the extension is built
    (`write_ahead.parts_writer`): cut into 1 MiB `writev`s without Python per
    part (a record of camera frames is two parts per frame). A smaller one is
    one `os.writev` anyway (and a short recording need not load the extension)."""
    write_all = write_ahead.parts_writer() if total > storage.WRITE_CALL_BYTES else None
    if write_all is None:
        storage.writev_all(fd, parts, total)
    else:
        write_all(fd, parts)


# A write refused for room: zeros written ahead may hold it (`_room_from_zeros`).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


class TFRecordShardWriter:
    """A TFRecord shard. Locally unbuffered: each record has reached the OS when
    `write` returns, so a written record is already flushed.

    Small records are written into zeros written ahead of them
    (`store.formats.tfrecord.write_ahead`; not with `fsync`, nor on object storage); `close`
    cuts the zeros off, so a closed shard holds its records only.

    Args:
      path: the new shard's path (must not exist; never a link).
      fsync: call `fsync` at every flush.
      max_records: the most records it will take, where known.
      fd: a local shard already created (without fsync) and written by the caller
        (`adopt`), whose descriptor it takes over.
    """

    file_format = "tfrecord"

    def __init__(
        self,
        path: epath.Path,
        fsync: bool = False,
        max_records: int | None = None,
        fd: int | None = None,
    ):
        self.path = path
        self.fsync = fsync
        self.num_records = 0
        self.num_bytes = 0
        self._fd: int | None = None
        self._f: Any = None
        # The most records the shard will take, where its writer says
        # (`FileFormat.open_writer`): writing ahead does not start for the last few.
        self.max_records = max_records
        self._end = 0  # where the records end
        self._ahead: write_ahead.WriteAhead | None = None
        self._check_at = write_ahead.NEVER  # the next record ending past it calls `before`
        if fd is not None:  # created (O_EXCL) and written by `_shard_files.c`
            self._fd = fd
            self._ahead = write_ahead.WriteAhead(fd)
            self._check_at = 0
        elif file_io.is_local(path):
            # O_EXCL also refuses a symbolic link planted under the shard's name.
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if fsync:  # make the new directory entry durable too
                file_io.fsync_directory(path.parent)
            else:  # (an fsync would write the zeros to disk too)
                self._ahead = write_ahead.WriteAhead(self._fd)
                self._check_at = 0
        else:
            # An object store: the shard is uploaded whole when it closes.
            self._f = storage.storage_for(path).open_shard_sink(os.fspath(path))

    def write(self, record: bytes | list[Any], length: int | None = None) -> None:
        """Appends one record, given whole or as bytes-like parts (no copy)."""
        parts, length = join_parts(record, length)
        header, footer = tfrecord.frame_parts_of(parts, length)
        if self._fd is not None:
            total = len(header) + length + len(footer)
            end = self._end + total
            if end > self._check_at:
                left = None if self.max_records is None else self.max_records - self.num_records
                self._check_at = self._ahead.before(self._end, end, left)
            self._write_local([header, *parts, footer], total, end)
            self._end = end
        else:
            self._f.write_parts([header, *parts, footer])
        self.num_records += 1
        self.num_bytes += length

    def write_framed(self, framed: Any, count: int, data_bytes: int) -> None:
        """Appends `count` records already framed end to end (`store.batch_records`)."""
        total = len(framed)
        if self._fd is not None:
            end = self._end + total
            if end > self._check_at:
                left = None if self.max_records is None else self.max_records - self.num_records
                self._check_at = self._ahead.before(self._end, end, left)
            self._write_local([framed], total, end)
            self._end = end
        else:
            self._f.write_parts([framed])
        self.num_records += count
        self.num_bytes += data_bytes

    @property
    def end(self) -> int:
        """Where the records end in the file (its size, but for zeros written ahead)."""
        return self._end

    def plain_fd(self) -> int | None:
        """The descriptor, where the caller may append records by a plain write at
        the records' end (`appended`): a local shard without fsync and without zeros
        written ahead (which a write from elsewhere would race); else None."""
        if self._fd is None or self.fsync:
            return None
        ahead = self._ahead
        if ahead is not None and not ahead.quiet:
            return None
        return self._fd

    def appended(self, count: int, data_bytes: int, total: int, closed: bool = False) -> None:
        """Counts `count` records (`total` bytes framed) the caller wrote at the records'
        end through `plain_fd` (`_shard_files.c`); `closed`: it closed the descriptor too."""
        self.num_records += count
        self.num_bytes += data_bytes
        self._end += total
        if closed:
            self._fd = self._ahead = None

    def _write_local(self, parts: list[Any], total: int, end: int) -> None:
        """Writes `parts` (`total` bytes, up to `end`) whole at the records' end,
        once more if zeros written ahead may have taken the room."""
        try:
            if self._ahead is None or not self._ahead.write(parts, end, total):
                write_parts(self._fd, parts, total)
        except OSError as error:
            if not self._room_from_zeros(error):
                raise
            write_parts(self._fd, parts, total)

    def _room_from_zeros(self, error: OSError) -> bool:
        """After a write refused for room: True if zeros written ahead may have
        taken it and are cut now (the file and its position back at the records'
        end, writing ahead stopped), so the write is tried once more."""
        if error.errno not in _NO_ROOM or self._ahead is None:
            return False
        self._check_at = write_ahead.NEVER
        if not self._ahead.give_back(self._end):
            return False
        # The failed write may have moved the position past part of the record.
        os.lseek(self._fd, self._end, os.SEEK_SET)
        return True

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
            try:
                if self._ahead is not None:  # a listed shard holds its records only
                    self._ahead.cut(self._end)
            finally:
                os.close(fd)
        else:
            self._f.close()


def tfrecord_records(path: epath.PathLike, strict: bool = False) -> Iterator[bytes]:
    """Yields the good records of a TFRecord shard in file order, skipping damage.

    With `strict`, damage raises `CorruptRecordError` (naming the file and offset)
    before any record is yielded.
    """
    scan = tfrecord.scan(path, verify_data=True, resync=True)
    if strict:
        errors = scan.errors(path)
        if errors:
            raise errors[0]
    with as_path(path).open("rb") as f:
        for offset, length in scan.spans:
            f.seek(offset + tfrecord.HEADER_SIZE)
            yield f.read(length)


class TFRecordFormat(FileFormat):
    """TFRecord: length-prefixed, CRC-framed records (`store.formats.tfrecord.tfrecord`)."""

    name = "tfrecord"

    writer_class = TFRecordShardWriter
    reader_class = "rlds_writer.store.formats.tfrecord.tfrecord_reader:TFRecordShard"

    def open_writer(
        self, path: epath.Path, fsync: bool = False, max_records: int | None = None
    ) -> TFRecordShardWriter:
        return TFRecordShardWriter(path, fsync, max_records)

    def records(self, path: epath.PathLike, *, strict: bool = False) -> Iterator[bytes]:
        return tfrecord_records(path, strict)

    def walk(
        self,
        dataset: Any,
        name: str,
        *,
        verify_data: bool,
        visit: Callable[[bytes], None] | None = None,
        visit_first: int = 0,
    ) -> ShardWalk:
        source = dataset.open_file(name)
        try:
            if dataset.is_local:
                # A mapped file: the fastest walk (the same scan as recover's).
                scan = tfrecord.scan(dataset.file(name), verify_data=verify_data, resync=True)
            else:
                scan = tfrecord.scan_random(source, verify_data=verify_data, resync=True)
            out = ShardWalk(len(scan.spans), scan.errors(dataset.file(name)))
            if visit is not None:
                for offset, length in scan.spans[:visit_first]:
                    visit(source.read_at(offset + tfrecord.HEADER_SIZE, length))
        finally:
            source.close()
        return out

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
        problem = scan.tail_problem or ""
        # Zeros written ahead are only ever left in a shard not listed yet; in
        # a listed one, a record followed by zeros is damage like any other.
        listed_torn_into_zeros = problem == tfrecord.TORN_INTO_ZEROS and listed is not None
        if not scan.spans:
            if scan.file_size:
                check.detail.append("no complete record")
            # Only what a crash leaves before a first record is complete may be
            # deleted: its start, or the zeros written ahead of it.
            check.removable = bool(
                last
                and not scan.dropped
                and (
                    problem.startswith("truncated")
                    or (problem in tfrecord.CRASH_TAILS and listed is None)
                )
            )
            return check
        # A crash tears only the end of the shard being written (the last one);
        # anything else is damage, kept aside before the shard is rewritten.
        crash_tail = (
            last
            and not scan.dropped
            and scan.kept_end == scan.tail_offset
            and not listed_torn_into_zeros
        )
        if scan.dropped or (scan.kept_end < scan.file_size and not crash_tail):
            check.rewrite = True
        elif scan.kept_end < scan.file_size:
            check.cut_to = scan.kept_end
        return check

    def rewrite(self, path: Any, check: ShardCheck) -> str:
        if not file_io.is_local(path):
            return _rewrite_remote_tfrecord(path, check.scan)
        tmp = path.parent / f".{path.name}.recover-tmp"
        try:
            # A fixed name: a leftover (or planted link) there is removed, never written through.
            dst_file = os.fdopen(file_io.create_exclusive(tmp, replace_stale=True), "wb")
            with path.open("rb") as src, dst_file as dst:
                for offset, length in check.scan.spans:
                    src.seek(offset)
                    dst.write(src.read(length + tfrecord.FRAMING))
            file_io.fsync_file(tmp)
        except BaseException:
            # The original is untouched; do not leave a partial copy filling the disk.
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        keep = path.parent / quarantine_name(path.name)
        os.link(path, keep)
        tmp.replace(path)
        return keep.name

    def cut(self, path: Any, size: int) -> None:
        if file_io.is_local(path):
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
        keep = path.parent / quarantine_name(path.name)
        store.copy(os.fspath(path), os.fspath(keep))
        store.upload(local, os.fspath(path))
    return keep.name
