"""Random access to a TFRecord shard: `TFRecordShard`, an index of record offsets.

The index walks record headers only (one pass, cached on disk for local
datasets, checked against the file before it is trusted), so one episode of a
shard in a bucket fetches that episode. Frames are parsed by
`store.formats.tfrecord.tfrecord`; the reader pickles without its open handle, so DataLoader
workers reopen it. `store.formats.tfrecord.tfrecord_shards.TFRecordFormat.open_reader` makes it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from rlds_writer.errors import CorruptRecordError
from rlds_writer.store.formats.shard_format import PerProcess
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.storage import file_io, storage

_log = logging.getLogger(__name__)


class _ReadAhead:
    """Sequential reads in 1 MiB windows over a `RandomAccess`: one call per window, not
    two per record (small records are the common case)."""

    _WINDOW = 1 << 20

    def __init__(self, source: Any, limit: int):
        self.source = source
        self.limit = limit  # never read ahead past this offset (the last record wanted)
        self._start = 0
        self._data = b""

    def read_at(self, offset: int, n: int) -> bytes:
        end = offset + n
        held = self._start + len(self._data)
        if self._start <= offset and end <= held:
            return self._data[offset - self._start : end - self._start]
        if self._start <= offset < held:
            # A record across the window's end: keep the part held and fetch on from
            # there (fetching it again from its start cost a record per window: 20%
            # more bytes for 270 KB records).
            more = max(end - held, min(self._WINDOW, self.limit - held))
            self._data = self._data[offset - self._start :] + self.source.read_at(held, more)
            self._start = offset
            return self._data[:n]
        if n >= self._WINDOW:  # a large record: read it alone
            return self.source.read_at(offset, n)
        window = max(n, min(self._WINDOW, self.limit - offset))
        self._start = offset
        self._data = self.source.read_at(offset, window)
        return self._data[:n]


def _sequential(
    source: Any, limit: int, stack: contextlib.ExitStack
) -> Callable[[int, int], bytes]:
    """`read_at` for a front-to-back walk of `source`.

    A local file (it has a `fileno`) is read through a 1 MiB buffered file, as
    fast as Python reads files; an object through `_ReadAhead` windows that
    stop at `limit`.
    """
    fileno = getattr(source, "fileno", None)
    if fileno is not None:
        f = stack.enter_context(os.fdopen(os.dup(fileno()), "rb", buffering=1 << 20))
        return tfrecord.file_reader(f)
    return _ReadAhead(source, limit).read_at


class _Walker:
    """`size` and `read_at`, as `tfrecord.walk_headers` takes them."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int):
        self.read_at = read_at
        self.size = size


class TFRecordShard(PerProcess):
    """One tfrecord shard: sequential reads, and random access via an offset index.

    The file is read through a `RandomAccess` (`store.storage.storage`: `pread` on a
    local file, range requests on an object), never by path.

    Args:
      path: the file (for messages, and the disk index cache's stat key).
      num_records: records listed for it in dataset_info.json.
      verify: check data CRCs.
      cache_path: where to save the offset index (local datasets), or None.
      skip: on a broken record header, index the records before it (with a
        warning) instead of raising.
      opener: returns the file opened for range reads (default: the local file,
        never through a symbolic link).
    """

    _HANDLE = "_source"

    def __init__(
        self,
        path: str,
        num_records: int,
        verify: bool,
        cache_path: str | None,
        skip: bool = False,
        opener: Callable[[], Any] | None = None,
    ):
        self.skip = skip
        self.path = path
        self.num_records = num_records
        self.verify = verify
        self.cache_path = cache_path
        self.opener = opener or functools.partial(storage.LocalRandomAccess, path)
        self._offsets: np.ndarray | None = None
        self._steps: np.ndarray | None = None
        self._source: Any = None
        self._source_pid = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._source is not None and self._source_pid == os.getpid():
            self._source.close()
        self._source = None

    def source(self) -> Any:
        """The file opened for range reads, reopened in a forked child."""
        with self._lock:
            if self._source is None or self._source_pid != os.getpid():
                self._source = self.opener()
                self._source_pid = os.getpid()
            return self._source

    def offsets(self) -> np.ndarray:
        """Byte offset of each listed record, from one pass over the record headers."""
        if self._offsets is None:
            self._load_cache()
        if self._offsets is None:
            self._offsets = self._scan_offsets()
            if self._offsets.size == self.num_records:  # never cache a partial index
                self._save_cache()
        return self._offsets

    def _scan_offsets(self) -> np.ndarray:
        # Headers only (records past the listed ones, a writer still appending, are ignored).
        source = self.source()
        with contextlib.ExitStack() as stack:
            if hasattr(source, "fileno"):  # a local file: through a buffered file, fastest
                source = _Walker(_sequential(source, source.size, stack), source.size)
            # An object: small range requests for the headers, never the records between.
            found, at, problem = tfrecord.walk_headers(source, self.num_records)
        offsets = np.array(found, np.int64)
        if offsets.size < self.num_records:
            listed = f"{self.num_records} records listed in dataset_info.json"
            where = f"{problem or 'records missing'} ({listed})"
            if not self.skip:
                raise CorruptRecordError(self.path, at, where, index=offsets.size)
            _log.warning("%s: records from offset %d on are lost: %s", self.path, at, where)
        return offsets

    def _chain_ok(self, offsets: np.ndarray) -> bool:
        """True if `offsets` is this file's record chain (each header leads to the next)."""
        source = self.source()
        expected = 0
        for offset in offsets.tolist():
            if offset != expected:
                return False
            length = tfrecord.parse_header(source.read_at(offset, tfrecord.HEADER_SIZE))
            if length is None:
                return False
            expected = offset + tfrecord.FRAMING + length
            if expected > source.size:
                return False
        return True

    def _stat_key(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_size, st.st_mtime_ns

    def _cache_linked(self) -> bool:
        """True if the cache directory or file is a link (it could lead out of the dataset)."""
        linked = os.path.islink(os.path.dirname(self.cache_path)) or os.path.islink(self.cache_path)
        if linked:
            _log.warning("ignoring index cache %s: a symbolic link", self.cache_path)
        return linked

    def _load_cache(self) -> None:
        if not self.cache_path or not os.path.exists(self.cache_path) or self._cache_linked():
            return
        try:
            with np.load(self.cache_path) as z:
                if tuple(int(x) for x in z["stat"]) != self._stat_key():
                    return
                if int(z["num_records"]) != self.num_records:
                    return
                if z["offsets"].shape != (self.num_records,) or z["offsets"].dtype.kind not in "iu":
                    return
                # The cache sits in the dataset directory: never trust it blindly.
                if not self._chain_ok(np.asarray(z["offsets"], np.int64)):
                    _log.warning(
                        "ignoring index cache %s: it does not match the file", self.cache_path
                    )
                    return
                self._offsets = np.asarray(z["offsets"], np.int64)
                steps = z["steps"]
                if (
                    self._steps is None
                    and steps.shape == (self.num_records,)
                    and steps.dtype.kind in "iu"
                    and (steps >= 0).all()
                ):
                    self._steps = steps.astype(np.int64)
        except Exception as e:  # noqa: BLE001 - the cache is optional: any damage means rescan
            _log.warning("ignoring unreadable index cache %s (%s)", self.cache_path, e)

    def _save_cache(self) -> None:
        if not self.cache_path or self._cache_linked():
            return
        try:
            os.makedirs(os.path.dirname(self.cache_path), exist_ok=True)
            # A new file created exclusively: never written through a planted link.
            with file_io.atomic_file(self.cache_path) as f:
                np.savez(
                    f,
                    stat=np.array(self._stat_key(), np.int64),
                    num_records=np.int64(self.num_records),
                    offsets=self._offsets if self._offsets is not None else np.empty(0, np.int64),
                    steps=self._steps if self._steps is not None else np.empty(0, np.int64),
                )
        except OSError as e:  # a read-only dataset directory still reads fine
            _log.warning("could not write index cache %s (%s)", self.cache_path, e)

    def read(self, i: int) -> bytes:
        """Returns record `i`; raises CorruptRecordError if it is damaged."""
        offsets = self.offsets()
        if i >= offsets.size:
            raise CorruptRecordError(
                self.path, int(offsets[-1]) if offsets.size else 0, f"record {i} is lost"
            )
        offset = int(offsets[i])
        source = self.source()
        # Positional reads do not move a shared file position: safe across threads and forks.
        data, _, problem = tfrecord.read_record(source.read_at, offset, source.size, self.verify)
        if problem:
            raise CorruptRecordError(self.path, offset, problem, index=i)
        return data

    def iter(self, start: int, stop: int, skip: bool) -> Iterator[tuple[int, bytes]]:
        """Yields (index, data) for records [start, stop) in file order.

        Args:
          start: first record.
          stop: one past the last record.
          skip: skip damaged records (with a warning) instead of raising.

        Raises:
          CorruptRecordError: on a damaged record, unless `skip`.
        """
        if start >= stop:
            return
        if start:
            offsets = self.offsets()
            if start >= offsets.size:  # lost behind a broken record (skip mode)
                return
            offset = int(offsets[start])
        else:
            offset = 0
        source = self.opener()  # its own handle: iterations do not share a position
        with contextlib.ExitStack() as stack:
            stack.callback(source.close)
            size = source.size
            # Read ahead no further than the records asked for, when the index says where
            # they end: one episode of a shard in object storage fetches that episode.
            known = self._offsets
            limit = int(known[stop]) if known is not None and stop < known.size else size
            read_at = _sequential(source, limit, stack)
            for i in range(start, stop):
                data, nxt, problem = tfrecord.read_record(read_at, offset, size, self.verify)
                if problem:
                    if not skip:
                        raise CorruptRecordError(self.path, offset, problem, index=i)
                    _log.warning(
                        "%s: skipping corrupt record %d at offset %d: %s",
                        self.path,
                        i,
                        offset,
                        problem,
                    )
                    if nxt < 0:  # the framing is lost: nothing after it can be trusted
                        return
                    offset = nxt
                    continue
                yield i, data
                offset = nxt

    @property
    def cached_steps(self) -> np.ndarray | None:
        return self._steps

    def store_steps(self, steps: np.ndarray) -> None:
        self._steps = steps
        if self.cache_path and self.offsets().size == self.num_records:
            self._save_cache()
