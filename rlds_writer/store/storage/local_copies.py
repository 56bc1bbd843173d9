"""Local copies of remote shard files, for readers that can only open paths.

array_record's reader (riegeli, in C++) opens a local file by name; it cannot
read an object by ranges. A shard in object storage is therefore copied whole
to a bounded cache directory when first read (one shard, never the dataset)
and reused while the object is unchanged (same size and ETag or mtime).

The cache lives in `$RLDS_WRITER_CACHE_DIR` (default
`~/.cache/rlds_writer/objects`) and holds at most `$RLDS_WRITER_CACHE_BYTES`
(default 4 GiB): the least recently used copies are deleted past that.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Any

DEFAULT_CACHE_BYTES = 4 << 30


def cache_directory() -> str:
    """Where local copies are kept."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "rlds_writer", "objects")
    return os.environ.get("RLDS_WRITER_CACHE_DIR") or default


def cache_budget() -> int:
    """How many bytes of copies the cache keeps at most."""
    text = os.environ.get("RLDS_WRITER_CACHE_BYTES")
    try:
        return int(text) if text else DEFAULT_CACHE_BYTES
    except ValueError:
        raise ValueError(
            f"RLDS_WRITER_CACHE_BYTES must be a number of bytes, got {text!r}"
        ) from None


def local_copy(store: Any, path: str) -> str:
    """Returns a local file holding the object `path` of `store` (a storage seam object).

    Args:
      store: `store.storage.storage.FsspecStorage` reaching `path`.
      path: the object, e.g. `s3://bucket/data/x.array_record-00000`.

    Returns:
      The local copy's path, fresh for the object as it is now.
    """
    details = store.fs.info(path)
    version = details.get("ETag") or details.get("etag") or details.get("mtime") or ""
    size = int(details.get("size") or 0)
    digest = hashlib.sha256(f"{path}\0{size}\0{version}".encode()).hexdigest()[:32]
    directory = cache_directory()
    os.makedirs(directory, exist_ok=True)
    name = os.path.basename(path.rstrip("/"))
    copy = os.path.join(directory, f"{digest}-{name}")
    if os.path.isfile(copy) and not os.path.islink(copy) and os.path.getsize(copy) == size:
        os.utime(copy)  # recently used: the last to be evicted
        return copy
    _evict(directory, cache_budget() - size, keep=copy)
    tmp = os.path.join(directory, f".{digest}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        store.download(path, tmp)
        os.replace(tmp, copy)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return copy


def _evict(directory: str, budget: int, keep: str) -> None:
    """Deletes the least recently used copies until those left fit in `budget` bytes."""
    entries = []
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            stat = entry.stat(follow_symlinks=False)
            entries.append((stat.st_mtime, stat.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= budget:
            break
        if path == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        total -= size
