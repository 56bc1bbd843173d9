"""How the store touches files: durable, exclusive and atomic writes, never through a link.

Every file the package creates goes through here: `create_exclusive`
(`O_CREAT | O_EXCL | O_NOFOLLOW`: nothing is ever written through a planted
link), `atomic_file`/`atomic_write_text` (a new temporary file next to the
target, renamed over it, so a reader sees the old file or the new one; an
object in storage is replaced whole), the `fsync` helpers for power-loss
durability, `refuse_symlink`, and the one-line error for a full disk. Remote
paths go through the storage seam (`store.storage.storage`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
from typing import TYPE_CHECKING, Any, BinaryIO

from rlds_writer.errors import DiskFullError, IncompatibleDatasetError
from rlds_writer.store.storage import storage
from rlds_writer.store.storage.object_path import as_path, copy_file

if TYPE_CHECKING:
    from etils import epath


def fsync_file(path: epath.PathLike) -> None:
    """Makes a local file's content durable (no-op for remote paths)."""
    if is_local(path):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_directory(path: epath.PathLike) -> None:
    """Makes renames, creations and deletions in a local directory durable."""
    if is_local(path):
        storage.fsync_directory(os.fspath(path))


def refuse_symlink(path: epath.PathLike, what: str) -> None:
    """Raises if `path` is a symbolic link: we never write through one.

    A crafted dataset could point its lock, journal or shard at a file
    outside the directory; truncating or renaming through it would reach out.
    """
    if is_local(path) and os.path.islink(path):
        raise IncompatibleDatasetError(
            f"{path}: the {what} is a symbolic link (to {os.readlink(path)!r}); rlds_writer "
            "never writes through links. Replace it with a regular file or remove it"
        )


def is_local(path: epath.PathLike) -> bool:
    return not storage.is_remote(path)


def create_exclusive(path: epath.PathLike, *, replace_stale: bool = False) -> int:
    """Creates the new file `path` for writing and returns its descriptor.

    `O_CREAT | O_EXCL | O_NOFOLLOW`: fails if anything (a file, a symbolic
    link) is at `path`, so nothing is ever written through a link.

    Args:
      path: a local path.
      replace_stale: first remove what is at `path` (a leftover temporary file
        of a killed run; removing a link removes the link, not its target).
    """
    if replace_stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return os.open(path, storage.EXCLUSIVE, 0o666)


def temp_path(path: epath.PathLike) -> pathlib.Path:
    """A fresh, unguessable temporary name next to `path` (matched by `TEMP_FILE`)."""
    return pathlib.Path(storage.temp_name(os.fspath(path)))


def atomic_file(
    path: epath.PathLike, fsync: bool = False
) -> contextlib.AbstractContextManager[BinaryIO]:
    """Yields a binary file that replaces the local `path` when the block ends without error.

    `store.storage.storage.atomic_local_file`, the one atomic replacement
    (`LocalStorage.replace_bytes` is it too): a temporary file next to `path`,
    created exclusively, never through a link, renamed over it; on error
    removed, and `path` unchanged.
    """
    return storage.atomic_local_file(os.fspath(path), fsync)


def atomic_write_text(path: epath.PathLike, text: str, fsync: bool = False) -> None:
    """Replaces `path` with `text` so that readers see the old or the new file."""
    if is_local(path):
        with atomic_file(path, fsync=fsync) as f:
            f.write(text.encode("utf-8"))
    else:
        # Object stores replace an object whole (one PUT): no temporary, no rename.
        storage.storage_for(path).replace_bytes(os.fspath(path), text.encode("utf-8"))


def write_new_text(path: epath.PathLike, text: str) -> None:
    """Writes `path` as a new file holding `text`, removing what was there (a link, not its target).

    For files written once, before anything reads them (a new dataset's
    `features.json`); `atomic_write_text` for files readers may be reading.
    """
    data = text.encode("utf-8")
    if not is_local(path):
        storage.storage_for(path).replace_bytes(os.fspath(path), data)
        return
    with os.fdopen(create_exclusive(path, replace_stale=True), "wb") as f:
        f.write(data)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def copy_complete(src: epath.PathLike, dst: epath.PathLike, suffix: str = ".copy-tmp") -> None:
    """Copies `src` so that `dst` only ever appears complete, never through a link.

    Locally through a temporary name (`.<name><suffix>`, a killed copy's or a
    planted link removed first) renamed over `dst`; to object storage in one
    upload or server-side copy (objects appear whole, and have no rename).
    """
    src, dst = as_path(src), as_path(dst)
    tmp = dst.parent / f".{dst.name}{suffix}"
    if is_local(src) and is_local(dst):
        fd = create_exclusive(tmp, replace_stale=True)
        with os.fdopen(fd, "wb") as out, open(src, "rb", opener=_no_follow) as inp:
            shutil.copyfileobj(inp, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
    elif not is_local(dst):
        copy_file(src, dst, overwrite=True)
        return
    else:
        copy_file(src, tmp, overwrite=True)
    tmp.rename(dst)


def is_disk_full(error: BaseException) -> bool:
    """True for the errors a full disk or an exhausted quota raise."""
    return isinstance(error, OSError) and error.errno in _DISK_FULL


def disk_full_error(directory: epath.PathLike, error: OSError, doing: str) -> DiskFullError:
    """Returns the one-line error for a disk that filled up while `doing` in `directory`."""
    where = f" ({error.filename})" if error.filename else ""
    return DiskFullError(
        error.errno,
        f"{directory}: the disk is full{where} while {doing}; nothing already written was "
        "lost (shards are unchanged or kept as .corrupt- copies). Free some space and run "
        f"the same command again, or `rlds-writer recover {directory}`",
    )


def read_json(path: epath.PathLike) -> Any:
    path = os.fspath(path)
    return json.loads(storage.storage_for(path).read_bytes(path))
