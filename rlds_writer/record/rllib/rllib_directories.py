"""The runner directories of an RLlib recording's output root: found, claimed, merged.

<root>/writer-00001/            one dataset per EnvRunner (single-agent)
<root>/<module_id>/writer-00001 one per module and EnvRunner (multi-agent)
<root>/merged[/<module_id>]     after the merge at `algo.stop()`
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from etils import epath

from rlds_writer.errors import DatasetExistsError, LockedError
from rlds_writer.record.rllib import rllib_multiagent as multi
from rlds_writer.store.dataset import layout
from rlds_writer.store.dataset.locking import DirectoryLock
from rlds_writer.store.repair.merge import merge as merge_directories
from rlds_writer.store.repair.merge import writer_directory
from rlds_writer.store.storage import file_io
from rlds_writer.store.storage.object_path import as_path

_log = logging.getLogger(__name__)

MERGED = "merged"


def _is_writer_directory(path: epath.Path) -> bool:
    return path.name.startswith("writer-") and (path / "features.json").exists()


def runner_directories(output_root: epath.PathLike) -> list[epath.Path]:
    """The per-runner dataset directories under `output_root`, sorted by name."""
    root = as_path(output_root)
    if not root.exists():
        return []
    return sorted((p for p in root.iterdir() if _is_writer_directory(p)), key=lambda p: p.name)


def all_runner_directories(output_root: epath.PathLike) -> list[epath.Path]:
    """Single-agent and per-module runner directories under `output_root`."""
    return runner_directories(output_root) + [
        p for dirs in multi.module_runner_directories(output_root).values() for p in dirs
    ]


def merged_directory(opts: Mapping[str, Any]) -> epath.Path:
    """Where the runner datasets are merged (`merged_directory`, or `<root>/merged`)."""
    return as_path(opts["merged_directory"] or as_path(opts["output_root"]) / MERGED)


def datasets_in(merged: epath.Path) -> list[str]:
    """The merged datasets in `merged` (itself, or one per module)."""
    if (merged / "features.json").exists():
        return [merged.name]
    if not merged.exists():
        return []
    return sorted(
        f"{merged.name}/{p.name}" for p in merged.iterdir() if (p / "features.json").exists()
    )


def prepare_output_root(opts: Mapping[str, Any]) -> None:
    """Applies `mode` to an output root (refuse, or delete earlier recordings) and makes it."""
    root = as_path(opts["output_root"])
    existing = all_runner_directories(root)
    merged = merged_directory(opts)
    merged_sets = datasets_in(merged)
    if opts["mode"] == "error" and (existing or merged_sets):
        names = [str(p.relative_to(root)) for p in existing] + [str(p) for p in merged_sets]
        raise DatasetExistsError(
            f"{root} already holds recorded datasets ({', '.join(names)}); pass "
            "mode='overwrite' to replace them or mode='append' (with merge=False)"
        )
    if opts["mode"] == "overwrite":
        for path in existing:
            _remove_tree(path)
        if merged.exists():
            _remove_tree(merged)
    root.mkdir(parents=True, exist_ok=True)


def _remove_tree(path: Any) -> None:
    """Removes a directory tree, on disk or in a bucket (objects one by one)."""
    if file_io.is_local(path):
        epath.Path(path).rmtree()
        return
    for child in list(path.iterdir()):
        if child.is_dir():
            _remove_tree(child)
        else:
            child.unlink(missing_ok=True)


def free_directory(root: epath.PathLike, base: str) -> epath.Path:
    """A runner's directory, or a numbered sibling if a live writer holds it.

    A restarted runner reuses its predecessor's directory (the dead
    writer's lock is released by the kernel). On object stores a lock of
    a runner on another host cannot be taken over, so a new directory
    (`writer-00001.1`, ...) is used instead.
    """
    for attempt in range(100):
        directory = writer_directory(root, base if attempt == 0 else f"{base}.{attempt}")
        directory.mkdir(parents=True, exist_ok=True)
        lock = DirectoryLock(directory)
        try:
            lock.acquire()
        except LockedError:
            continue
        lock.release()
        return directory
    raise RuntimeError(f"no free writer directory for runner {base} under {root}")


def merge_runner_datasets(opts: Mapping[str, Any]) -> Any:
    """Merges the runner directories into the merged directory (per module if multi-agent).

    Returns:
      The `MergeReport` (multi-agent: module id -> report), or None if
      nothing was recorded.
    """
    root = as_path(opts["output_root"])
    move = opts["move_on_merge"]
    merged = merged_directory(opts)
    modules = multi.module_runner_directories(root)
    if modules:
        reports = {}
        for module_id, sources in modules.items():
            reports[module_id] = merge_directories(sources, merged / module_id, move=move)
            module_root = root / module_id
            if move and module_root.exists() and not any(module_root.iterdir()):
                module_root.rmdir()
        return reports
    sources = runner_directories(root)
    if not sources:
        _log.warning("no episode was recorded under %s; nothing to merge", root)
        return None
    return merge_directories(sources, merged, move=move)


def recorded_episode_counts(output_root: epath.PathLike) -> dict[str, int]:
    """Episodes per split over every runner directory (from `dataset_info.json`)."""
    counts: dict[str, int] = {}
    for path in all_runner_directories(output_root):
        info = file_io.read_json(path / layout.DATASET_INFO)
        for split, (lengths, _) in layout.read_splits(info).items():
            counts[split] = counts.get(split, 0) + sum(lengths)
    return counts
