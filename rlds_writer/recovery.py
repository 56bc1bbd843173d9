"""Crash recovery: make a dataset directory list exactly what its shards hold.

After a crash the open shard may end in a torn record and `dataset_info.json`
may not list the episodes written since its last commit. `recover` scans every
split's shard files and:

- keeps every complete record: TFRecord records pass their length and data
  CRC checks; array_record shards are kept if their reader opens them;
- cuts a torn or garbage tail (truncating the file in place); a record in the
  middle of a shard whose data fails its CRC (bit rot, not a crash) is dropped
  by rewriting the shard without it, and the original file is kept as
  `.corrupt-<shard>-<time>`;
- deletes a shard holding nothing or only a torn first record, and sets aside
  (renames to `.corrupt-<shard>-<time>`) one that has other bytes but no
  readable record;
- renumbers the remaining shard files into one contiguous sequence;
- commits `dataset_info.json` atomically, with every shard's true length.

Every step can be interrupted and redone: truncation and deletion are
idempotent, a rewrite goes through a temporary file and an atomic rename, a
renumbering only moves files down into free slots, and `dataset_info.json` is
replaced last. Running `recover` on a healthy dataset changes nothing.
Changes are fsynced (files, then the directory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import struct
import time
from typing import Any

from etils import epath

from rlds_writer import layout, tfrecord
from rlds_writer.errors import RLDSWriterError

_log = logging.getLogger(__name__)

_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Temporary files of `layout.atomic_write_text` and of shard rewrites.
_TEMP_FILE = re.compile(r"^\..+\.(tmp-\d+|recover-tmp)$")
_ANY_SHARD = re.compile(r"^(?P<name>.+)-(?P<split>.+)\.(?P<format>tfrecord|array_record)-\d{5,}$")


class RecoveryError(RLDSWriterError):
    """A directory cannot be recovered (its dataset_info.json is lost, a merge is pending)."""


@dataclasses.dataclass
class ShardReport:
    """What recovery found in one shard file and did to it.

    Attributes:
      split: the split.
      file: the file's name when recovery found it.
      records: complete records kept.
      num_bytes: their total data size.
      listed: the shard length `dataset_info.json` gave, None if it was unlisted.
      actions: what was done: `ok`, `listed` (length corrected or shard added),
        `truncated`, `rewritten` (records dropped mid-file), `quarantined`,
        `removed-empty`, `removed-torn` (held only a torn first record),
        `renamed`.
      detail: human-readable notes, e.g. why and where a tail was cut.
      new_name: the file's name after renumbering, if it changed.
    """

    split: str
    file: str
    records: int
    num_bytes: int
    listed: int | None
    actions: list[str] = dataclasses.field(default_factory=list)
    detail: list[str] = dataclasses.field(default_factory=list)
    new_name: str | None = None


@dataclasses.dataclass
class RecoveryReport:
    """What `recover` found and did.

    Attributes:
      path: the dataset directory.
      file_format: `tfrecord` or `array_record`.
      splits: split name -> shard lengths after recovery.
      num_bytes: split name -> total record bytes after recovery.
      listed_before: split name -> shard lengths `dataset_info.json` listed before.
      shards: one entry per shard file looked at.
      removed_temp_files: leftover temporary files that were deleted.
      notes: anything else worth knowing.
      changed: whether anything on disk was (or, in a dry run, would be) changed.
      dry_run: whether this was a dry run.
    """

    path: str
    file_format: str
    splits: dict[str, list[int]]
    num_bytes: dict[str, int]
    listed_before: dict[str, list[int]]
    shards: list[ShardReport]
    removed_temp_files: list[str]
    notes: list[str]
    changed: bool
    dry_run: bool = False

    @property
    def episodes(self) -> dict[str, int]:
        """Split name -> number of episodes after recovery."""
        return {name: sum(lengths) for name, lengths in self.splits.items()}

    def summary(self) -> str:
        """One line: episodes per split and every action taken."""
        parts = []
        for name, lengths in self.splits.items():
            before = sum(self.listed_before.get(name, []))
            parts.append(
                f"{name}: {sum(lengths)} episodes in {len(lengths)} shards "
                f"(dataset_info.json listed {before})"
            )
        for s in self.shards:
            acted = [a for a in s.actions if a != "ok"]
            if acted:
                text = f"{s.file}: {', '.join(acted)}"
                if s.new_name:
                    text += f" -> {s.new_name}"
                if s.detail:
                    text += f" ({'; '.join(s.detail)})"
                parts.append(text)
        if self.removed_temp_files:
            parts.append(f"removed temporary files {', '.join(self.removed_temp_files)}")
        parts.extend(self.notes)
        if not self.changed:
            parts.append("nothing to change")
        elif self.dry_run:
            parts.append("dry run: nothing was changed")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as plain JSON-safe types."""
        out = dataclasses.asdict(self)
        out["episodes"] = self.episodes
        return out


def recover(
    path: epath.PathLike,
    *,
    dry_run: bool = False,
    verify_data: bool = True,
    _locked: bool = False,
) -> RecoveryReport:
    """Scans a dataset's shards and makes `dataset_info.json` list all of them.

    Args:
      path: the dataset directory (local or any `etils.epath` path).
      dry_run: report what would be done without changing anything.
      verify_data: check the data CRC of every TFRecord record. With False,
        shards whose record count matches `dataset_info.json` only have their
        record headers checked (the last shard of each split, where a crash
        leaves its tear, is always fully checked). Readers still check every
        CRC when they read.
      _locked: the caller already holds the directory lock (the writer's append).

    Returns:
      A `RecoveryReport`.

    Raises:
      FileNotFoundError: the directory does not exist.
      RecoveryError: `dataset_info.json` or `features.json` is missing or
        unreadable while shard files exist, or a merge into the directory was
        interrupted (rerun the merge instead).
      LockedError: a live writer holds the directory.
    """
    from rlds_writer.locking import DirectoryLock

    path = epath.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory")
    lock = None
    if not _locked and not dry_run:
        lock = DirectoryLock(path, purpose="recover")
        lock.acquire()
    try:
        return _Recovery(path, dry_run, verify_data).run()
    finally:
        if lock is not None:
            lock.release()


@dataclasses.dataclass
class _TFRecordScan:
    spans: list[tuple[int, int]]  # (offset, data length) of every good record
    file_size: int
    stop_offset: int  # where scanning stopped: file size, or the start of a bad tail
    tail_problem: str | None
    dropped: list[tuple[int, int, str]]  # (offset, framed size, reason) of bad records

    @property
    def num_bytes(self) -> int:
        return sum(length for _, length in self.spans)

    @property
    def kept_end(self) -> int:
        if not self.spans:
            return 0
        offset, length = self.spans[-1]
        return offset + tfrecord.HEADER_SIZE + length + tfrecord.FOOTER_SIZE


def scan_tfrecord(path: epath.PathLike, verify_data: bool = True) -> _TFRecordScan:
    """Walks a TFRecord file record by record.

    A bad length header or a record running past the end of the file ends the
    scan (everything from there is a tail to cut: the next record boundary is
    unknown). A record with a good header whose data fails its CRC is noted as
    dropped, and the scan goes on after it.
    """
    path = epath.Path(path)
    size = path.stat().length
    spans: list[tuple[int, int]] = []
    dropped: list[tuple[int, int, str]] = []
    tail_problem = None
    offset = 0
    with path.open("rb") as f:
        while offset < size:
            f.seek(offset)
            header = f.read(tfrecord.HEADER_SIZE)
            if len(header) < tfrecord.HEADER_SIZE:
                tail_problem = "truncated record header"
                break
            (length,) = _LEN.unpack_from(header, 0)
            (length_crc,) = _CRC.unpack_from(header, 8)
            if tfrecord.masked_crc32c(header[:8]) != length_crc:
                tail_problem = "length CRC mismatch (garbage or torn header)"
                break
            end = offset + tfrecord.HEADER_SIZE + length + tfrecord.FOOTER_SIZE
            if end > size:
                tail_problem = f"truncated record (needs {end - offset} bytes, has {size - offset})"
                break
            if verify_data:
                data = f.read(length)
                (data_crc,) = _CRC.unpack(f.read(tfrecord.FOOTER_SIZE))
                if tfrecord.masked_crc32c(data) != data_crc:
                    dropped.append((offset, end - offset, "data CRC mismatch"))
                    offset = end
                    continue
            spans.append((offset, length))
            offset = end
    return _TFRecordScan(spans, size, min(offset, size), tail_problem, dropped)


def _array_record_contents(path: epath.Path) -> tuple[int, int]:
    """Returns (records, bytes) of an array_record file; raises if it is unreadable."""
    from array_record.python import array_record_module

    reader = array_record_module.ArrayRecordReader(os.fspath(path))
    try:
        n = reader.num_records()
        nbytes = 0
        for start in range(0, n, 64):
            nbytes += sum(len(r) for r in reader.read(start, min(n, start + 64)))
        return n, nbytes
    finally:
        reader.close()


def _fsync_file(path: epath.Path) -> None:
    if layout.is_local(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_directory(path: epath.PathLike) -> None:
    """Makes renames, creations and deletions in a local directory durable."""
    if layout.is_local(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def quarantine_name(name: str) -> str:
    """Returns the hidden name a damaged file is set aside under."""
    return f".corrupt-{name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


class _Recovery:
    """One run of `recover` on one directory."""

    def __init__(self, path: epath.Path, dry_run: bool, verify_data: bool):
        self.path = path
        self.dry_run = dry_run
        self.verify_data = verify_data
        self.changed = False
        self.shards: list[ShardReport] = []
        self.notes: list[str] = []
        self.dir_dirty = False

    def run(self) -> RecoveryReport:
        from rlds_writer.merge import MERGE_JOURNAL

        if (self.path / MERGE_JOURNAL).exists():
            raise RecoveryError(
                f"a merge into {self.path} was interrupted ({MERGE_JOURNAL} is present); "
                "run the same merge again to finish it instead of recover"
            )
        removed_temp = self._remove_temp_files()
        info = self._read_info()
        if info is None:
            return self._interrupted_creation(removed_temp)
        name = info["name"]
        file_format = info.get("fileFormat", "tfrecord")
        listed = layout.read_splits(info)
        new_splits: dict[str, tuple[list[int], int]] = {}
        for split in self._split_names(name, file_format, listed):
            listed_lengths = listed.get(split, ([], 0))[0]
            new_splits[split] = self._recover_split(name, split, file_format, listed_lengths)
        for child in self.path.iterdir():
            m = _ANY_SHARD.match(child.name)
            if m and (m["name"] != name or m["format"] != file_format):
                self.notes.append(
                    f"ignored {child.name}: not a shard of {name!r} in {file_format} format"
                )
        if new_splits != listed:
            self.changed = True
            if not self.dry_run:
                if self.dir_dirty:
                    fsync_directory(self.path)
                layout.atomic_write_text(
                    self.path / layout.DATASET_INFO,
                    layout.dumps_info(layout.with_splits(info, new_splits)),
                    fsync=True,
                )
        elif self.dir_dirty and not self.dry_run:
            fsync_directory(self.path)
        report = RecoveryReport(
            path=os.fspath(self.path),
            file_format=file_format,
            splits={k: v[0] for k, v in new_splits.items()},
            num_bytes={k: v[1] for k, v in new_splits.items()},
            listed_before={k: v[0] for k, v in listed.items()},
            shards=self.shards,
            removed_temp_files=removed_temp,
            notes=self.notes,
            changed=self.changed,
            dry_run=self.dry_run,
        )
        if self.changed and not self.dry_run:
            _log.info("recovered %s: %s", self.path, report.summary())
        return report

    # ------------------------------------------------------------ helpers

    def _remove_temp_files(self) -> list[str]:
        # We hold the directory lock, so no live process owns these.
        removed = []
        for child in self.path.iterdir():
            if _TEMP_FILE.match(child.name):
                removed.append(child.name)
                self.changed = True
                if not self.dry_run:
                    with contextlib.suppress(FileNotFoundError):
                        child.unlink()
                    self.dir_dirty = True
        return sorted(removed)

    def _read_info(self) -> dict[str, Any] | None:
        """Returns dataset_info.json, or None after an interrupted creation."""
        problems = []
        info = None
        for filename in (layout.DATASET_INFO, layout.FEATURES):
            try:
                content = layout.read_json(self.path / filename)
            except FileNotFoundError:
                problems.append(f"{filename} is missing")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                problems.append(f"{filename} is unreadable ({e})")
            else:
                if filename == layout.DATASET_INFO:
                    info = content
        if info is not None and "name" not in info:
            problems.append(f"{layout.DATASET_INFO} has no dataset name")
        if not problems:
            return info
        shards = sorted(c.name for c in self.path.iterdir() if _ANY_SHARD.match(c.name))
        if shards:
            raise RecoveryError(
                f"cannot recover {self.path}: {'; '.join(problems)}, but {len(shards)} shard "
                f"files exist ({shards[0]}, ...). Restore {layout.DATASET_INFO} and "
                f"{layout.FEATURES} (e.g. from another directory written with the same "
                "config) and run recover again."
            )
        if not any((self.path / f).exists() for f in (layout.DATASET_INFO, layout.FEATURES)):
            inside = sorted(
                c.name for c in self.path.iterdir() if (c / layout.DATASET_INFO).exists()
            )
            hint = f"; its subdirectories {inside} do: recover each of them" if inside else ""
            raise FileNotFoundError(
                f"{self.path} holds no dataset (no {layout.DATASET_INFO}){hint}"
            )
        self.notes.append(
            f"interrupted dataset creation ({'; '.join(problems)}) and no shard files: "
            "removed the partial metadata files; no episode was lost"
        )
        return None

    def _interrupted_creation(self, removed_temp: list[str]) -> RecoveryReport:
        self.changed = True
        if not self.dry_run:
            for filename in (layout.DATASET_INFO, layout.FEATURES, layout.METADATA):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / filename).unlink()
            fsync_directory(self.path)
        return RecoveryReport(
            path=os.fspath(self.path),
            file_format="",
            splits={},
            num_bytes={},
            listed_before={},
            shards=[],
            removed_temp_files=removed_temp,
            notes=self.notes,
            changed=True,
            dry_run=self.dry_run,
        )

    def _split_names(
        self, name: str, file_format: str, listed: dict[str, tuple[list[int], int]]
    ) -> list[str]:
        names = list(listed)
        pattern = re.compile(rf"^{re.escape(name)}-(.+)\.{re.escape(file_format)}-\d{{5,}}$")
        for child in sorted(self.path.iterdir()):
            m = pattern.match(child.name)
            if m and m.group(1) not in names:
                names.append(m.group(1))
        return names

    def _recover_split(
        self, name: str, split: str, file_format: str, listed_lengths: list[int]
    ) -> tuple[list[int], int]:
        files = layout.list_shard_files(self.path, name, split, file_format)
        last_index = max(files) if files else -1
        kept: list[tuple[epath.Path, ShardReport]] = []
        for index, file in files.items():
            listed_n = listed_lengths[index] if index < len(listed_lengths) else None
            if file_format == "tfrecord":
                report = self._recover_tfrecord(
                    split, file, listed_n, full=self.verify_data or index == last_index
                )
            else:
                report = self._recover_array_record(split, file, listed_n)
            self.shards.append(report)
            if report.records:
                kept.append((file, report))
        missing = [i for i in range(len(listed_lengths)) if i not in files]
        if missing:
            self.notes.append(
                f"{split}: shards {missing} listed in {layout.DATASET_INFO} have no file; "
                "their episodes are gone"
            )
        lengths = []
        total = 0
        for new_index, (file, report) in enumerate(kept):
            target = self.path / layout.shard_name(name, split, file_format, new_index)
            if file != target:
                # Kept files are visited in index order and only move down, so the
                # target slot is free: its file was dropped or has moved down already.
                if report.actions == ["ok"]:
                    report.actions = []
                report.actions.append("renamed")
                report.new_name = target.name
                self.changed = True
                if not self.dry_run:
                    file.rename(target)
                    self.dir_dirty = True
            lengths.append(report.records)
            total += report.num_bytes
        return lengths, total

    def _drop_file(
        self, file: epath.Path, report: ShardReport, size: int, torn: bool = False
    ) -> None:
        self.changed = True
        if size == 0 or torn:
            # Nothing, or only the start of a first record cut short by a crash.
            report.actions.append("removed-torn" if size else "removed-empty")
            if not self.dry_run:
                file.unlink()
        else:
            target = quarantine_name(file.name)
            report.actions.append("quarantined")
            report.detail.append(f"kept as {target}")
            if not self.dry_run:
                file.rename(file.parent / target)
        if not self.dry_run:
            self.dir_dirty = True

    def _recover_tfrecord(
        self, split: str, file: epath.Path, listed_n: int | None, full: bool
    ) -> ShardReport:
        scan = scan_tfrecord(file, verify_data=full)
        if not full and listed_n is not None and len(scan.spans) != listed_n:
            scan = scan_tfrecord(file, verify_data=True)
        report = ShardReport(split, file.name, len(scan.spans), scan.num_bytes, listed_n)
        if scan.tail_problem:
            cut = scan.file_size - scan.stop_offset
            report.detail.append(f"{scan.tail_problem} at byte {scan.stop_offset}, {cut} bytes")
        for offset, framed, reason in scan.dropped:
            report.detail.append(f"{reason} in the record at byte {offset} ({framed} bytes)")
        if not scan.spans:
            if scan.file_size:
                report.detail.append("no complete record")
            torn = bool(scan.tail_problem and scan.tail_problem.startswith("truncated"))
            self._drop_file(file, report, scan.file_size, torn=torn and not scan.dropped)
            return report
        if listed_n != report.records:
            report.actions.append("listed")
            self.changed = True
        mid_file_drops = [d for d in scan.dropped if d[0] < scan.kept_end]
        if mid_file_drops:
            report.actions.append("rewritten")
            self.changed = True
            if not self.dry_run:
                self._rewrite_tfrecord(file, scan, report)
        elif scan.kept_end < scan.file_size:
            report.actions.append("truncated")
            self.changed = True
            if not self.dry_run:
                _truncate(file, scan.kept_end)
        if not report.actions:
            report.actions.append("ok")
        return report

    def _rewrite_tfrecord(self, file: epath.Path, scan: _TFRecordScan, report: ShardReport) -> None:
        tmp = file.parent / f".{file.name}.recover-tmp"
        framing = tfrecord.HEADER_SIZE + tfrecord.FOOTER_SIZE
        with file.open("rb") as src, tmp.open("wb") as dst:
            for offset, length in scan.spans:
                src.seek(offset)
                dst.write(src.read(length + framing))
        _fsync_file(tmp)
        keep = file.parent / quarantine_name(file.name)
        if layout.is_local(file):
            os.link(file, keep)
        else:
            file.copy(keep)
        report.detail.append(f"original kept as {keep.name}")
        tmp.replace(file)
        self.dir_dirty = True

    def _recover_array_record(
        self, split: str, file: epath.Path, listed_n: int | None
    ) -> ShardReport:
        size = file.stat().length
        try:
            records, nbytes = _array_record_contents(file) if size else (0, 0)
            problem = None
        except Exception as e:  # noqa: BLE001 - a torn file raises many kinds
            records, nbytes, problem = 0, 0, f"unreadable: {e}"
        report = ShardReport(split, file.name, records, nbytes, listed_n)
        if problem:
            report.detail.append(problem)
        if not records:
            self._drop_file(file, report, size)
            return report
        if listed_n != records:
            report.actions.append("listed")
            self.changed = True
        else:
            report.actions.append("ok")
        return report


def _truncate(path: epath.Path, size: int) -> None:
    if layout.is_local(path):
        os.truncate(path, size)
        _fsync_file(path)
    else:
        with path.open("rb") as f:
            data = f.read(size)
        path.write_bytes(data)
