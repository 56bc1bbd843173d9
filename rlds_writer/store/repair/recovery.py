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
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import IncompatibleDatasetError, RecoveryError, counted
from rlds_writer.store.dataset import json_values, layout
from rlds_writer.store.dataset.locate import not_a_dataset
from rlds_writer.store.formats import shard_format, shards
from rlds_writer.store.storage import file_io, storage, unsaved_shards

if TYPE_CHECKING:
    from etils import epath

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


def run_recovery(
    path: epath.Path, dry_run: bool, verify_data: bool, kept: str | None = None
) -> RecoveryReport:
    """Recovers `path`; the caller holds the directory lock (see `maintain.recover`).

    A remote dataset first gets the shards a failed upload kept on this machine
    (`store.unsaved_shards`; from `kept` if given, else from their default place).

    Raises:
      DiskFullError: the disk filled up; every change made so far keeps every
        record (a rewritten shard's original is kept aside first), so running
        it again once there is space finishes the job.
    """
    try:
        return _Recovery(path, dry_run, verify_data, kept).run()
    except OSError as e:
        if file_io.is_disk_full(e):
            raise file_io.disk_full_error(path, e, "recovering it") from e
        raise


class _Recovery:
    """One run of `recover` on one directory."""

    def __init__(self, path: epath.Path, dry_run: bool, verify_data: bool, kept: str | None):
        self.path = path
        self.kept = kept
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
        if not file_io.is_local(self.path):
            self._upload_kept()
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
        file_format = layout.file_format_of(info)
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
                    file_io.fsync_directory(self.path)
                file_io.atomic_write_text(
                    self.path / layout.DATASET_INFO,
                    json_values.dumps_info(layout.with_splits(info, new_splits, templates)),
                    fsync=True,
                )
        elif self.dir_dirty and not self.dry_run:
            file_io.fsync_directory(self.path)
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

    def _upload_kept(self) -> None:
        """Uploads the shards a failed upload kept locally; the scan below lists them."""
        dataset = os.fspath(self.path)
        directory = self.kept or unsaved_shards.kept_directory(dataset)
        kept = unsaved_shards.kept_shards(directory, layout.ANY_SHARD.match)
        if not kept:
            return
        self.changed = True
        if self.dry_run:
            found = counted(len(kept), "shard")
            self.notes.append(f"{found} kept in {directory} after a failed upload would go up")
            return
        store = storage.storage_for(dataset)
        uploaded = unsaved_shards.upload_kept(store, dataset, directory, layout.ANY_SHARD.match)
        self.notes.append(
            f"uploaded {counted(len(uploaded), 'shard')} kept in {directory} after a failed upload"
        )

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
                content = file_io.read_json(self.path / filename)
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
            file_io.fsync_directory(self.path)
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
        file_format = shards.adapter(template.file_format)
        files = template.files_on_disk(self.path)
        for file in files.values():
            file_io.refuse_symlink(file, "shard file")
        last_index = max(files) if files else -1
        kept: list[tuple[epath.Path, ShardReport]] = []
        for index, file in files.items():
            listed_n = listed_lengths[index] if index < len(listed_lengths) else None
            report = self._recover_shard(
                file_format, split, file, listed_n, last=index == last_index
            )
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
            target = shard_format.quarantine_name(file.name)
            report.actions.append("quarantined")
            report.detail.append(f"kept as {target}")
            if not self.dry_run:
                file.rename(file.parent / target)
        if not self.dry_run:
            self.dir_dirty = True

    def _recover_shard(
        self,
        file_format: shards.FileFormat,
        split: str,
        file: Any,
        listed_n: int | None,
        last: bool,
    ) -> ShardReport:
        check = file_format.check(file, listed=listed_n, last=last, full=self.verify_data)
        report = ShardReport(split, file.name, check.records, check.num_bytes, listed_n)
        report.detail.extend(check.detail)
        if not check.records:
            self._drop_file(file, report, check.file_size, torn=check.removable)
            return report
        if listed_n != report.records:
            report.actions.append("listed")
            self.changed = True
        if check.rewrite:
            report.actions.append("rewritten")
            self.changed = True
            if not self.dry_run:
                kept = file_format.rewrite(file, check)
                report.detail.append(f"original kept as {kept}")
                self.dir_dirty = True
        elif check.cut_to is not None:
            report.actions.append("truncated")
            self.changed = True
            if not self.dry_run:
                file_format.cut(file, check.cut_to)
        if not report.actions:
            report.actions.append("ok")
        return report
