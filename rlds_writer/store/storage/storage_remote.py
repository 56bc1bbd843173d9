"""The fsspec side of the storage seam (`store.storage.storage`): any `scheme://` path.

s3fs (`s3://`), gcsfs (`gs://`) and every other fsspec protocol. Objects are
replaced whole (one PUT), created exclusively only where the store has a
conditional create, read by range requests through a bounded block cache, and
new shards are uploaded whole when they close. Every request is bounded in
time and retried, and its errors name the object (`store_requests`); a shard
whose upload failed keeps its local file (`unsaved_shards`).
`store.storage.storage.storage_for` makes these; this module imports nothing
of the seam (no import loop).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO

from rlds_writer.errors import StorageNotSupportedError, missing_dependency
from rlds_writer.store.storage import store_requests, unsaved_shards
from rlds_writer.store.storage.store_requests import call

# Protocols whose fsspec backend ships in an extra of ours, and that extra.
_PROTOCOL_EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
}
# Object stores that can create an object only if it does not exist, and how
# (the word the docs and the error use). fsspec's `pipe_file(mode="create")`
# sends the condition for both.
_CONDITIONAL_CREATE = {
    "s3": "If-None-Match: *",
    "s3a": "If-None-Match: *",
    "gs": "ifGenerationMatch=0",
    "gcs": "ifGenerationMatch=0",
    # One process's dict: exclusive within that process (the unit tests' store).
    "memory": "a check within one process",
}
# Remote reads: sequential streams read this much at a time; random access
# fetches at least REMOTE_MIN_FETCH per request and keeps at most
# REMOTE_MAX_BLOCKS * REMOTE_BLOCK_SIZE bytes cached per open object.
REMOTE_BLOCK_SIZE = 1 << 20
REMOTE_MAX_BLOCKS = 32
REMOTE_MIN_FETCH = 64 << 10
_REMOTE_CACHE_BYTES = REMOTE_BLOCK_SIZE * REMOTE_MAX_BLOCKS


def _key_of(path: str) -> str:
    return path.partition("://")[2] if "://" in path else path


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


class FsspecStorage:
    """Any fsspec file system: s3fs, gcsfs, memory, ...

    Args:
      protocol: the fsspec protocol (`s3`, `gs`, `memory`, ...).
    """

    is_local = False

    def __init__(self, protocol: str):
        module, extra = _PROTOCOL_EXTRAS.get(protocol, (None, None))
        feature = f"reaching {protocol}:// paths"
        fsspec = _import("fsspec", feature, extra)
        if module is not None:
            _import(module, feature, extra)
        self.protocol = protocol
        self._pid = os.getpid()
        try:
            self._fs_instance = fsspec.filesystem(protocol)
        except (ImportError, ValueError) as e:
            raise StorageNotSupportedError(
                f"{protocol}://: no file system for this protocol ({e}); rlds_writer reaches "
                "local paths and the protocols of fsspec (s3://, gs://, memory://, ...)"
            ) from e

    @property
    def fs(self) -> Any:
        """The fsspec file system (this process's: async ones are not fork-safe).

        A forked process (a `DataLoader` worker) that inherited this object
        makes its own client on first use; fsspec's instance cache does the same.
        """
        if os.getpid() != self._pid:
            import fsspec

            self._fs_instance = fsspec.filesystem(self.protocol)
            self._pid = os.getpid()
        return self._fs_instance

    def _key(self, path: str) -> str:
        return _key_of(path)

    def _full(self, key: str) -> str:
        return f"{self.protocol}://{key}"

    def join(self, path: str, *names: str) -> str:
        text = path.rstrip("/")
        for name in names:
            text = f"{text}/{name.strip('/')}"
        return text

    def _invalidate(self, path: str) -> None:
        # Another process may have written since the listing was cached.
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self._key(path))

    def _call(self, name: str, path: str, *args: Any, **kwargs: Any) -> Any:
        return call(self.fs, name, self._full(self._key(path)), *args, **kwargs)

    def exists(self, path: str) -> bool:
        self._invalidate(path)
        return bool(self._call("exists", path, self._key(path)))

    def isdir(self, path: str) -> bool:
        self._invalidate(path)
        return bool(self._call("isdir", path, self._key(path)))

    def isfile(self, path: str) -> bool:
        self._invalidate(path)
        return bool(self._call("isfile", path, self._key(path)))

    def bucket_exists(self, path: str) -> bool:
        """Whether the bucket (the first name after `scheme://`) of `path` exists."""
        bucket = store_requests.bucket_of(self._full(self._key(path)))
        self._invalidate(bucket)
        return bool(self._call("exists", path, bucket))

    def listdir(self, path: str) -> list[str]:
        key = self._key(path).rstrip("/")
        self._invalidate(key)
        if not self._call("isdir", path, key):
            if self._call("exists", path, key):
                raise NotADirectoryError(path)
            raise FileNotFoundError(path)
        entries = self._call("ls", path, key, detail=False)
        names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries}
        names.discard("")
        return sorted(names)

    def size(self, path: str) -> int:
        self._invalidate(path)
        return int(self._call("size", path, self._key(path)))

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        key = self._key(path)
        if limit is None:
            return bytes(self._call("cat_file", path, key))
        if limit <= 0:
            return b""
        return bytes(self._call("cat_file", path, key, start=0, end=limit, nbytes=limit))

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def open_read(self, path: str) -> BinaryIO:
        # Range requests made by `call`: each bounded in time, retried, its errors
        # worded (fsspec's own file object waits as long as the client library does).
        raw = _BoundedStream(self, path)
        return io.BufferedReader(raw, buffer_size=4 * REMOTE_BLOCK_SIZE)  # type: ignore[return-value]

    def open_random(self, path: str) -> RemoteRandomAccess:
        return RemoteRandomAccess(self, path)

    def replace_bytes(self, path: str, data: bytes, fsync: bool = False) -> None:
        # One PUT: an object store replaces an object whole (there is no rename).
        data = bytes(data)
        self._call(
            "pipe_file", path, self._key(path), data, doing="writing", nbytes=len(data), writes=True
        )
        self._invalidate(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if self.protocol not in _CONDITIONAL_CREATE:
            raise StorageNotSupportedError(
                f"{path}: {self.protocol}:// has no conditional create that rlds_writer knows, "
                "so it cannot take the one-writer lock there; record to a local directory, "
                "s3:// or gs:// and copy the dataset (`rlds_writer.merge`) afterwards"
            )
        key = self._key(path)
        self._invalidate(path)
        if self._call("exists", path, key):
            # Also what a store that ignores the condition (the GCS emulator) needs.
            return False
        try:
            # Not retried: a create whose answer was lost would then find itself.
            self._call(
                "pipe_file",
                path,
                key,
                bytes(data),
                mode="create",
                doing="creating",
                retry=False,
                writes=True,
            )
        except FileExistsError:
            return False
        finally:
            self._invalidate(path)
        return True

    def open_shard_sink(self, path: str) -> RemoteShardSink:
        # No request here (an episode's append must not wait on the store): an
        # existing object is refused at the upload, which keeps the local file.
        return RemoteShardSink(self, path)

    def remove(self, path: str) -> None:
        key = self._key(path)
        self._invalidate(path)
        if not self._call("exists", path, key):
            raise FileNotFoundError(path)
        try:
            self._call("rm_file", path, key, doing="deleting")
        except FileNotFoundError:
            pass  # an attempt whose answer was lost deleted it
        self._invalidate(path)

    def makedirs(self, path: str) -> None:
        # Object stores have no directories; a bucket must exist already. Other
        # fsspec file systems may have them.
        if self.protocol in _PROTOCOL_EXTRAS:
            return
        self._call("makedirs", path, self._key(path), exist_ok=True, doing="creating")

    def move(self, source: str, destination: str) -> None:
        self.copy(source, destination)
        self.remove(source)

    def copy(self, source: str, destination: str) -> None:
        self._call("copy", destination, self._key(source), self._key(destination), doing="copying")
        self._invalidate(destination)

    def upload(self, local_source: str, destination: str) -> None:
        # s3fs and gcsfs switch to a multipart/resumable upload for large files.
        local = _local(local_source)
        nbytes = os.path.getsize(local)
        self._call(
            "put_file",
            destination,
            local,
            self._key(destination),
            doing="uploading",
            nbytes=nbytes,
            writes=True,
        )
        self._invalidate(destination)

    def download(self, source: str, local_destination: str) -> None:
        self._call("get_file", source, self._key(source), _local(local_destination))


def _import(module: str, feature: str, extra: str | None) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise missing_dependency(module, feature, extra) from e


class RemoteRandomAccess:
    """Range reads through a bounded cache of the ranges fetched (never the whole object).

    A read the cache does not hold asks the store for `[offset, offset +
    max(n, REMOTE_MIN_FETCH))`: walking a shard's record headers costs one
    small request per record (none when records are small enough to share
    one), never the records between them, which aligned 1 MiB blocks would
    fetch whole. At most `REMOTE_MAX_BLOCKS * REMOTE_BLOCK_SIZE` bytes stay
    cached per open object; a read larger than a quarter of that is not cached.
    """

    def __init__(self, storage: FsspecStorage, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._storage = storage
        self._key = storage._key(path)
        self._full = storage._full(self._key)
        self.size = storage.size(path)
        self._ranges: dict[int, bytes] = {}  # offset -> bytes, oldest first
        self._cached = 0
        self._requests = 0
        self.bytes_fetched = 0

    def _fetch(self, start: int, end: int) -> bytes:
        data = bytes(
            call(
                self._storage.fs,
                "cat_file",
                self._full,
                self._key,
                start=start,
                end=end,
                nbytes=end - start,
            )
        )
        with self._lock:
            self._requests += 1
            self.bytes_fetched += len(data)
        return data

    def read_at(self, offset: int, n: int) -> bytes:
        end = min(self.size, offset + n)
        if offset >= end:
            return b""
        with self._lock:
            for start, data in reversed(self._ranges.items()):
                if start <= offset and end <= start + len(data):
                    self._ranges[start] = self._ranges.pop(start)  # most recent last
                    return data[offset - start : end - start]
        if end - offset > _REMOTE_CACHE_BYTES // 4:
            return self._fetch(offset, end)
        data = self._fetch(offset, min(self.size, offset + max(n, REMOTE_MIN_FETCH)))
        with self._lock:
            old = self._ranges.pop(offset, b"")
            self._ranges[offset] = data
            self._cached += len(data) - len(old)
            while self._cached > _REMOTE_CACHE_BYTES and len(self._ranges) > 1:
                self._cached -= len(self._ranges.pop(next(iter(self._ranges))))
        return data[: end - offset]

    @property
    def blocks_fetched(self) -> int:
        """How many range requests were made to the store so far."""
        return self._requests

    def close(self) -> None:
        with self._lock:
            self._ranges.clear()
            self._cached = 0

    def __enter__(self) -> RemoteRandomAccess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _BoundedStream(io.RawIOBase):
    """An object read front to back (seekable) by range requests through `call`."""

    def __init__(self, storage: FsspecStorage, path: str):
        super().__init__()
        self._fs = storage.fs
        self._key = storage._key(path)
        self._full = storage._full(self._key)
        self.size = storage.size(path)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self._full}: seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        end = min(self.size, self._pos + len(buffer))
        if self._pos >= end:
            return 0
        data = call(
            self._fs,
            "cat_file",
            self._full,
            self._key,
            start=self._pos,
            end=end,
            nbytes=end - self._pos,
        )
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        self._pos += n
        return n


class RemoteShardSink:
    """A new object: written to a local temporary file, uploaded whole when closed.

    The object exists only complete (an object store shows no partial PUT); a
    large file goes up as a multipart (S3) or resumable (GCS) upload. If the
    upload fails, the local file is kept (`unsaved_shards.keep`) and
    `UploadFailedError` names it. `abort` drops what was written without uploading.
    """

    def __init__(self, storage: FsspecStorage, path: str):
        self.path = path
        self._storage = storage
        self._tmp = open(unsaved_shards.staging_file(), "wb")  # noqa: SIM115 - closed in close
        self._closed = False

    def write_parts(self, parts: Sequence[Any], length: int | None = None) -> None:
        for part in parts:
            self._tmp.write(part)

    def flush(self, fsync: bool = False) -> None:
        # Nothing reaches the store before close: durability is per object.
        self._tmp.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tmp.close()
        unsaved_shards.upload_or_keep(self._storage, self._tmp.name, self.path)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tmp.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp.name)
