"""Crash recovery: make a dataset directory list exactly what its shards hold.

After a crash the open shard may end in a torn record and `dataset_info.json`
may not list the episodes written since its last commit. `recover` scans every
split's shard files, keeps every complete record, cuts a torn tail, renumbers
shard files into one contiguous sequence if needed, and commits
`dataset_info.json` atomically. It is idempotent: on a healthy dataset it
changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any

from etils import epath

from rlds_writer import layout, tfrecord

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class ShardReport:
    """What recovery found in one shard file."""

    file: str
    records: int
    num_bytes: int
    listed: int | None
    action: str  # "ok", "truncated", "listed", "removed-empty", "renamed", "quarantined"
    detail: str = ""


@dataclasses.dataclass
class RecoveryReport:
    """What `recover` found and did.

    Attributes:
      path: the dataset directory.
      splits: split name -> shard lengths after recovery.
      shards: one entry per shard file looked at.
      changed: whether anything on disk was changed.
    """

    path: str
    splits: dict[str, list[int]]
    shards: list[ShardReport]
    changed: bool

    def summary(self) -> str:
        parts = []
        for name, lengths in self.splits.items():
            parts.append(f"{name}: {sum(lengths)} episodes in {len(lengths)} shards")
        acted = [s for s in self.shards if s.action != "ok"]
        for s in acted:
            parts.append(f"{s.file}: {s.action} {s.detail}".strip())
        if not self.changed:
            parts.append("nothing to change")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _split_names(path: epath.Path, name: str, file_format: str, info: dict) -> list[str]:
    names = [entry["name"] for entry in info.get("splits", [])]
    pattern = re.compile(rf"^{re.escape(name)}-(.+)\.{re.escape(file_format)}-\d{{5,}}$")
    for child in sorted(path.iterdir()):
        m = pattern.match(child.name)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


def _scan_tfrecord(path: epath.Path) -> tfrecord.ScanResult:
    size = path.stat().st_size
    with path.open("rb") as f:
        return tfrecord.scan(f, size, os.fspath(path))


def _count_array_record(path: epath.Path) -> tuple[int, int, str | None]:
    """Returns (records, bytes, problem) for an array_record file."""
    from array_record.python import array_record_module

    try:
        reader = array_record_module.ArrayRecordReader(os.fspath(path))
        try:
            n = reader.num_records()
            nbytes = sum(len(r) for r in reader.read_all()) if n else 0
        finally:
            reader.close()
        return n, nbytes, None
    except Exception as e:  # noqa: BLE001 - a torn file raises many kinds
        return 0, 0, f"unreadable ({e})"


def _truncate(path: epath.Path, size: int) -> None:
    if layout.is_local(path):
        os.truncate(path, size)
    else:
        data = path.read_bytes()[:size]
        path.write_bytes(data)


def recover(
    path: epath.PathLike, *, dry_run: bool = False, _locked: bool = False
) -> RecoveryReport:
    """Scans a dataset's shards and makes `dataset_info.json` list all of them.

    Args:
      path: the dataset directory.
      dry_run: report what would be done without changing anything.
      _locked: the caller already holds the directory lock (the writer's append).

    Returns:
      A `RecoveryReport`.

    Raises:
      FileNotFoundError: if the directory has no `dataset_info.json` or
        `features.json` (nothing to recover a dataset from).
      LockedError: if a live writer holds the directory.
    """
    from rlds_writer.locking import DirectoryLock

    path = epath.Path(path)
    info_path = path / layout.DATASET_INFO
    if not info_path.exists():
        raise FileNotFoundError(f"{path} has no {layout.DATASET_INFO}; it is not a dataset")
    lock = None
    if not _locked and not dry_run:
        lock = DirectoryLock(path)
        lock.acquire()
    try:
        return _recover(path, dry_run)
    finally:
        if lock is not None:
            lock.release()


def _recover(path: epath.Path, dry_run: bool) -> RecoveryReport:
    info = layout.read_json(path / layout.DATASET_INFO)
    name = info["name"]
    file_format = info.get("fileFormat", "tfrecord")
    listed = layout.read_splits(info)
    reports: list[ShardReport] = []
    changed = False
    new_splits: dict[str, tuple[list[int], int]] = {}
    for split in _split_names(path, name, file_format, info):
        files = layout.list_shard_files(path, name, split, file_format)
        listed_lengths = listed.get(split, ([], 0))[0]
        kept: list[tuple[epath.Path, int, int]] = []
        for index, file in files.items():
            listed_n = listed_lengths[index] if index < len(listed_lengths) else None
            if file_format == "tfrecord":
                result = _scan_tfrecord(file)
                records, nbytes = result.num_records, result.num_bytes
                if result.problem is not None:
                    cut = result.file_size - result.valid_size
                    reports.append(
                        ShardReport(
                            file.name,
                            records,
                            nbytes,
                            listed_n,
                            "truncated",
                            f"{result.problem}: cut {cut} bytes at offset {result.valid_size}",
                        )
                    )
                    changed = True
                    if not dry_run:
                        _truncate(file, result.valid_size)
                else:
                    reports.append(
                        ShardReport(
                            file.name,
                            records,
                            nbytes,
                            listed_n,
                            "ok" if listed_n == records else "listed",
                        )
                    )
                    changed |= listed_n != records
            else:
                records, nbytes, problem = _count_array_record(file)
                if problem is not None:
                    reports.append(ShardReport(file.name, 0, 0, listed_n, "quarantined", problem))
                    changed = True
                    if not dry_run:
                        file.rename(file.parent / f".corrupt-{file.name}")
                    continue
                reports.append(
                    ShardReport(
                        file.name,
                        records,
                        nbytes,
                        listed_n,
                        "ok" if listed_n == records else "listed",
                    )
                )
                changed |= listed_n != records
            if records == 0:
                reports[-1].action = "removed-empty"
                changed = True
                if not dry_run:
                    file.unlink()
                continue
            kept.append((file, records, nbytes))
        lengths = []
        total = 0
        for new_index, (file, records, nbytes) in enumerate(kept):
            target = path / layout.shard_name(name, split, file_format, new_index)
            if file != target:
                changed = True
                reports.append(
                    ShardReport(file.name, records, nbytes, None, "renamed", f"to {target.name}")
                )
                if not dry_run:
                    file.rename(target)
            lengths.append(records)
            total += nbytes
        if listed.get(split) != (lengths, total):
            changed = True
        new_splits[split] = (lengths, total)
    if changed and not dry_run:
        layout.atomic_write_text(
            path / layout.DATASET_INFO, layout.dumps_info(layout.with_splits(info, new_splits))
        )
    return RecoveryReport(
        path=os.fspath(path),
        splits={k: v[0] for k, v in new_splits.items()},
        shards=reports,
        changed=changed,
    )
