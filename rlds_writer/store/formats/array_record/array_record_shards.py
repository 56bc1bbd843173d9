"""array_record shards: the `FileFormat` of riegeli files with random access built in.

Its writer cannot flush an open file, so a shard is durable once closed; its
reader (riegeli, in C++) opens local files by name, so a shard in object
storage is written locally and uploaded at close, and read from a local copy.
A damaged shard cannot be cut or partly rewritten: `recover` sets it aside whole.
TFDS reads this format through `as_data_source` only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer.errors import CorruptArrayRecordError, UnsupportedFeatureError
from rlds_writer.store.formats.shard_format import (
    FileFormat,
    PerProcess,
    ShardCheck,
    ShardWalk,
    join_parts,
)
from rlds_writer.store.storage import file_io, storage, unsaved_shards
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)

# array_record records read per call when walking a whole shard.
_ARRAY_RECORD_BATCH = 64


class ArrayRecordShardWriter:
    """An array_record shard. Its writer cannot flush an open file: a shard is
    durable once closed."""

    file_format = "array_record"

    def __init__(self, path: epath.Path, fsync: bool = False):
        from array_record.python import array_record_module

        if file_io.is_local(path) and (path.exists() or os.path.islink(path)):
            raise FileExistsError(f"shard file {path} already exists")  # its writer truncates
        self.path = path
        self.fsync = fsync
        self.num_records = 0
        self.num_bytes = 0
        self._local = os.fspath(path)
        self._upload: str | None = None
        if not file_io.is_local(path):
            # Its writer needs a local file: written there, uploaded whole at close.
            self._local = unsaved_shards.staging_file(".array_record")
            self._upload = os.fspath(path)
        self._f = array_record_module.ArrayRecordWriter(self._local, "group_size:1")

    def write(self, record: bytes | list[Any], length: int | None = None) -> None:
        parts, length = join_parts(record, length)
        self._f.write(parts[0] if len(parts) == 1 else b"".join(parts))
        self.num_records += 1
        self.num_bytes += length

    def flush(self) -> None:
        """Nothing to do: array_record data reaches the file when the shard closes."""

    def close(self) -> None:
        self._f.close()
        if self._upload is not None:
            store = storage.storage_for(self._upload)
            unsaved_shards.upload_or_keep(store, self._local, self._upload)
            return
        if self.fsync and file_io.is_local(self.path):
            file_io.fsync_file(self.path)
            file_io.fsync_directory(self.path.parent)


def array_record_records(path: epath.PathLike) -> Iterator[bytes]:
    """Yields the records of an array_record shard in order (raises if it is unreadable)."""
    from array_record.python import array_record_module

    file_io.refuse_symlink(path, "shard file")
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
    if file_io.is_local(path):
        yield os.fspath(path)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlds_writer-") as tmp:
        local = os.path.join(tmp, as_path(path).name)
        storage.storage_for(path).download(os.fspath(path), local)
        yield local


class ArrayRecordShard(PerProcess):
    """One array_record shard: array_record's own reader gives random access.

    Its reader opens a local path (`OPENS_PATHS`): for a shard in object
    storage, `opener` gives a local copy of that one object
    (`Dataset.local_file`), fetched again if the cache evicted it.
    """

    OPENS_PATHS = True

    _HANDLE = "_reader"

    def __init__(
        self,
        path: str,
        num_records: int,
        verify: bool,
        cache_path: str | None,
        skip: bool = False,
        opener: Callable[[], Any] | None = None,
    ):
        del verify, cache_path, skip  # array_record checks its own chunk hashes
        if opener is None and not file_io.is_local(path):
            raise UnsupportedFeatureError(
                f"{path}: array_record's reader opens local files only; pass an opener that "
                "gives a local copy (`Dataset.local_file`)"
            )
        self.path = path
        # Returns the local file to open: the shard itself, or a (re)fetched cached copy.
        self.local_path = opener or functools.partial(str, path)
        self.num_records = num_records
        self._reader: Any = None
        self._reader_pid = 0
        self._steps: np.ndarray | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @staticmethod
    def _open(path: str, options: str) -> Any:
        from array_record.python.array_record_module import ArrayRecordReader

        return ArrayRecordReader(path, options)

    def _check_count(self, reader: Any) -> None:
        n = reader.num_records()
        if n < self.num_records:
            raise CorruptArrayRecordError(
                self.path, n, f"file holds {n} records, dataset_info.json lists {self.num_records}"
            )

    def read(self, i: int) -> bytes:
        with self._lock:
            if self._reader is None or self._reader_pid != os.getpid():
                try:
                    reader = self._open(
                        self.local_path(), "readahead_buffer_size:0,max_parallelism:0"
                    )
                except Exception as e:  # noqa: BLE001 - riegeli raises plain RuntimeErrors
                    raise CorruptArrayRecordError(self.path, i, str(e)) from e
                self._check_count(reader)
                self._reader = reader
                self._reader_pid = os.getpid()
            try:
                return self._reader.read([i])[0]
            except Exception as e:  # noqa: BLE001
                raise CorruptArrayRecordError(self.path, i, str(e)) from e

    def iter(self, start: int, stop: int, skip: bool) -> Iterator[tuple[int, bytes]]:
        if start >= stop:
            return
        try:
            reader = self._open(self.local_path(), "")
        except Exception as e:  # noqa: BLE001
            if not skip:
                raise CorruptArrayRecordError(self.path, start, str(e)) from e
            _log.warning("%s: skipping unreadable file: %s", self.path, e)
            return
        try:
            self._check_count(reader)
            chunk = 32
            for a in range(start, stop, chunk):
                b = min(a + chunk, stop)
                try:
                    records = reader.read(a, b)
                except Exception:  # noqa: BLE001 - retry one by one to isolate the bad record
                    records = None
                if records is not None:
                    yield from zip(range(a, b), records)
                    continue
                for i in range(a, b):
                    try:
                        data = reader.read([i])[0]
                    except Exception as e:  # noqa: BLE001
                        if not skip:
                            raise CorruptArrayRecordError(self.path, i, str(e)) from e
                        _log.warning("%s: skipping corrupt record %d: %s", self.path, i, e)
                        continue
                    yield i, data
        finally:
            reader.close()

    @property
    def cached_steps(self) -> np.ndarray | None:
        return self._steps

    def store_steps(self, steps: np.ndarray) -> None:
        self._steps = steps


class ArrayRecordFormat(FileFormat):
    """array_record: durable per closed shard; a damaged shard is set aside whole."""

    name = "array_record"
    tfds_reader = "as_data_source"  # TFDS has no tf.data reader for it
    opens_paths = True

    writer_class = ArrayRecordShardWriter
    reader_class = ArrayRecordShard

    def records(self, path: epath.PathLike, *, strict: bool = False) -> Iterator[bytes]:
        # Its reader raises for a damaged file: every walk is strict.
        return array_record_records(path)

    def walk(
        self,
        dataset: Any,
        name: str,
        *,
        verify_data: bool,
        visit: Callable[[bytes], None] | None = None,
        visit_first: int = 0,
    ) -> ShardWalk:
        # Its reader opens paths: a shard in object storage is copied (that shard only).
        out = ShardWalk()
        for index, record in enumerate(array_record_records(dataset.local_file(name))):
            out.found += 1
            if visit is not None and index < visit_first:
                visit(record)
        return out

    def check(self, path: Any, *, listed: int | None, last: bool, full: bool) -> ShardCheck:
        size = as_path(path).stat().st_size
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
