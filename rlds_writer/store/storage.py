"""The storage seam: one file-system interface over local disks and object stores.

Every file the project reads or writes goes through a `Storage` (fsspec's
model: one object per file system, paths as full strings). `storage_for(path)`
picks the backend:

- a local path (or `file://...`) gives `LocalStorage`: `os`, `pread`,
  `writev`, `fsync`, files created exclusively (`O_EXCL | O_NOFOLLOW`) and
  rename-based atomic replacement. No abstraction cost on the fast path.
- any other `scheme://...` gives `FsspecStorage` over
  `fsspec.filesystem(scheme)`: s3fs (`s3://`) and gcsfs (`gs://`) plug in
  there, as does any fsspec protocol (`memory://` in unit tests, `az://`,
  `hf://`...). Object stores have no rename and no append, so new objects
  are uploaded whole when they close (`open_shard_sink`), replaced with one
  plain overwrite (`replace_bytes`) and created exclusively only where the
  store has a conditional create (`create_exclusive`: S3 `If-None-Match: *`,
  GCS `ifGenerationMatch=0`).

Nothing here imports TensorFlow or `etils.epath`: reaching a file never loads
TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import tempfile
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO, Protocol

from rlds_writer.errors import StorageNotSupportedError, missing_dependency

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
_IOV_MAX = 1024
# Remote reads: sequential streams read this much at a time; random access
# fetches at least REMOTE_MIN_FETCH per request and keeps at most
# REMOTE_MAX_BLOCKS * REMOTE_BLOCK_SIZE bytes cached per open object.
REMOTE_BLOCK_SIZE = 1 << 20
REMOTE_MAX_BLOCKS = 32
REMOTE_MIN_FETCH = 64 << 10
_REMOTE_CACHE_BYTES = REMOTE_BLOCK_SIZE * REMOTE_MAX_BLOCKS
__all__ = [
    "FsspecStorage",
    "LocalStorage",
    "RandomAccess",
    "ShardSink",
    "Storage",
    "StorageNotSupportedError",
    "is_remote",
    "storage_for",
]
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class RandomAccess(Protocol):
    """A file opened for reads at any offset: `size`, `read_at`, `close`."""

    size: int

    def read_at(self, offset: int, n: int) -> bytes: ...
    def close(self) -> None: ...


class ShardSink(Protocol):
    """A new file being written front to back; it exists complete only after `close`
    on object stores (a local file grows in place, as TFRecord recovery expects)."""

    path: str

    def write_parts(self, parts: Sequence[Any], length: int | None = None) -> None: ...
    def flush(self, fsync: bool = False) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


def split_protocol(path: str | os.PathLike) -> tuple[str, str]:
    """`("s3", "bucket/key")` for `s3://bucket/key`; `("", path)` for a local path."""
    text = os.fspath(path)
    if "://" not in text:
        return "", text
    protocol, _, rest = text.partition("://")
    return protocol.lower(), rest


def is_remote(path: str | os.PathLike) -> bool:
    """True for `scheme://` paths other than `file://`."""
    return split_protocol(path)[0] not in ("", "file", "local")


def storage_for(path: str | os.PathLike) -> Storage:
    """The `Storage` that reaches `path`: local disk, or fsspec for `scheme://` paths.

    Raises:
      MissingDependencyError: the protocol's fsspec backend (s3fs, gcsfs) is not
        installed; the message names the extra (`pip install "rlds_writer[s3]"`).
    """
    protocol, _ = split_protocol(path)
    if protocol in ("", "file", "local"):
        return _LOCAL
    return _fsspec_storage(protocol)


def local_path(path: str | os.PathLike) -> str:
    """A local path without a `file://` prefix."""
    text = os.fspath(path)
    protocol, rest = split_protocol(text)
    if protocol in ("file", "local"):
        return rest if rest.startswith("/") else "/" + rest
    return text


class Storage:
    """One file system. Paths are full strings (`s3://bucket/key` or `/local/path`)."""

    protocol: str = ""
    is_local: bool = True

    def join(self, path: str, *names: str) -> str:
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def isdir(self, path: str) -> bool:
        raise NotImplementedError

    def isfile(self, path: str) -> bool:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        """The names (not paths) directly in directory `path`, sorted."""
        raise NotImplementedError

    def size(self, path: str) -> int:
        raise NotImplementedError

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """The file's bytes, or its first `limit` bytes."""
        raise NotImplementedError

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def open_read(self, path: str) -> BinaryIO:
        """A binary file object for reading front to back (buffered, streamed)."""
        raise NotImplementedError

    def open_random(self, path: str) -> RandomAccess:
        """The file opened for reads at any offset (never downloaded whole)."""
        raise NotImplementedError

    def replace_bytes(self, path: str, data: bytes, fsync: bool = False) -> None:
        """Replaces `path` with `data`: readers see the old or the new content."""
        raise NotImplementedError

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Creates `path` holding `data` if nothing is there; False if something is.

        Raises:
          StorageNotSupportedError: the storage has no exclusive create.
        """
        raise NotImplementedError

    def open_shard_sink(self, path: str) -> ShardSink:
        """A new file at `path` (refused if one exists) written front to back."""
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def move(self, source: str, destination: str) -> None:
        """Moves a file within this storage (local: rename; remote: copy then delete)."""
        raise NotImplementedError

    def copy(self, source: str, destination: str) -> None:
        """Copies a file within this storage."""
        raise NotImplementedError

    def upload(self, local_source: str, destination: str) -> None:
        """Copies the local file `local_source` to `destination` on this storage."""
        raise NotImplementedError

    def download(self, source: str, local_destination: str) -> None:
        """Copies the file `source` of this storage to the local `local_destination`."""
        raise NotImplementedError


class LocalStorage(Storage):
    """The local disk, through `os` (today's fast path)."""

    protocol = ""
    is_local = True

    def join(self, path: str, *names: str) -> str:
        return os.path.join(local_path(path), *names)

    def exists(self, path: str) -> bool:
        return os.path.lexists(local_path(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(local_path(path))

    def isfile(self, path: str) -> bool:
        return os.path.isfile(local_path(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(local_path(path)))

    def size(self, path: str) -> int:
        return os.stat(local_path(path)).st_size

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        with open(local_path(path), "rb") as f:
            return f.read() if limit is None else f.read(limit)

    def open_read(self, path: str) -> BinaryIO:
        return open(local_path(path), "rb")  # noqa: SIM115 - the caller closes it

    def open_random(self, path: str) -> RandomAccess:
        return LocalRandomAccess(local_path(path))

    def replace_bytes(self, path: str, data: bytes, fsync: bool = False) -> None:
        path = local_path(path)
        directory, name = os.path.split(path)
        while True:
            # Matched by store.layout's temporary-file pattern, cleaned by recovery.
            tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")
            try:
                fd = os.open(tmp, _EXCLUSIVE, 0o666)
                break
            except FileExistsError:  # taken by chance (or planted): draw another
                continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            # Swaps a link at `path` itself, never its target.
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if fsync:
            fsync_directory(directory or ".")

    def create_exclusive(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(local_path(path), _EXCLUSIVE, 0o644)
        except FileExistsError:
            return False
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return True

    def open_shard_sink(self, path: str) -> ShardSink:
        return LocalShardSink(local_path(path))

    def remove(self, path: str) -> None:
        os.unlink(local_path(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(local_path(path), exist_ok=True)

    def move(self, source: str, destination: str) -> None:
        os.replace(local_path(source), local_path(destination))

    def copy(self, source: str, destination: str) -> None:
        import shutil

        shutil.copyfile(local_path(source), local_path(destination))

    def upload(self, local_source: str, destination: str) -> None:
        self.copy(local_source, destination)

    def download(self, source: str, local_destination: str) -> None:
        self.copy(source, local_destination)


def fsync_directory(path: str) -> None:
    """Makes creations, renames and deletions in a local directory durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def writev_all(fd: int, parts: Sequence[Any], total: int) -> None:
    """Writes every part with `writev`, resuming after short writes."""
    views = [memoryview(p).cast("B") for p in parts]
    written_total = 0
    i = 0
    while written_total < total:
        written = os.writev(fd, views[i : i + _IOV_MAX])
        written_total += written
        while i < len(views) and written >= len(views[i]):
            written -= len(views[i])
            i += 1
        if written:
            views[i] = views[i][written:]


class LocalRandomAccess:
    """A local file read with `pread` (the kernel's page cache is the cache)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.size = os.fstat(self._fd).st_size

    def read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> LocalRandomAccess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalShardSink:
    """A new local file (`O_EXCL`: refuses what exists, a planted link too), unbuffered:
    each `write_parts` reaches the OS in one `writev`."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)

    def write_parts(self, parts: Sequence[Any], length: int | None = None) -> None:
        if length is None:
            length = sum(memoryview(p).nbytes for p in parts)
        writev_all(self._fd, parts, length)

    def flush(self, fsync: bool = False) -> None:
        if fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def abort(self) -> None:
        """Closes the file and leaves what was written (recovery reads a torn tail)."""
        self.close()


_LOCAL = LocalStorage()
_FSSPEC: dict[str, FsspecStorage] = {}
_FSSPEC_LOCK = threading.Lock()


def _fsspec_storage(protocol: str) -> FsspecStorage:
    with _FSSPEC_LOCK:
        storage = _FSSPEC.get(protocol)
        if storage is None:
            storage = _FSSPEC[protocol] = FsspecStorage(protocol)
        return storage


class FsspecStorage(Storage):
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
        try:
            self._fs_instance = fsspec.filesystem(protocol)
        except (ImportError, ValueError) as e:
            raise StorageNotSupportedError(
                f"{protocol}://: no file system for this protocol ({e}); rlds_writer reaches "
                "local paths and the protocols of fsspec (s3://, gs://, memory://, ...)"
            ) from e

    @property
    def fs(self) -> Any:
        """The fsspec file system."""
        return self._fs_instance

    def _key(self, path: str) -> str:
        protocol, rest = split_protocol(path)
        return rest if protocol else path

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

    def exists(self, path: str) -> bool:
        self._invalidate(path)
        return bool(self.fs.exists(self._key(path)))

    def isdir(self, path: str) -> bool:
        self._invalidate(path)
        return bool(self.fs.isdir(self._key(path)))

    def isfile(self, path: str) -> bool:
        self._invalidate(path)
        return bool(self.fs.isfile(self._key(path)))

    def listdir(self, path: str) -> list[str]:
        key = self._key(path).rstrip("/")
        self._invalidate(key)
        if not self.fs.isdir(key):
            if self.fs.exists(key):
                raise NotADirectoryError(path)
            raise FileNotFoundError(path)
        names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(key, detail=False)}
        names.discard("")
        return sorted(names)

    def size(self, path: str) -> int:
        self._invalidate(path)
        return int(self.fs.size(self._key(path)))

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        key = self._key(path)
        if limit is None:
            return bytes(self.fs.cat_file(key))
        if limit <= 0:
            return b""
        return bytes(self.fs.cat_file(key, start=0, end=limit))

    def open_read(self, path: str) -> BinaryIO:
        return self.fs.open(self._key(path), "rb", block_size=4 * REMOTE_BLOCK_SIZE)

    def open_random(self, path: str) -> RandomAccess:
        return RemoteRandomAccess(self, path)

    def replace_bytes(self, path: str, data: bytes, fsync: bool = False) -> None:
        # One PUT: an object store replaces an object whole (there is no rename).
        self.fs.pipe_file(self._key(path), bytes(data))
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
        if self.fs.exists(key):
            # Also what a store that ignores the condition (the GCS emulator) needs.
            return False
        try:
            self.fs.pipe_file(key, bytes(data), mode="create")
        except FileExistsError:
            return False
        finally:
            self._invalidate(path)
        return True

    def open_shard_sink(self, path: str) -> ShardSink:
        if self.exists(path):
            raise FileExistsError(f"{path} already exists")
        return RemoteShardSink(self, path)

    def remove(self, path: str) -> None:
        key = self._key(path)
        self._invalidate(path)
        if not self.fs.exists(key):
            raise FileNotFoundError(path)
        self.fs.rm_file(key)
        self._invalidate(path)

    def makedirs(self, path: str) -> None:
        # Object stores have no directories; a bucket must exist already. Other
        # fsspec file systems may have them.
        if self.protocol in _PROTOCOL_EXTRAS:
            return
        self.fs.makedirs(self._key(path), exist_ok=True)

    def move(self, source: str, destination: str) -> None:
        self.copy(source, destination)
        self.remove(source)

    def copy(self, source: str, destination: str) -> None:
        self.fs.copy(self._key(source), self._key(destination))
        self._invalidate(destination)

    def upload(self, local_source: str, destination: str) -> None:
        # s3fs and gcsfs switch to a multipart/resumable upload for large files.
        self.fs.put_file(local_path(local_source), self._key(destination))
        self._invalidate(destination)

    def download(self, source: str, local_destination: str) -> None:
        self.fs.get_file(self._key(source), local_path(local_destination))


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
        self._fs = storage.fs
        self._key = storage._key(path)
        storage._invalidate(path)
        self.size = int(storage.fs.size(self._key))
        self._ranges: dict[int, bytes] = {}  # offset -> bytes, oldest first
        self._cached = 0
        self._requests = 0
        self.bytes_fetched = 0

    def _fetch(self, start: int, end: int) -> bytes:
        data = bytes(self._fs.cat_file(self._key, start=start, end=end))
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


class RemoteShardSink:
    """A new object: written to a local temporary file, uploaded whole when closed.

    The object exists only complete (an object store shows no partial PUT); a
    large file goes up as a multipart (S3) or resumable (GCS) upload.
    `abort` drops what was written without uploading.
    """

    def __init__(self, storage: FsspecStorage, path: str):
        self.path = path
        self._storage = storage
        self._tmp = tempfile.NamedTemporaryFile(prefix="rlds_writer-shard-", delete=False)  # noqa: SIM115
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
        try:
            self._tmp.close()
            self._storage.upload(self._tmp.name, self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp.name)

    def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._tmp.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp.name)
