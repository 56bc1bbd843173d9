"""Where a dataset's files live: the local disk, or object storage through fsspec.

INTERIM read half (helper h1), written against the seam's agreed interface
until the full seam lands: `storage_for(path)` gives a `Storage` with
`exists/isdir/listdir/size/read_bytes/open_random(path)`; `open_random`
gives a `RandomAccess` with `size` and `read_at(offset, n)`. Local paths use
`os` (`pread`, no link followed); any `scheme://` path goes through fsspec
(s3fs, gcsfs, ...), read with range requests through a bounded block cache.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any, Protocol

# Object stores charge a round trip per request: a read of an object fetches
# at least this much, and each open object keeps at most this much cached.
MIN_FETCH = 64 << 10
MAX_CACHED_BYTES = 16 << 20


def is_local(path: str | os.PathLike) -> bool:
    """True for a path on the local file system (no `scheme://`)."""
    return "://" not in os.fspath(path)


class RandomAccess(Protocol):
    """A file opened for positional reads."""

    size: int

    def read_at(self, offset: int, n: int) -> bytes: ...

    def close(self) -> None: ...


class LocalRandomAccess:
    """A local file read with `pread` (never through a symbolic link)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        self._pid = os.getpid()
        self.size = os.fstat(self._fd).st_size

    def read_at(self, offset: int, n: int) -> bytes:
        if self._pid != os.getpid():  # inherited through fork: reopen
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            self._pid = os.getpid()
        return os.pread(self._fd, n, offset)

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = -1

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


class CachedRandomAccess:
    """A remote object read by ranges, through a bounded cache of the ranges fetched.

    A read the cache does not cover asks the store for `[offset, offset +
    max(n, MIN_FETCH))`: walking a shard's record headers costs one small
    request per record (or none, when records are small enough to share one),
    never the records themselves. Memory stays under `MAX_CACHED_BYTES`
    whatever the object's size; reads larger than that are not cached.

    Attributes:
      bytes_fetched: bytes received from the store so far.
      requests: range requests made so far.
    """

    def __init__(self, fs: Any, path: str, size: int | None = None):
        self.fs = fs
        self.path = path
        self.size = int(fs.size(path) if size is None else size)
        self._ranges: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.requests = 0

    def _fetch(self, start: int, end: int) -> bytes:
        data = self.fs.cat_file(self.path, start=start, end=end)
        with self._lock:
            self.bytes_fetched += len(data)
            self.requests += 1
        return data

    def read_at(self, offset: int, n: int) -> bytes:
        end = min(self.size, offset + n)
        if offset >= end:
            return b""
        with self._lock:
            for start, data in reversed(self._ranges.items()):
                if start <= offset and end <= start + len(data):
                    self._ranges.move_to_end(start)
                    return data[offset - start : end - start]
        if end - offset > MAX_CACHED_BYTES // 4:
            return self._fetch(offset, end)  # a large read: not worth evicting the rest for
        data = self._fetch(offset, min(self.size, offset + max(n, MIN_FETCH)))
        with self._lock:
            old = self._ranges.pop(offset, None)
            self._cached += len(data) - (len(old) if old is not None else 0)
            self._ranges[offset] = data
            while self._cached > MAX_CACHED_BYTES and len(self._ranges) > 1:
                _, dropped = self._ranges.popitem(last=False)
                self._cached -= len(dropped)
        return data[: end - offset]

    def close(self) -> None:
        with self._lock:
            self._ranges.clear()
            self._cached = 0

    def __getstate__(self) -> dict:
        return {"fs": self.fs, "path": self.path, "size": self.size}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["fs"], state["path"], state["size"])


class LocalStorage:
    """The local file system."""

    is_local = True

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def islink(self, path: str) -> bool:
        return os.path.islink(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def read_bytes(self, path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def open_random(self, path: str) -> LocalRandomAccess:
        return LocalRandomAccess(path)

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)


class FsspecStorage:
    """Any fsspec file system (s3fs, gcsfs, ...): object names, range reads."""

    is_local = False

    def __init__(self, protocol: str):
        import fsspec

        self.protocol = protocol
        self.fs = fsspec.filesystem(protocol)

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def isdir(self, path: str) -> bool:
        return self.fs.isdir(path)

    def isfile(self, path: str) -> bool:
        return self.fs.isfile(path)

    def islink(self, path: str) -> bool:
        return False  # object stores have no links

    def listdir(self, path: str) -> list[str]:
        names = []
        for entry in self.fs.ls(path, detail=False, refresh=True):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name:
                names.append(name)
        return sorted(names)

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(path)

    def open_random(self, path: str) -> CachedRandomAccess:
        return CachedRandomAccess(self.fs, path)

    def join(self, *parts: str) -> str:
        return "/".join(p.rstrip("/") for p in parts[:-1]) + "/" + parts[-1]


_LOCAL = LocalStorage()


def storage_for(path: str | os.PathLike) -> LocalStorage | FsspecStorage:
    """Returns the storage that holds `path`."""
    text = os.fspath(path)
    if is_local(text):
        return _LOCAL
    from rlds_writer.errors import import_optional

    import_optional("fsspec", f"reading {text}")
    return FsspecStorage(text.split("://", 1)[0])
