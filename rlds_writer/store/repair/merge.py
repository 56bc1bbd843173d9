"""Parallel writers and `merge`: many directories in, one dataset out.

Only one writer may write a directory. Writers that run in parallel (Ray
actors, RLlib EnvRunners, processes) each take their own subdirectory,
`writer_directory(root, writer_id)`, which is a complete dataset on its own;
`tfds.builder_from_directories` reads them together as they are. `merge`
combines them into one directory with one contiguous shard sequence per split.

A merge is safe to interrupt and rerun. It first writes a plan (the journal
`.rlds_writer.merge.json` in the destination) that fixes, for every source
shard, the destination file it becomes. Each step is idempotent: a destination
shard appears only complete (copied to a temporary name, then renamed), and a
step whose destination already holds the shard is skipped. `dataset_info.json`
is written last, then the journal is removed, so the destination is a dataset
only once it is complete. Rerunning the same merge reads the journal and
finishes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import DatasetExistsError, IncompatibleDatasetError, MergeError, counted
from rlds_writer.store.dataset import json_values, layout
from rlds_writer.store.dataset.locate import not_a_dataset
from rlds_writer.store.dataset.locking import DirectoryLock
from rlds_writer.store.repair import recovery
from rlds_writer.store.storage import file_io, storage
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)

MERGE_JOURNAL = layout.MERGE_JOURNAL
_JOURNAL_VERSION = 1
_WRITER_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def writer_directory(root: epath.PathLike, writer_id: int | str) -> epath.Path:
    """Returns the subdirectory of `root` that writer `writer_id` should write.

    Each parallel writer (process, Ray actor, RLlib EnvRunner) writes its own
    directory, `root/writer-<writer_id>`; combine them with `merge` or read
    them together with `tfds.builder_from_directories`.

    Args:
      root: the directory that holds every writer's subdirectory (local, or an
        fsspec URL).
      writer_id: a number or a name; characters other than letters, digits,
        `_`, `.` and `-` become `_`.

    Returns:
      The subdirectory's path (not created).
    """
    text = str(writer_id)
    if isinstance(writer_id, int) and writer_id >= 0:
        text = f"{writer_id:05d}"
    safe = _WRITER_ID.sub("_", text).strip(".")
    if not safe:
        raise ValueError(f"writer_id {writer_id!r} has no usable character")
    return as_path(root) / f"writer-{safe}"


@dataclasses.dataclass
class MergeReport:
    """What `merge` did.

    Attributes:
      dest: the merged dataset's directory.
      sources: the source directories, in merge order.
      splits: split name -> shard lengths of the merged dataset.
      episodes: split name -> episodes in the merged dataset.
      shards_moved: shards moved (renamed) by this run.
      shards_copied: shards copied by this run.
      shards_already_done: shards an earlier, interrupted run had placed.
      resumed: whether this run finished an interrupted merge.
      recovered: source -> recovery summary, for sources recovery changed.
    """

    dest: str
    sources: list[str]
    splits: dict[str, list[int]]
    episodes: dict[str, int]
    shards_moved: int
    shards_copied: int
    shards_already_done: int
    resumed: bool
    recovered: dict[str, str]

    def summary(self) -> str:
        splits = ", ".join(
            f"{name}: {counted(self.episodes[name], 'episode')} in {counted(len(lengths), 'shard')}"
            for name, lengths in self.splits.items()
        )
        verb = "finished the interrupted merge of" if self.resumed else "merged"
        return (
            f"{verb} {counted(len(self.sources), 'directory', 'directories')} into {self.dest} "
            f"({splits}); {counted(self.shards_moved, 'shard')} moved, "
            f"{self.shards_copied} copied, {self.shards_already_done} already in place"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def merge(
    sources: Sequence[epath.PathLike],
    dest: epath.PathLike,
    *,
    move: bool = False,
    recover_sources: bool = True,
) -> MergeReport:
    """Merges datasets written by parallel writers into one dataset.

    Features, name, version and file format must agree. Episodes keep their
    order: each split holds the first source's shards, then the second's, and
    so on, renumbered into one contiguous sequence. `dataset_info.json` lists
    them all; `features.json` (and any feature metadata files) come from the
    first source; `metadata.json` holds the keys whose value every source
    shares, plus `merged_from`: for each source, its directory name, the
    episode range it fills in each split, and its metadata keys that differ.

    Args:
      sources: dataset directories (local, or fsspec URLs), in order.
      dest: the merged dataset's directory; must not hold a dataset, unless it
        holds an unfinished merge of the same sources, which is then finished.
      move: move the shard files (a rename on one file system) instead of
        copying them. The sources are then removed once the merge is complete.
      recover_sources: run `recover` on every source first, so a crashed
        writer's torn tail is cut and its unlisted episodes are included.

    Returns:
      A `MergeReport`.

    Raises:
      IncompatibleDatasetError: the sources' features, name, version or file
        format differ (the message lists every difference).
      DatasetExistsError: `dest` already holds a dataset.
      MergeError: `dest` holds an unfinished merge of other sources, or a
        source shard the plan needs is gone.
      LockedError: a writer is still writing a source or `dest`.
    """
    if not sources:
        raise ValueError("merge needs at least one source directory")
    dest = as_path(dest)
    source_paths = [as_path(s) for s in sources]
    names = [os.fspath(s) for s in source_paths]
    if len(set(names)) != len(names):
        raise ValueError(f"a source is listed twice: {names}")
    if os.fspath(dest) in names or _same_dir(dest, source_paths):
        raise ValueError(f"the destination {dest} is one of the sources")
    dest.mkdir(parents=True, exist_ok=True)
    locks: list[DirectoryLock] = []
    try:
        lock = DirectoryLock(dest, purpose="merge")
        lock.acquire()
        locks.append(lock)
        journal_path = dest / MERGE_JOURNAL
        resumed = journal_path.exists()
        recovered: dict[str, str] = {}
        if resumed:
            file_io.refuse_symlink(journal_path, "merge journal")
            plan = json.loads(journal_path.read_text())
            _check_resume(plan, names, move, dest)
            for source in source_paths:
                if source.exists():
                    locks.append(_lock(source))
        else:
            if layout.holds_dataset(dest):
                raise DatasetExistsError(
                    f"{dest} already holds a dataset; merge into a new (or empty) directory"
                )
            for source in source_paths:
                if not (source / layout.DATASET_INFO).exists():
                    raise not_a_dataset(source)
                locks.append(_lock(source))
            if recover_sources:
                for source in source_paths:
                    report = recovery.run_recovery(source, dry_run=False, verify_data=True)
                    if report.changed:
                        recovered[os.fspath(source)] = report.summary()
            plan = _make_plan(source_paths, move)
            file_io.atomic_write_text(journal_path, json.dumps(plan, indent=1), fsync=True)
        counts = _execute(plan, dest)
        _commit(plan, dest)
        if move:
            _remove_sources(plan, locks[1:])
        journal_path.unlink()
        file_io.fsync_directory(dest)
    finally:
        for lock in reversed(locks):
            lock.release()
    splits = {name: lengths for name, lengths in plan["splits"].items()}
    report = MergeReport(
        dest=os.fspath(dest),
        sources=names,
        splits=splits,
        episodes={name: sum(lengths) for name, lengths in splits.items()},
        shards_moved=counts["moved"],
        shards_copied=counts["copied"],
        shards_already_done=counts["done"],
        resumed=resumed,
        recovered=recovered,
    )
    _log.info("%s", report.summary())
    return report


# ---------------------------------------------------------------- planning


def _same_dir(dest: epath.Path, sources: list[epath.Path]) -> bool:
    if not file_io.is_local(dest):
        return False
    return any(
        file_io.is_local(s) and os.path.realpath(s) == os.path.realpath(dest) for s in sources
    )


def _lock(source: epath.Path) -> Any:
    lock = DirectoryLock(source, purpose="merge")
    lock.acquire()
    return lock


def _check_resume(plan: dict[str, Any], names: list[str], move: bool, dest: epath.Path) -> None:
    if plan.get("journal_version") != _JOURNAL_VERSION:
        raise MergeError(f"{dest / MERGE_JOURNAL} was written by another version of rlds_writer")
    if plan["sources"] != names or plan["move"] != move:
        raise MergeError(
            f"{dest} holds an unfinished merge of {plan['sources']} "
            f"({'move' if plan['move'] else 'copy'}); rerun that merge to finish it, "
            "or delete the destination directory to start over"
        )
    # The journal sits in the destination: a crafted one must not make the merge
    # move or delete files anywhere but inside the sources and the destination.
    for step in plan["steps"]:
        inside = isinstance(step["src"], str) and any(_in_directory(step["src"], n) for n in names)
        if (
            not inside
            or os.path.basename(step["dst"]) != step["dst"]
            or step["dst"] in ("", ".", "..")
        ):
            raise MergeError(
                f"{dest / MERGE_JOURNAL} names {step['src']!r} -> {step['dst']!r}, outside the "
                "merge's directories; delete the destination directory and merge again"
            )
    for filename in plan["files"]:
        layout.check_name(filename, "file name", os.fspath(dest / MERGE_JOURNAL))


def _in_directory(path: str, directory: str) -> bool:
    """Whether `path` names a file directly in `directory`, protocols compared as written.

    `os.path.normpath` alone turns `s3://b/x` into `s3:/b/x`, which a journal could
    spell to pass as the source and be read as a local relative path.
    """
    protocol, rest = storage.split_protocol(path)
    dir_protocol, dir_rest = storage.split_protocol(directory)
    if protocol != dir_protocol:
        return False
    if protocol:
        # Object keys are taken as written: no `.`, `..` or empty names to collapse.
        parts = rest.split("/")
        if any(part in ("", ".", "..") for part in parts):
            return False
        return "/".join(parts[:-1]) == dir_rest.rstrip("/")
    return os.path.dirname(os.path.normpath(path)) == os.path.normpath(directory)


def _read_source(source: epath.Path) -> dict[str, Any]:
    for filename in (layout.DATASET_INFO, layout.FEATURES, layout.METADATA):
        file_io.refuse_symlink(source / filename, filename)
    info = file_io.read_json(source / layout.DATASET_INFO)
    where = os.fspath(source / layout.DATASET_INFO)
    layout.split_templates(info, where)  # names that stay inside the directory
    layout.read_splits(info, where)
    features_text = (source / layout.FEATURES).read_text()
    metadata = None
    if (source / layout.METADATA).exists():
        metadata = file_io.read_json(source / layout.METADATA)
    return {
        "path": source,
        "info": info,
        "features": json.loads(features_text),
        "features_text": features_text,
        "metadata": metadata,
    }


def _check_compatible(read: list[dict[str, Any]]) -> None:
    first = read[0]
    problems = []
    for other in read[1:]:
        where = f"{other['path']} (vs the first source {first['path'].name})"
        for key, label in (("name", "name"), ("version", "version")):
            a, b = first["info"].get(key), other["info"].get(key)
            if a != b:
                problems.append(f"{where}: {label} {b!r} != {a!r}")
        fa = layout.file_format_of(first["info"])
        fb = layout.file_format_of(other["info"])
        if fa != fb:
            problems.append(f"{where}: file format {fb!r} != {fa!r}")
        problems.extend(
            f"{where}: features differ at {path}: {b!r} != {a!r}"
            for path, a, b in json_values.json_diff(first["features"], other["features"])
        )
    if problems:
        raise IncompatibleDatasetError("cannot merge: " + "; ".join(problems))


def _merge_metadata(
    read: list[dict[str, Any]], ranges: list[dict[str, list[int]]]
) -> dict[str, Any] | None:
    metas = [r["metadata"] for r in read]
    if all(m is None for m in metas):
        return None
    dicts = [m if isinstance(m, dict) else {} for m in metas]
    common = {
        key: value
        for key, value in dicts[0].items()
        if all(key in d and d[key] == value for d in dicts[1:])
    }
    out = dict(common)
    out["merged_from"] = [
        {
            "source": r["path"].name,
            "episodes": rng,
            "metadata": {k: v for k, v in d.items() if k not in common},
        }
        for r, d, rng in zip(read, dicts, ranges, strict=True)
    ]
    return out


def _make_plan(sources: list[epath.Path], move: bool) -> dict[str, Any]:
    read = [_read_source(s) for s in sources]
    _check_compatible(read)
    first = read[0]
    name = first["info"]["name"]
    file_format = layout.file_format_of(first["info"])
    split_names: list[str] = []
    for r in read:
        for split in layout.read_splits(r["info"]):
            if split not in split_names:
                split_names.append(split)
    steps = []
    splits: dict[str, list[int]] = {}
    split_bytes: dict[str, int] = {}
    ranges: list[dict[str, list[int]]] = [{} for _ in read]
    for split in split_names:
        lengths: list[int] = []
        nbytes = 0
        for source_index, r in enumerate(read):
            src_lengths, src_bytes = layout.read_splits(r["info"]).get(split, ([], 0))
            template = layout.split_templates(r["info"]).get(split)
            start = sum(lengths)
            for index, n in enumerate(src_lengths):
                if n == 0:
                    continue
                # Source shards are named by their own template (TFDS's -of- names too).
                src = r["path"] / template.filename(index, len(src_lengths))
                if not src.exists():
                    raise MergeError(f"{src} is listed in its dataset_info.json but missing")
                file_io.refuse_symlink(src, "shard file")
                steps.append(
                    {
                        "src": os.fspath(src),
                        "dst": layout.shard_name(name, split, file_format, len(lengths)),
                        "size": src.stat().st_size,
                    }
                )
                lengths.append(n)
            nbytes += src_bytes
            ranges[source_index][split] = [start, sum(lengths)]
        splits[split] = lengths
        split_bytes[split] = nbytes
    ours = {s: layout.ShardTemplate(layout.FILEPATH_TEMPLATE, name, s, file_format) for s in splits}
    info = layout.with_splits(first["info"], {s: (splits[s], split_bytes[s]) for s in splits}, ours)
    extra_files = {
        child.name: child.read_text()
        for child in first["path"].iterdir()
        if not child.name.startswith(".")
        and child.name not in (layout.DATASET_INFO, layout.METADATA)
        and not layout.ANY_SHARD.match(child.name)
        and not (file_io.is_local(child) and os.path.islink(child))
        and child.is_file()
    }
    return {
        "journal_version": _JOURNAL_VERSION,
        "sources": [os.fspath(s) for s in sources],
        "move": move,
        "steps": steps,
        "splits": splits,
        "dataset_info": info,
        "files": extra_files,  # features.json and any feature metadata files
        "metadata": _merge_metadata(read, ranges),
    }


# --------------------------------------------------------------- execution


def _execute(plan: dict[str, Any], dest: epath.Path) -> dict[str, int]:
    counts = {"moved": 0, "copied": 0, "done": 0}
    for step in plan["steps"]:
        src = as_path(step["src"])
        dst = dest / step["dst"]
        if dst.exists():
            size = dst.stat().st_size
            if size != step["size"]:
                raise MergeError(
                    f"{dst} exists with {size} bytes, but the merge plan puts {src} "
                    f"({step['size']} bytes) there; delete the destination and merge again"
                )
            if plan["move"] and src.exists():
                src.unlink()  # a cross-device move stopped after its copy
            counts["done"] += 1
            continue
        if not src.exists():
            raise MergeError(f"{src} is gone; the merge plan needs it for {dst}")
        if plan["move"]:
            try:
                if not (file_io.is_local(src) and file_io.is_local(dst)):
                    # Object storage has no rename: copy, then delete (the journal
                    # finishes a move killed between the two).
                    raise OSError(errno.EXDEV, "not one file system")
                src.rename(dst)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
                file_io.copy_complete(src, dst, ".merge-tmp")
                src.unlink()
            counts["moved"] += 1
        else:
            file_io.copy_complete(src, dst, ".merge-tmp")
            counts["copied"] += 1
    return counts


def _commit(plan: dict[str, Any], dest: epath.Path) -> None:
    for filename, text in plan["files"].items():
        file_io.atomic_write_text(dest / filename, text, fsync=True)
    if plan["metadata"] is not None:
        file_io.atomic_write_text(
            dest / layout.METADATA, json.dumps(plan["metadata"], indent=2), fsync=True
        )
    file_io.fsync_directory(dest)
    file_io.atomic_write_text(
        dest / layout.DATASET_INFO, json_values.dumps_info(plan["dataset_info"]), fsync=True
    )


def _remove_sources(plan: dict[str, Any], source_locks: list[Any]) -> None:
    """After a move, deletes what is left of each source (its JSON files)."""
    for source in plan["sources"]:
        path = as_path(source)
        if not path.exists():
            continue
        for filename in [layout.DATASET_INFO, *plan["files"], layout.METADATA]:
            with contextlib.suppress(FileNotFoundError):
                (path / filename).unlink()
    for lock in source_locks:
        lock.release()
    for source in plan["sources"]:
        path = as_path(source)
        with contextlib.suppress(OSError):
            if path.exists() and not any(path.iterdir()):
                path.rmdir()
