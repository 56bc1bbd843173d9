"""The storage seam: one file-system interface over local disks and object stores.

Every file the project reads or writes goes through a `Storage` (fsspec's
model: one object per file system, paths as full strings). `storage_for(path)`
picks the backend:

- a local path (or `file://...`) gives `LocalStorage`: `os`, `pread`,
  `writev`, `fsync`, files created exclusively (`O_EXCL | O_NOFOLLOW`) and
  rename-based atomic replacement. No abstraction cost on the fast path.
- any other `scheme://...` gives `FsspecStorage` (`store/storage/storage_remote.py`)
  over `fsspec.filesystem(scheme)`: s3fs (`s3://`) and gcsfs (`gs://`) plug in
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
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, Protocol

from rlds_writer.errors import IncompatibleDatasetError, StorageNotSupportedError

_IOV_MAX = 1024
# Bytes per `writev` call of a large record (see `writev_all`).
WRITE_CALL_BYTES = 1 << 20
__all__ = [
    "LocalStorage",
    "RandomAccess",
    "ShardSink",
    "Storage",
    "StorageNotSupportedError",
    "is_remote",
    "storage_for",
]
# Files we create never follow a link and never reuse an existing file: a
# planted symbolic link at a temporary name must not make us write its target.
EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


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
        with atomic_local_file(local_path(path), fsync) as f:
            f.write(data)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(local_path(path), EXCLUSIVE, 0o644)
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


def temp_name(path: str) -> str:
    """A fresh, unguessable temporary name next to the local `path`.

    Matched by `store.dataset.layout.TEMP_FILE`, so `recover` cleans one a
    killed writer left. `os.urandom`, as `secrets.token_hex` (whose import,
    hmac and OpenSSL, is 2-4 ms of a short recording).
    """
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}-{os.urandom(8).hex()}")


@contextlib.contextmanager
def atomic_local_file(path: str, fsync: bool = False) -> Iterator[BinaryIO]:
    """Yields a binary file that replaces the local `path` when the block ends without error.

    The one atomic replacement of a local file (`LocalStorage.replace_bytes`
    and `store.storage.file_io.atomic_file` are this): a new temporary file
    next to `path` (`temp_name`, created exclusively, never through a link),
    renamed over it, so a reader sees the old file or the new one. On error it
    is removed and `path` is unchanged. `os.replace` swaps a link at `path`
    itself, never its target. With `fsync`, the data and the rename are durable.
    """
    while True:
        tmp = temp_name(path)
        try:
            fd = os.open(tmp, EXCLUSIVE, 0o666)
            break
        except FileExistsError:  # a name taken by chance (or planted): draw another
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A full disk must not also leave half a file behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_directory(os.path.dirname(path) or ".")


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
    """Writes every part (`total` bytes) in order, in `writev` calls of at most
    `WRITE_CALL_BYTES`, resuming after short writes.

    A record of up to 1 MiB goes out in one call. A larger one (an episode of
    camera frames is several MB) goes out in 1 MiB calls: on a virtual machine
    that hands free memory back to its host, an 8.5 MB `writev` took 6x the
    time of the same bytes in 1 MiB calls (writes of 4 MB and more were the
    slow ones; benchmarks/REPORT.md), and the extra calls cost microseconds.
    """
    if total <= WRITE_CALL_BYTES and len(parts) <= _IOV_MAX:
        # The common case, one whole write: no byte views made (about 1 µs for
        # the 17 parts of a Catch episode); they are made only to resume.
        written = os.writev(fd, parts)
        if written != total:
            _writev_fully(fd, _views_after(parts, written), total - written)
        return
    views = [memoryview(p).cast("B") for p in parts]
    batch: list[memoryview] = []
    size = 0
    for view in views:
        while view.nbytes:
            take = view[: WRITE_CALL_BYTES - size]
            batch.append(take)
            size += take.nbytes
            view = view[take.nbytes :]
            if size == WRITE_CALL_BYTES or len(batch) == _IOV_MAX:
                _writev_fully(fd, batch, size)
                batch, size = [], 0
    if batch:
        _writev_fully(fd, batch, size)


def _views_after(parts: Sequence[Any], written: int) -> list[memoryview]:
    """Byte views of what is left of `parts` after the first `written` bytes (fewer than all)."""
    views = [memoryview(p).cast("B") for p in parts]
    return views[_drop_written(views, 0, written) :]


def _drop_written(views: list[memoryview], i: int, written: int) -> int:
    """Drops the first `written` bytes of `views[i:]` (fewer than all): whole parts,
    then the head of a part cut short; returns the index of the first part left."""
    while written >= views[i].nbytes:
        written -= views[i].nbytes
        i += 1
    if written:
        views[i] = views[i][written:]
    return i


def _writev_fully(fd: int, views: list[memoryview], total: int) -> None:
    """One `writev` of `views` (`total` bytes), and more only after a short write."""
    i = 0
    while True:
        written = os.writev(fd, views[i:])
        total -= written
        if not total:
            return
        i = _drop_written(views, i, written)


class LocalRandomAccess:
    """A local file read with `pread` (the kernel's page cache is the cache)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = open_regular(path)
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


def open_regular(path: str, flags: int = 0) -> int:
    """A read-only descriptor of the regular file `path` (`flags` added, e.g. `O_NOFOLLOW`).

    Opened with `O_NONBLOCK`: a FIFO planted as a shard would block the open
    forever (the flag changes nothing for a regular file's reads).

    Raises:
      IncompatibleDatasetError: `path` is a directory, FIFO, socket or device.
    """
    flags |= os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
    kinds.update({stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"})
    kind = next((name for test, name in kinds.items() if test(mode)), "a special file")
    raise IncompatibleDatasetError(
        f"{path}: {kind}, not a regular file; rlds_writer reads a dataset's files only "
        "from regular files. Replace it with the file itself"
    )


class LocalShardSink:
    """A new local file (`O_EXCL`: refuses what exists, a planted link too), unbuffered:
    each `write_parts` has reached the OS when it returns (`writev_all`)."""

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
_FSSPEC: dict[str, Storage] = {}
_FSSPEC_LOCK = threading.Lock()


def _fsspec_storage(protocol: str) -> Storage:
    from rlds_writer.store.storage.storage_remote import FsspecStorage

    with _FSSPEC_LOCK:
        storage = _FSSPEC.get(protocol)
        if storage is None:
            storage = _FSSPEC[protocol] = FsspecStorage(protocol)
        return storage


def __getattr__(name: str) -> Any:
    # The fsspec backend lives in store/storage/storage_remote.py, imported on first use.
    if name in ("FsspecStorage", "RemoteRandomAccess", "RemoteShardSink"):
        from rlds_writer.store.storage import storage_remote

        return getattr(storage_remote, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
