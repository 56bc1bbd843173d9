"""Shards an object store did not take, kept on the local disk until they are uploaded.

A shard bound for an object store is written to a local file and uploaded
whole when it closes. When that upload fails (after the retries of
`store.store_requests`), the local file is not deleted: it is moved to
`$RLDS_WRITER_UNSAVED_DIR/<dataset>/` (default
`~/.local/share/rlds_writer/unsaved`; `<dataset>` is a digest of the
dataset's URL and its last name), under the shard's own name, next to
`destination.json`, which names the dataset it belongs to. The writer's error
names that directory and the episodes in it.

`upload_kept` puts such shards where they belong: `recover` on the dataset
does it first (and so does a writer opening the dataset with
`mode="append"`, which recovers it), as does `recover` given the directory
of kept shards itself (copied to another machine, say). A shard whose object
already exists is left where it is, with a warning: nothing is overwritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from rlds_writer.errors import UploadFailedError

_log = logging.getLogger(__name__)

DESTINATION = "destination.json"
# What a kept shard may be called: a shard name, never a path.
_SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def unsaved_root() -> str:
    """Where kept shards go: `$RLDS_WRITER_UNSAVED_DIR`, else under `$XDG_DATA_HOME`."""
    configured = os.environ.get("RLDS_WRITER_UNSAVED_DIR")
    if configured:
        return configured
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return os.path.join(data_home, "rlds_writer", "unsaved")


def kept_directory(dataset: str) -> str:
    """The directory that keeps the shards of `dataset` (a `scheme://` URL) not uploaded."""
    dataset = dataset.rstrip("/")
    digest = hashlib.sha256(dataset.encode()).hexdigest()[:12]
    tail = re.sub(r"[^A-Za-z0-9_.\-]", "_", dataset.rsplit("/", 1)[-1])[:40] or "dataset"
    return os.path.join(unsaved_root(), f"{tail}-{digest}")


def staging_file(suffix: str = "") -> str:
    """A new empty local file for a shard being written for a remote destination."""
    fd, path = tempfile.mkstemp(prefix="rlds_writer-shard-", suffix=suffix)
    os.close(fd)
    return path


def upload_or_keep(store: Any, local: str, destination: str) -> None:
    """Uploads the local file `local` to `destination` and deletes it; keeps it if that fails.

    Args:
      store: the `store.storage.storage` object reaching `destination`.
      local: the shard's local file.
      destination: the shard's object (`s3://bucket/dataset/name`).

    Raises:
      UploadFailedError: the upload failed; the error names where the file was kept.
    """
    try:
        if store.exists(destination):  # never overwrite an object
            raise FileExistsError(f"{destination} already exists")
        store.upload(local, destination)
    except Exception as e:
        kept = keep(local, destination)
        raise UploadFailedError(
            f"{destination} was not uploaded ({e}); its bytes are kept in {kept}",
            destination,
            kept,
        ) from e
    except BaseException:  # Ctrl-C mid-upload: the bytes stay for `recover`
        keep(local, destination)
        raise
    with contextlib.suppress(OSError):
        os.unlink(local)


def keep(local: str, destination: str) -> str:
    """Moves `local` (a shard whose upload to `destination` failed) to the kept directory.

    Returns:
      Where the shard is now (the staging file itself if it could not be moved).
    """
    dataset, _, name = destination.rstrip("/").rpartition("/")
    directory = kept_directory(dataset)
    try:
        os.makedirs(directory, exist_ok=True)
        _write_destination(directory, dataset)
        target = os.path.join(directory, name)
        if os.path.lexists(target):  # an earlier failed run's shard of that name
            target = os.path.join(directory, f"{name}.{os.getpid()}-{os.urandom(4).hex()}")
        shutil.move(local, target)
        return target
    except OSError as e:
        _log.error("could not move %s to %s (%r); it stays where it is", local, directory, e)
        return local


def _write_destination(directory: str, dataset: str) -> None:
    path = os.path.join(directory, DESTINATION)
    if os.path.isfile(path) and destination_of(directory) == dataset:
        return
    with open(path, "w") as f:
        json.dump({"dataset": dataset}, f)


def destination_of(directory: str) -> str | None:
    """The dataset a directory of kept shards belongs to, or None if it is not one."""
    try:
        with open(os.path.join(directory, DESTINATION)) as f:
            dataset = json.load(f).get("dataset")
    except (OSError, ValueError, AttributeError):
        return None
    return dataset if isinstance(dataset, str) and "://" in dataset else None


def kept_shards(directory: str, is_shard: Callable[[str], Any] | None = None) -> list[str]:
    """The names of the shard files kept in `directory`.

    Args:
      directory: a directory of kept shards.
      is_shard: whether a name is a shard's (default: any plain file name); a
        second copy's `.<pid>-<hex>` suffix is left off before asking.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        n
        for n in names
        if n != DESTINATION
        and _SHARD_NAME.match(n)
        and (is_shard is None or is_shard(_shard_name(n)))
        and os.path.isfile(os.path.join(directory, n))
        and not os.path.islink(os.path.join(directory, n))
    )


def upload_kept(
    store: Any,
    dataset: str,
    directory: str | None = None,
    is_shard: Callable[[str], Any] | None = None,
) -> list[str]:
    """Uploads the shards kept for `dataset` (from `directory`, default its kept directory).

    Each is uploaded under its own name, then deleted locally; the directory
    goes once empty. The caller holds the dataset's lock and lists the shards
    afterwards (`recover` does both).

    Args:
      store: the `store.storage.storage` object reaching `dataset`.
      dataset: the dataset's URL.
      directory: where the shards are kept, if not in the default place.
      is_shard: whether a name is a shard's: other files (a `dataset_info.json`
        planted in a directory given by hand) are never uploaded.

    Returns:
      The names of the shards uploaded.
    """
    dataset = dataset.rstrip("/")
    directory = directory or kept_directory(dataset)
    names = kept_shards(directory, is_shard)
    if not names:
        return []
    uploaded = []
    for name in names:
        local = os.path.join(directory, name)
        target = store.join(dataset, _shard_name(name))
        if store.exists(target):
            # An upload whose answer was lost may have arrived: the same bytes are
            # dropped here; other bytes are left alone (nothing is overwritten).
            if store.size(target) != os.path.getsize(local) or not _same_bytes(
                store, target, local
            ):
                _log.warning("%s: %s exists with other bytes; the copy stays", local, target)
                continue
        else:
            store.upload(local, target)
            _log.warning("uploaded the kept shard %s to %s", local, target)
        os.unlink(local)
        uploaded.append(name)
    if not kept_shards(directory):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, DESTINATION))
            os.rmdir(directory)
    return uploaded


def _shard_name(name: str) -> str:
    """A kept file's shard name: without the `.<pid>-<hex>` a second copy got."""
    return re.sub(r"\.\d+-[0-9a-f]{8}$", "", name)


def _same_bytes(store: object, target: str, local: str) -> bool:
    with open(local, "rb") as f:
        return store.read_bytes(target) == f.read()
