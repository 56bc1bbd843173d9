"""Is this path a dataset? The one check every tool runs, and its one error.

A dataset is a directory holding `dataset_info.json` (and `features.json`).
Anything else given as a dataset gets `NotADatasetError`, which says what is
there instead; for a directory with datasets below it (the RLlib recorder's
`merged/<module>`, parallel writers' `writer-*`, TFDS's `name/version`) it
lists them, so the user can pick one.
"""

from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import NotADatasetError
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage import file_io, storage
from rlds_writer.store.storage.store_requests import bucket_error

if TYPE_CHECKING:
    from etils import epath

# How far below a directory to look for datasets, and how many directory
# entries to read at most: a user who passes their home directory gets an
# answer at once, not a walk of the disk.
_MAX_DEPTH = 3
_MAX_ENTRIES = 5000
_FILES = (layout.DATASET_INFO, layout.FEATURES)


def require_dataset(path: epath.PathLike, backend: Any = None) -> None:
    """Raises `NotADatasetError` unless `path` holds `dataset_info.json` and `features.json`.

    Args:
      path: the directory.
      backend: the `store.storage.storage` object that reaches it (default: the one for `path`).
    """
    if file_io.is_local(path):
        # os.path, not epath: the reader must not look for TensorFlow (epath does).
        root = os.fspath(path)
        if all(os.path.isfile(os.path.join(root, f)) for f in _FILES):
            return
        raise not_a_dataset(path)
    backend = backend or storage.storage_for(path)
    root = os.fspath(path).rstrip("/")
    present = [backend.exists(backend.join(root, f)) for f in _FILES]
    if all(present):
        return
    if present[0]:
        raise NotADatasetError(os.fspath(path), f"it has no {layout.FEATURES}")
    _require_bucket(backend, root)
    raise NotADatasetError(os.fspath(path), f"it has no {layout.DATASET_INFO}")


def _require_bucket(backend: Any, path: str) -> None:
    """Raises `BucketNotFoundError` if `path` is in a bucket that does not exist."""
    if storage.split_protocol(path)[0] in ("s3", "s3a", "gs", "gcs") and not (
        backend.bucket_exists(path)
    ):
        raise bucket_error(path)


def not_a_dataset(path: epath.PathLike) -> NotADatasetError:
    """The error for `path`, which is not a dataset: what is there, and datasets below it."""
    shown = os.fspath(path)
    if not file_io.is_local(path):
        backend = storage.storage_for(shown)
        if backend.exists(backend.join(shown.rstrip("/"), layout.DATASET_INFO)):
            return NotADatasetError(shown, f"it has no {layout.FEATURES}")
        _require_bucket(backend, shown)
        return NotADatasetError(shown, f"it has no {layout.DATASET_INFO}")
    if not os.path.lexists(shown):
        return NotADatasetError(shown, "it does not exist")
    if not os.path.isdir(shown):
        parent = os.path.dirname(os.path.abspath(shown))
        if os.path.isfile(os.path.join(parent, layout.DATASET_INFO)):
            return NotADatasetError(
                shown, f"it is a file of the dataset in {parent}: pass that directory"
            )
        return NotADatasetError(shown, "it is a file")
    has_info = os.path.isfile(os.path.join(shown, layout.DATASET_INFO))
    if has_info:
        return NotADatasetError(
            shown,
            f"it has no {layout.FEATURES} (an interrupted creation, or a lost file: "
            "run recover on it)",
        )
    names = _names(shown)
    if any(layout.ANY_SHARD.match(n) for n in names):
        return NotADatasetError(
            shown,
            f"it holds shard files and no {layout.DATASET_INFO} (run recover on it to "
            "see what is missing)",
        )
    below = datasets_below(shown)
    if below:
        return NotADatasetError(shown, f"it has no {layout.DATASET_INFO}", below)
    if not names:
        return NotADatasetError(shown, "it is an empty directory")
    return NotADatasetError(shown, f"it has no {layout.DATASET_INFO} (nor datasets below it)")


def datasets_below(path: str | os.PathLike) -> list[str]:
    """The datasets in subdirectories of `path` (a few levels down), sorted.

    Hidden directories and symbolic links are not followed; the search reads
    a bounded number of entries, so it may miss datasets in a very large tree.
    """
    top = os.fspath(path)
    found = []
    budget = _MAX_ENTRIES
    queue = deque([(top, 0)])
    while queue and budget > 0:
        directory, depth = queue.popleft()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    budget -= 1
                    if budget <= 0:
                        break
                    if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                        continue
                    if os.path.isfile(os.path.join(entry.path, layout.DATASET_INFO)):
                        found.append(entry.path)
                    elif depth + 1 < _MAX_DEPTH:
                        queue.append((entry.path, depth + 1))
        except OSError:  # unreadable: nothing to offer from there
            continue
    return sorted(found)


def _names(directory: str) -> list[str]:
    """The directory's entries, without hidden ones (a lock file does not make a dataset)."""
    try:
        return [n for n in os.listdir(directory) if not n.startswith(".")]
    except OSError:
        return []
