"""Paths on object storage with the subset of `pathlib` the store uses, over the seam.

`as_path(p)` is how store/ turns a user's path into a path object: a local
path becomes a `pathlib.Path` (not `etils.epath`'s, whose import costs a
short recording 25-40 ms), a `scheme://` path becomes an `ObjectPath`, whose every
file operation goes through `store.storage.storage` (fsspec), never TensorFlow.
`ObjectPath` has no rename: `rename` is the seam's `move` (copy then delete)
and is used only where that is what is meant.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from rlds_writer.store.storage import storage


def as_path(path: Any) -> Any:
    """An `ObjectPath` for `scheme://` paths, else a `pathlib.Path`."""
    if isinstance(path, ObjectPath):
        return path
    text = os.fspath(path)
    if storage.is_remote(text):
        return ObjectPath(text)
    return pathlib.Path(storage.local_path(text))


@dataclasses.dataclass(frozen=True)
class _Stat:
    length: int
    st_size: int


class ObjectPath:
    """`s3://bucket/key`-style path; I/O through `storage.storage_for(path)`."""

    def __init__(self, path: str):
        protocol, rest = storage.split_protocol(path)
        self._text = f"{protocol}://{rest.rstrip('/')}"

    @property
    def _store(self) -> storage.Storage:
        return storage.storage_for(self._text)

    def __fspath__(self) -> str:
        return self._text

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"ObjectPath({self._text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)

    def __lt__(self, other: ObjectPath) -> bool:
        return self._text < other._text

    def __truediv__(self, name: Any) -> ObjectPath:
        return ObjectPath(f"{self._text}/{os.fspath(name).strip('/')}")

    @property
    def name(self) -> str:
        return storage.split_protocol(self._text)[1].rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        protocol, rest = storage.split_protocol(self._text)
        head = rest.rsplit("/", 1)[0] if "/" in rest else rest
        return ObjectPath(f"{protocol}://{head}")

    def exists(self) -> bool:
        return self._store.exists(self._text)

    def is_dir(self) -> bool:
        return self._store.isdir(self._text)

    def is_file(self) -> bool:
        return self._store.isfile(self._text)

    def iterdir(self) -> Iterator[ObjectPath]:
        for name in self._store.listdir(self._text):
            yield self / name

    def stat(self) -> _Stat:
        size = self._store.size(self._text)
        return _Stat(size, size)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        self._store.makedirs(self._text)

    def rmdir(self) -> None:
        """Nothing to remove: object stores have no directories (a prefix is gone
        with its last object)."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self._store.remove(self._text)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def read_bytes(self) -> bytes:
        return self._store.read_bytes(self._text)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        """Replaces the object whole (one PUT)."""
        self._store.replace_bytes(self._text, bytes(data))

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    def open(self, mode: str = "rb") -> BinaryIO:
        if mode != "rb":
            raise ValueError(f"{self}: object paths open for reading only ('rb'), got {mode!r}")
        return self._store.open_read(self._text)

    def rename(self, target: Any) -> ObjectPath:
        """Moves the object (copy then delete: object stores have no rename)."""
        target = as_path(target)
        self._store.move(self._text, os.fspath(target))
        return target

    def copy(self, target: Any, overwrite: bool = False) -> Any:
        return copy_file(self, target, overwrite=overwrite)


def copy_file(source: Any, destination: Any, overwrite: bool = False) -> Any:
    """Copies one file between any two storages (local, or the same or another store)."""
    src, dst = os.fspath(source), os.fspath(destination)
    src_store, dst_store = storage.storage_for(src), storage.storage_for(dst)
    if not overwrite and dst_store.exists(dst):
        raise FileExistsError(f"{dst} already exists")
    if src_store is dst_store:
        src_store.copy(src, dst)
    elif src_store.is_local:
        dst_store.upload(src, dst)
    elif dst_store.is_local:
        src_store.download(src, dst)
    else:  # between two remote protocols: through a local temporary file
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rlds_writer-copy-") as tmp:
            local = os.path.join(tmp, "object")
            src_store.download(src, local)
            dst_store.upload(local, dst)
    return as_path(dst)
