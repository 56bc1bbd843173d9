"""The driver's side of an RLlib recording on a Ray cluster: one actor on the driver's node.

`EpisodeSink` runs as a Ray actor pinned to the node of the process that
builds the algorithm (the driver, where `algo.stop()` merges). It does two
things for every EnvRunner, whatever node it runs on:

* keeps each runner's **report**: the episodes it finished, per dataset
  directory on the driver's node and split, sent after every flush (the end
  of each `sample()`) and at close. A restarted runner is a new
  *incarnation* with its own report; the reports of dead ones stay.
* receives the **closed shards** of a runner that cannot see the driver's
  files (another node, no shared file system) and mirrors its datasets into
  directories of the output root on the driver's node: whole shard files
  first (each written to a temporary name and renamed into place), then
  `features.json`/`metadata.json`, then `dataset_info.json`, so that the
  mirror is always a consistent dataset listing only complete shards.
* with an object-store output root (`s3://`, `gs://`) it receives the
  shards of **every** runner: runners never write, nor lock, the bucket.
  The sink assembles each shard in a local temporary file on the driver's
  node, uploads it whole through the storage seam when it is complete, and
  writes the JSON files last with plain overwrites (`dataset_info.json`
  last), so a reader of the bucket never sees a shard that is not listed
  complete. Only the sink writes a mirror, so no lock object is made in the
  bucket that a killed runner could leave behind.

This module imports no TensorFlow and no RLlib: the actor process stays
small. The runner's side is `record/rllib/rllib_delivery.py`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from etils import epath

from rlds_writer.errors import LockedError, UnsafePathError
from rlds_writer.store.dataset import layout
from rlds_writer.store.dataset.locking import DirectoryLock
from rlds_writer.store.storage import file_io, storage, unsaved_shards
from rlds_writer.store.storage.object_path import as_path

# Files of a dataset directory a mirror receives after its shards, the listing last.
METADATA_FILES = (layout.FEATURES, layout.METADATA)
LISTING = layout.DATASET_INFO


def sink_name(output_root: str, job_id: str) -> str:
    """The actor's name: one sink per Ray job and output root."""
    digest = hashlib.sha256(os.fspath(output_root).encode()).hexdigest()[:16]
    return f"rlds_writer.sink.{job_id}.{digest}"


def _checked_relative(relpath: str) -> str:
    """`relpath` (from a runner) as a path inside the output root: no `..`, no absolute path."""
    parts = relpath.split("/")
    if (
        not relpath
        or relpath.startswith("/")
        or any(p in ("", ".", "..") or "\\" in p for p in parts)
    ):
        raise UnsafePathError(f"runner sent the path {relpath!r}, which leaves the output root")
    return relpath


class EpisodeSink:
    """Reports and mirrored datasets of every EnvRunner, on the driver's node.

    Args:
      output_root: the recording's output root: a directory of the driver's
        node, or an object-store path (`s3://bucket/run`).
      fsync: fsync mirrored files and directories (the writers' `fsync`).
    """

    def __init__(self, output_root: str, fsync: bool = False):
        self.root = as_path(output_root)
        self.remote = storage.is_remote(output_root)
        self.fsync = fsync
        # Object stores: shards are assembled here, then uploaded whole.
        self.staging = tempfile.mkdtemp(prefix="rlds_writer-sink-") if self.remote else None
        self._uploaded: dict[str, bytes] = {}  # object -> the JSON bytes last written there
        self.reports: dict[str, dict[str, Any]] = {}
        # incarnation -> {runner's dataset dir (relative): mirror dir (relative)}
        self.mirrors: dict[str, dict[str, str]] = {}
        self.locks: dict[str, list[DirectoryLock]] = {}

    def sees(self, relpath: str) -> bool:
        """Whether a file a runner just made in the output root exists here (shared storage)."""
        if self.remote:
            return False  # runners never write the bucket themselves
        return (self.root / _checked_relative(relpath)).exists()

    def mirror(self, incarnation: str, dataset: str) -> str:
        """The mirror directory (relative to the root) of one runner dataset, made and locked."""
        dataset = _checked_relative(dataset)
        mirrors = self.mirrors.setdefault(incarnation, {})
        if dataset in mirrors:
            return mirrors[dataset]
        parent, _, base = dataset.rpartition("/")
        for attempt in range(1000):
            name = base if attempt == 0 else f"{base}.{attempt}"
            relative = f"{parent}/{name}" if parent else name
            directory = self.root / relative
            if relative in {m for ms in self.mirrors.values() for m in ms.values()}:
                continue
            if self.remote:
                # Only this sink writes mirrors in the bucket: no lock object to leave behind.
                if directory.exists() and any(True for _ in directory.iterdir()):
                    continue  # an earlier run's directory: never mixed with this one
                mirrors[dataset] = relative
                return relative
            if os.path.islink(directory) or os.path.islink(directory.parent):
                continue  # a link planted in the root: never written through
            directory.mkdir(parents=True, exist_ok=True)
            lock = DirectoryLock(directory, purpose="mirror")
            try:
                lock.acquire()
            except LockedError:
                continue
            if any(p.name != layout.LOCK for p in directory.iterdir()):
                lock.release()  # an earlier run's directory: never mixed with this one
                continue
            self.locks.setdefault(incarnation, []).append(lock)
            mirrors[dataset] = relative
            return relative
        raise LockedError(f"no free directory to mirror runner dataset {dataset} under {self.root}")

    def put(self, incarnation: str, dataset: str, name: str, data: bytes, offset: int) -> int:
        """Writes `data` at `offset` of the temporary copy of shard `name`; returns its size."""
        path = self._temp(incarnation, dataset, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags | (os.O_TRUNC if offset == 0 else 0), 0o644)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def seal(self, incarnation: str, dataset: str, name: str, size: int) -> None:
        """Moves the complete temporary copy of shard `name` into the mirror (object
        stores: uploads it whole)."""
        path = self._temp(incarnation, dataset, name)
        if os.path.getsize(path) != size:
            raise OSError(f"{path}: received {os.path.getsize(path)} of {size} bytes")
        if self.remote:
            # A failed upload keeps the shard in the kept directory (UploadFailedError names
            # it) for `recover`, as the writers' own uploads do; `finish` removes staging.
            target = os.fspath(self._target(incarnation, dataset, name))
            unsaved_shards.upload_or_keep(storage.storage_for(target), path, target)
            return
        if self.fsync:
            file_io.fsync_file(path)
        os.replace(path, self._target(incarnation, dataset, name))

    def commit(self, incarnation: str, dataset: str, files: dict[str, bytes]) -> None:
        """Writes a runner dataset's JSON files into its mirror, `dataset_info.json` last."""
        for name in sorted(files, key=lambda n: n == LISTING):
            if name not in (*METADATA_FILES, LISTING):
                raise UnsafePathError(f"runner sent {name!r}; a mirror takes only dataset JSON")
            target = self._target(incarnation, dataset, name)
            if self.remote:
                # One plain overwrite per object (no rename on object stores), the listing
                # last; unchanged JSON (features.json after the first sample()) is not re-sent.
                key = os.fspath(target)
                if self._uploaded.get(key) != files[name]:
                    storage.storage_for(key).replace_bytes(key, files[name])
                    self._uploaded[key] = files[name]
                continue
            with file_io.atomic_file(target, self.fsync) as f:
                f.write(files[name])

    def report(self, incarnation: str, report: dict[str, Any]) -> None:
        """Keeps a runner's latest report (episodes finished per directory and split)."""
        self.reports[incarnation] = report

    def finish(self) -> dict[str, dict[str, Any]]:
        """Releases every mirror and returns every incarnation's report (for the check)."""
        for locks in self.locks.values():
            for lock in locks:
                lock.release()
        self.locks.clear()
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        return self.reports

    def release(self, incarnation: str) -> None:
        """Releases one incarnation's mirrors (it closed its writers)."""
        for lock in self.locks.pop(incarnation, []):
            lock.release()

    def _target(self, incarnation: str, dataset: str, name: str) -> Any:
        if "/" in name or name in ("", ".", "..") or name == layout.LOCK:
            raise UnsafePathError(f"runner sent the file name {name!r}")
        return self.root / self.mirror(incarnation, dataset) / name

    def _temp(self, incarnation: str, dataset: str, name: str) -> str:
        # A name `recover` and `merge` know as a temporary file (`layout.TEMP_FILE`).
        target = self._target(incarnation, dataset, name)
        tag = hashlib.sha256(incarnation.encode()).hexdigest()[:16]
        if self.remote:
            # A flat local name: the mirror's path hashed, so two mirrors never collide.
            where = hashlib.sha256(os.fspath(target).encode()).hexdigest()[:24]
            return os.path.join(self.staging, f".{where}.tmp-{os.getpid()}-{tag}")
        return os.fspath(target.parent / f".{target.name}.tmp-{os.getpid()}-{tag}")


def start_sink(output_root: str, fsync: bool) -> Any:
    """Starts the sink actor on this process's node (the driver's); returns its handle."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    context = ray.get_runtime_context()
    actor = ray.remote(EpisodeSink).options(
        name=sink_name(output_root, context.get_job_id()),
        num_cpus=0,
        max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False),
    )
    return actor.remote(os.fspath(output_root), fsync)


def start_driver_sink(root: epath.PathLike, opts: Mapping[str, Any]) -> Any:
    """The driver's sink for an `RLDSRecorder` (None without Ray: one process writes)."""
    import ray

    if not ray.is_initialized():
        return None
    fsync = bool((opts["writer_kwargs"] or {}).get("fsync", False))
    return start_sink(os.fspath(root), fsync)


def find_sink(output_root: str) -> Any:
    """The sink of this Ray job and output root, or None (no Ray, or no sink started)."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    try:
        return ray.get_actor(sink_name(output_root, ray.get_runtime_context().get_job_id()))
    except ValueError:
        return None
