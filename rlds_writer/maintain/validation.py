"""`validate`: is a dataset sound? Its shard files against the listing, every episode
decoded, and the RLDS invariants of each.

Local datasets are decoded by TFDS itself (`tfds.builder_from_directory`), as
a user's pipeline would decode them, after the TF-free reader has decoded
every record (a crafted record gives an error here, not a crash inside
TensorFlow). A dataset in object storage is decoded by the TF-free reader
alone, read by ranges: TFDS reaches a bucket only through TensorFlow's file
systems.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from rlds_writer.errors import CorruptRecordError, DecodeError, WireError, counted
from rlds_writer.maintain.shard_walk import scan_shard
from rlds_writer.maintain.tfds_episodes import decoded_episodes
from rlds_writer.read.reader import open_dataset
from rlds_writer.store.dataset import Dataset, layout, open_handle


class _Violations:
    def __init__(self, limit: int):
        self.items: list[dict[str, Any]] = []
        self.limit = limit

    def add(self, message: str, **where: Any) -> None:
        if len(self.items) < self.limit:
            self.items.append({**where, "message": message})

    @property
    def full(self) -> bool:
        return len(self.items) >= self.limit


def _locate(lengths: Sequence[int], episode: int) -> tuple[int | None, int | None]:
    """Returns (shard index, record index) of a split's `episode`."""
    start = 0
    for shard, n in enumerate(lengths):
        if episode < start + n:
            return shard, episode - start
        start += n
    return None, None


def _first_true(flags: Any, start: int = 0, stop: int | None = None) -> int | None:
    import numpy as np

    idx = np.flatnonzero(np.asarray(flags)[start:stop])
    return int(idx[0]) + start if idx.size else None


def _check_episode(steps: dict[str, Any], report: Any) -> int:
    """Checks the RLDS flags of one decoded episode; returns its step count."""
    import numpy as np

    if not steps:
        report("episode has no steps", step=None)
        return 0
    missing = [k for k in ("is_first", "is_last") if k not in steps]
    if missing:
        report(f"steps have no {' or '.join(missing)} field: not an RLDS episode", step=None)
        return 0
    is_first = np.asarray(steps["is_first"]).astype(bool)
    is_last = np.asarray(steps["is_last"]).astype(bool)
    n = len(is_first)
    lengths = {
        k: len(v) for k, v in steps.items() if hasattr(v, "__len__") and not isinstance(v, dict)
    }
    if len(set(lengths.values())) > 1:
        report(f"step fields have different lengths: {lengths}", step=None)
    if n == 0:
        report("episode has no steps", step=None)
        return 0
    if not is_first[0]:
        report("is_first is False on step 0", step=0)
    bad = _first_true(is_first, 1)
    if bad is not None:
        report(f"is_first is True on step {bad}, not step 0", step=bad)
    bad = _first_true(is_last, 0, n - 1)
    if bad is not None:
        report(f"is_last is True on step {bad}, before the final step {n - 1}", step=bad)
    if not is_last[n - 1]:
        report(f"is_last is False on the final step {n - 1}", step=n - 1)
    if "is_terminal" in steps:
        bad = _first_true(np.asarray(steps["is_terminal"]).astype(bool), 0, n - 1)
        if bad is not None:
            report(f"is_terminal is True on step {bad}, which is not the final step", step=bad)
    return n


def _check_shards(dataset: Dataset, violations: _Violations, writing: bool) -> list[str]:
    """Compares every shard file with dataset_info.json; returns notes."""
    notes = []
    names = dataset.listdir()
    for split, listing in dataset.splits.items():
        lengths = listing.shard_lengths
        files = dataset.shard_files(split, names)
        for index, n in enumerate(lengths):
            name = files.get(index)
            where = {"split": split, "shard": listing.shard_name(index)}
            if name is None:
                violations.add("listed shard file is missing", **where)
                continue
            # The same scan and the same words as recover, info and the reader.
            scan = scan_shard(dataset, name, verify_data=True)
            if scan.unreadable is not None:
                problem = f"unreadable: {scan.unreadable}"
            else:
                problem = str(scan.errors[0]) if scan.errors else None
            if problem or scan.found != n:
                # A damaged record is named as every tool names it (it carries the advice).
                message = problem or (
                    f"{layout.DATASET_INFO} lists {counted(n, 'episode')}, the file holds "
                    f"{scan.found}; run `rlds-writer recover`"
                )
                if writing:
                    notes.append(f"{where['shard']}: {message} (a writer is running)")
                else:
                    violations.add(message, **where)
        for index, name in files.items():
            if index >= len(lengths):
                message = f"{name} is not listed in {layout.DATASET_INFO}"
                if writing:
                    notes.append(message + " (a writer is running)")
                else:
                    violations.add(message + "; run `rlds-writer recover`", split=split)
    return notes


def _check_records(dataset: Dataset, splits: Sequence[str] | None, violations: Any) -> None:
    """Decodes every listed record with the TF-free reader (bounded memory)."""
    reader = open_dataset(dataset)
    already = {v.get("split") for v in violations.items}  # damaged files: reported
    with reader:
        for split in splits or list(reader.splits):
            if split not in reader.splits or split in already:
                continue
            try:
                for where, record in reader.episodes(split).records():
                    reader.decode(record, where)
            except (CorruptRecordError, DecodeError, WireError) as e:
                violations.add(str(e), split=split)


def _reader_episodes(dataset: Dataset, split: str) -> Iterator[dict[str, Any]]:
    """The split's episodes decoded by the TF-free reader (object storage)."""
    with open_dataset(dataset) as reader:
        yield from reader.episodes(split)


def validate(
    path: Dataset | str | os.PathLike,
    *,
    splits: Sequence[str] | None = None,
    max_violations: int = 20,
) -> dict[str, Any]:
    """Decodes every episode through TFDS and checks the RLDS invariants.

    Checks that every shard file holds exactly the complete records
    `dataset_info.json` lists, that every episode decodes with
    `tfds.builder_from_directory` (with the TF-free reader for a dataset in
    object storage), and in every episode: at least one step;
    `is_first` True on step 0 and only there; `is_last` True on the final step
    and only there; `is_terminal` True on no step but the final one; all step
    fields of equal length; and that each split has as many episodes as
    `dataset_info.json` lists.

    Args:
      path: the dataset directory (local or object storage), or a `Dataset`.
      splits: the splits to check (default: all).
      max_violations: stop collecting after this many.

    Returns:
      A dict: `ok`, `path`, `splits` (per split: `episodes`, `steps`),
      `violations` (each with `split`, `episode`, `step`, `shard`, `record`,
      `message` where known, in the order found), `first_violation` (or
      None), `notes`.
    """
    # Names, counts and feature shapes are checked by our own parsers first
    # (opening the handle): a crafted file must give an error here, not crash
    # TensorFlow natively.
    dataset = open_handle(path)
    violations = _Violations(max_violations)
    writing = dataset.is_being_written()
    notes = _check_shards(dataset, violations, writing)
    builder = None
    if dataset.is_local:
        import tensorflow_datasets as tfds

        if not writing:
            _check_records(dataset, splits, violations)
        builder = tfds.builder_from_directory(dataset.path)
    else:
        notes.append(
            "decoded with rlds_writer's reader: TFDS reads object storage only through "
            "TensorFlow's file systems"
        )
    # TFDS would stop at the same damage with its own (different) offset: splits
    # whose files failed the shared checks are not decoded again.
    damaged = {v.get("split") for v in violations.items}
    results: dict[str, Any] = {}
    for split in splits or list(dataset.splits):
        listing = dataset.splits.get(split)
        if listing is None:
            violations.add(f"split {split!r} is not in {layout.DATASET_INFO}", split=split)
            continue
        lengths = listing.shard_lengths
        episodes = 0
        total_steps = 0
        if split in damaged:
            results[split] = {"episodes": None, "steps": None}
            continue
        if sum(lengths) > 0:
            if builder is not None:
                iterator = decoded_episodes(builder, split)
            else:
                iterator = _reader_episodes(dataset, split)
            while not violations.full:
                shard, record = _locate(lengths, episodes)
                where = {
                    "split": split,
                    "episode": episodes,
                    "shard": None if shard is None else listing.shard_name(shard),
                    "record": record,
                }
                try:
                    episode = next(iterator)
                except StopIteration:
                    break
                except Exception as e:  # noqa: BLE001 - TF raises many kinds
                    violations.add(f"cannot decode: {type(e).__name__}: {e}", step=None, **where)
                    break

                def report(message: str, step: int | None, _where: dict = where) -> None:
                    violations.add(message, step=step, **_where)

                total_steps += _check_episode(episode["steps"], report)
                episodes += 1
        if episodes != sum(lengths) and not violations.full:
            violations.add(
                f"decoded {counted(episodes, 'episode')}, {layout.DATASET_INFO} lists "
                f"{sum(lengths)}",
                split=split,
            )
        results[split] = {"episodes": episodes, "steps": total_steps}
    return {
        "ok": not violations.items,
        "path": dataset.path,
        "splits": results,
        "violations": violations.items,
        "first_violation": violations.items[0] if violations.items else None,
        "notes": notes,
    }


def describe_violation(v: dict[str, Any]) -> str:
    """Formats one violation: where (split, episode, step, shard, record) and what."""
    where = []
    for key in ("split", "episode", "step", "shard", "record"):
        if v.get(key) is not None:
            where.append(f"{key} {v[key]}")
    return f"{', '.join(where)}: {v['message']}" if where else v["message"]
