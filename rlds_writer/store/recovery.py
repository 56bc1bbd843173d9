"""Crash recovery: make a dataset directory list exactly what its shards hold.

After a crash the open shard may end in a torn record and `dataset_info.json`
may not list the episodes written since its last commit. `recover` scans every
split's shard files and:

- keeps every complete record: TFRecord records pass their length and data
  CRC checks; array_record shards are kept if their reader opens them;
- cuts a torn tail (truncating the file in place) only at the end of the
  last shard of a split, where a crash leaves it; damage anywhere else (bit
  rot, a flipped length bit) is dropped by rewriting the shard without it,
  after resynchronising on the next record whose length and data CRCs both
  check, and the original file is kept as `.corrupt-<shard>-<time>`: no byte
  is deleted without a copy, except a crash's torn tail;
- deletes a shard holding nothing or only a torn first record, and sets aside
  (renames to `.corrupt-<shard>-<time>`) one that has other bytes but no
  readable record;
- renumbers the remaining shard files into one contiguous sequence, named by
  the split's own `filepathTemplate` (ours or TFDS's `-00000-of-00004`);
- commits `dataset_info.json` atomically, with every shard's true length.

Every step can be interrupted and redone: truncation and deletion are
idempotent, a rewrite goes through a temporary file and an atomic rename, a
renumbering only moves files down into free slots, and `dataset_info.json` is
replaced last. Running `recover` on a healthy dataset changes nothing.
Changes are fsynced (files, then the directory). Symbolic links among the
dataset's files are refused, never followed: nothing outside the directory
is read, truncated or renamed.

This engine lives in `store` because appending to a dataset starts with it;
`rlds_writer.maintain.recover` is the user-facing command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any

from etils import epath

from rlds_writer.errors import IncompatibleDatasetError, RecoveryError, counted
from rlds_writer.store import layout, shards, storage, tfrecord
from rlds_writer.store.locate import not_a_dataset

_log = logging.getLogger(__name__)


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
                f"{name}: {counted(sum(lengths), 'episode')} in {counted(len(lengths), 'shard')} "
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


def run_recovery(path: epath.Path, dry_run: bool, verify_data: bool) -> RecoveryReport:
    """Recovers `path`; the caller holds the directory lock (see `maintain.recover`).

    Raises:
      DiskFullError: the disk filled up; every change made so far keeps every
        record (a rewritten shard's original is kept aside first), so running
        it again once there is space finishes the job.
    """
    try:
        return _Recovery(path, dry_run, verify_data).run()
    except OSError as e:
        if layout.is_disk_full(e):
            raise layout.disk_full_error(path, e, "recovering it") from e
        raise


def _array_record_contents(path: epath.Path) -> tuple[int, int]:
    """Returns (records, bytes) of an array_record file; raises if it is unreadable."""
    records = nbytes = 0
    for record in shards.array_record_records(path):
        records += 1
        nbytes += len(record)
    return records, nbytes


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
        if (self.path / layout.MERGE_JOURNAL).exists():
            raise RecoveryError(
                f"a merge into {self.path} was interrupted ({layout.MERGE_JOURNAL} is present); "
                "run the same merge again to finish it instead of recover"
            )
        removed_temp = self._remove_temp_files()
        info = self._read_info()
        if info is None:
            return self._interrupted_creation(removed_temp)
        where = os.fspath(self.path / layout.DATASET_INFO)
        try:
            templates = layout.split_templates(info, where)
            listed = layout.read_splits(info, where)
        except IncompatibleDatasetError as e:
            raise RecoveryError(str(e)) from e
        name = info["name"]
        file_format = info.get("fileFormat") or "tfrecord"
        new_splits: dict[str, tuple[list[int], int]] = {}
        for split in self._split_names(name, file_format, listed):
            template = templates.get(split) or layout.ShardTemplate(
                layout.FILEPATH_TEMPLATE, name, split, file_format
            )
            listed_lengths = listed.get(split, ([], 0))[0]
            new_splits[split] = self._recover_split(template, listed_lengths)
        for child in self.path.iterdir():
            m = layout.ANY_SHARD.match(child.name)
            if m and (m["name"] != name or m["format"] != file_format):
                self.notes.append(
                    f"ignored {child.name}: not a shard of {name!r} in {file_format} format"
                )
        if new_splits != listed:
            self.changed = True
            if not self.dry_run:
                if self.dir_dirty:
                    layout.fsync_directory(self.path)
                layout.atomic_write_text(
                    self.path / layout.DATASET_INFO,
                    layout.dumps_info(layout.with_splits(info, new_splits, templates)),
                    fsync=True,
                )
        elif self.dir_dirty and not self.dry_run:
            layout.fsync_directory(self.path)
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
            if layout.TEMP_FILE.match(child.name):
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
        shards = sorted(c.name for c in self.path.iterdir() if layout.ANY_SHARD.match(c.name))
        if shards:
            raise RecoveryError(
                f"cannot recover {self.path}: {'; '.join(problems)}, but {len(shards)} shard "
                f"files exist ({shards[0]}, ...). Restore {layout.DATASET_INFO} and "
                f"{layout.FEATURES} (e.g. from another directory written with the same "
                "config) and run recover again."
            )
        if not any((self.path / f).exists() for f in (layout.DATASET_INFO, layout.FEATURES)):
            raise not_a_dataset(self.path)
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
            layout.fsync_directory(self.path)
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
        for child in sorted(self.path.iterdir()):
            m = layout.ANY_SHARD.match(child.name)
            if m and m["name"] == name and m["format"] == file_format:
                with contextlib.suppress(IncompatibleDatasetError):
                    if layout.check_name(m["split"], "split") not in names:
                        names.append(m["split"])
        return names

    def _recover_split(
        self, template: layout.ShardTemplate, listed_lengths: list[int]
    ) -> tuple[list[int], int]:
        split = template.split
        files = template.files_on_disk(self.path)
        for file in files.values():
            layout.refuse_symlink(file, "shard file")
        last_index = max(files) if files else -1
        kept: list[tuple[epath.Path, ShardReport]] = []
        for index, file in files.items():
            listed_n = listed_lengths[index] if index < len(listed_lengths) else None
            if template.file_format == "tfrecord":
                report = self._recover_tfrecord(
                    split, file, listed_n, last=index == last_index, full=self.verify_data
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
        targets = [self.path / template.filename(i, len(kept)) for i in range(len(kept))]
        # Kept files only move down (or, when names hold the shard count, to names
        # of the new count), so a target is free once the files before it moved.
        for (file, report), target in zip(kept, targets):
            if file != target:
                if report.actions == ["ok"]:
                    report.actions = []
                report.actions.append("renamed")
                report.new_name = target.name
                self.changed = True
                if not self.dry_run:
                    if target.exists():
                        raise RecoveryError(
                            f"cannot rename {file.name} to {target.name}: that name is taken; "
                            "move the stray file out of the dataset directory and rerun"
                        )
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
            target = layout.quarantine_name(file.name)
            report.actions.append("quarantined")
            report.detail.append(f"kept as {target}")
            if not self.dry_run:
                file.rename(file.parent / target)
        if not self.dry_run:
            self.dir_dirty = True

    def _recover_tfrecord(
        self, split: str, file: epath.Path, listed_n: int | None, last: bool, full: bool
    ) -> ShardReport:
        # Headers only where the listing agrees (a quick check); the last shard,
        # where a crash leaves its tear, and any disagreement get a full check.
        scan = tfrecord.scan(file, verify_data=full or last, resync=True)
        if not (full or last) and (listed_n is None or len(scan.spans) != listed_n):
            scan = tfrecord.scan(file, verify_data=True, resync=True)
        report = ShardReport(split, file.name, len(scan.spans), scan.num_bytes, listed_n)
        if scan.tail_problem:
            cut = scan.file_size - scan.tail_offset
            report.detail.append(f"{scan.tail_problem} at byte {scan.tail_offset}, {cut} bytes")
        for offset, size, reason in scan.dropped:
            report.detail.append(f"{reason} at byte {offset} ({size} bytes dropped)")
        if not scan.spans:
            if scan.file_size:
                report.detail.append("no complete record")
            # Only the start of a first record cut short by a crash may be deleted.
            torn = last and not scan.dropped and (scan.tail_problem or "").startswith("truncated")
            self._drop_file(file, report, scan.file_size, torn=torn)
            return report
        if listed_n != report.records:
            report.actions.append("listed")
            self.changed = True
        # A crash tears only the end of the shard being written (the last one);
        # anything else is damage, kept aside before the shard is rewritten.
        crash_tail = last and not scan.dropped and scan.kept_end == scan.tail_offset
        if scan.dropped or (scan.kept_end < scan.file_size and not crash_tail):
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

    def _rewrite_tfrecord(self, file: epath.Path, scan: tfrecord.Scan, report: ShardReport) -> None:
        if not layout.is_local(file):
            self._rewrite_remote_tfrecord(file, scan, report)
            return
        tmp = file.parent / f".{file.name}.recover-tmp"
        try:
            # A fixed name: a leftover (or planted link) there is removed, never written through.
            if layout.is_local(tmp):
                dst_file = os.fdopen(layout.create_exclusive(tmp, replace_stale=True), "wb")
            else:
                dst_file = tmp.open("wb")
            with file.open("rb") as src, dst_file as dst:
                for offset, length in scan.spans:
                    src.seek(offset)
                    dst.write(src.read(length + tfrecord.FRAMING))
            layout.fsync_file(tmp)
        except BaseException:
            # The original is untouched; do not leave a partial copy filling the disk.
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        keep = file.parent / layout.quarantine_name(file.name)
        if layout.is_local(file):
            os.link(file, keep)
        else:
            file.copy(keep)
        report.detail.append(f"original kept as {keep.name}")
        tmp.replace(file)
        self.dir_dirty = True

    def _rewrite_remote_tfrecord(self, file: Any, scan: tfrecord.Scan, report: ShardReport) -> None:
        # The good records, by range reads, into a local file; the original object
        # is copied aside, then replaced whole by one upload.
        import tempfile

        store = storage.storage_for(file)
        with tempfile.TemporaryDirectory(prefix="rlds_writer-recover-") as tmp:
            local = os.path.join(tmp, file.name)
            source = store.open_random(os.fspath(file))
            try:
                with open(local, "wb") as dst:
                    for offset, length in scan.spans:
                        dst.write(source.read_at(offset, length + tfrecord.FRAMING))
            finally:
                source.close()
            keep = file.parent / layout.quarantine_name(file.name)
            store.copy(os.fspath(file), os.fspath(keep))
            report.detail.append(f"original kept as {keep.name}")
            store.upload(local, os.fspath(file))

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
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    else:
        # An object cannot be cut: its first `size` bytes replace it (one shard).
        store = storage.storage_for(path)
        store.replace_bytes(os.fspath(path), store.read_bytes(os.fspath(path), limit=size))
