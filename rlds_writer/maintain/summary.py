"""`info`: what a dataset holds (splits, episodes, steps, bytes, features, metadata).

It reads the listing through the `Dataset` handle and walks the shard files
itself (no TensorFlow, no decoding), so it is quick, works while a writer is
running, and reads a dataset in object storage by ranges.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rlds_writer.errors import counted
from rlds_writer.maintain.feature_tree import features_tree, render_features
from rlds_writer.maintain.shard_walk import scan_shard
from rlds_writer.store.dataset import Dataset, layout, locking, open_handle
from rlds_writer.store.formats import shard_format


def info(path: Dataset | str | os.PathLike, *, count_steps: bool = True) -> dict[str, Any]:
    """Summarizes a dataset directory.

    Args:
      path: the dataset directory (local or object storage), or a `Dataset`.
      count_steps: read every record to count steps (no decoding; reads the
        whole dataset once). With False, `steps` is None.

    Returns:
      A dict with `path`, `name`, `version`, `file_format`, `splits` (per split:
      `episodes`, `steps`, `num_bytes`, `file_bytes`, `shards`,
      `shard_lengths`), `total`, `features` (a tree), `metadata`
      (metadata.json or None), `writer` (the lock holder or None), and
      `problems` (what `recover` would fix, e.g. unlisted episodes).

    Raises:
      NotADatasetError: `path` is not a dataset.
    """
    dataset = open_handle(path)
    writer = dataset.writer()
    names = dataset.listdir()
    problems: list[str] = []
    splits: dict[str, Any] = {}
    for split in [*dataset.splits, *dataset.unlisted_splits(names)]:
        listing = dataset.splits.get(split)
        lengths = list(listing.shard_lengths) if listing else []
        template = dataset.split_template(split)
        files = dataset.shard_files(split, names)
        file_bytes = 0
        for index, name in files.items():
            file_bytes += dataset.size(name)
            if index >= len(lengths):
                problems.append(f"{name} is not listed in {layout.DATASET_INFO}")
        for index in range(len(lengths)):
            if index not in files:
                problems.append(f"{template.filename(index, len(lengths))} is missing")
        steps: int | None = 0 if count_steps else None
        for index, name in files.items():
            listed_n = lengths[index] if index < len(lengths) else None
            scan = scan_shard(
                dataset,
                name,
                # Data CRCs too when every record is read anyway (counting steps).
                verify_data=count_steps,
                count_steps_of=(listed_n or 0) if count_steps else None,
            )
            if scan.unreadable is not None:
                problems.append(f"{name} is unreadable: {scan.unreadable}")
                continue
            problems.extend(str(e) for e in scan.errors)
            if steps is not None:
                steps = None if scan.steps is None else steps + scan.steps
            if listed_n is not None and listed_n != scan.found:
                problems.append(
                    f"{name} holds {scan.found} complete records, {layout.DATASET_INFO} lists "
                    f"{listed_n}"
                )
        splits[split] = {
            "episodes": sum(lengths),
            "steps": steps,
            "num_bytes": listing.num_bytes if listing else 0,
            "file_bytes": file_bytes,
            "shards": len(lengths),
            "shard_lengths": lengths,
        }
    quarantined = sorted(n for n in names if n.startswith(shard_format.QUARANTINE_PREFIX))
    if problems:
        problems.append(
            "a writer is running" if writer else "run `rlds-writer recover` to list every episode"
        )
    step_counts = [s["steps"] for s in splits.values()]
    return {
        "path": dataset.path,
        "name": dataset.name,
        "version": dataset.info.get("version"),
        "file_format": dataset.file_format,
        "splits": splits,
        "total": {
            "episodes": sum(s["episodes"] for s in splits.values()),
            "steps": None if any(s is None for s in step_counts) else sum(step_counts),
            "num_bytes": sum(s["num_bytes"] for s in splits.values()),
            "shards": sum(s["shards"] for s in splits.values()),
        },
        "features": features_tree(dataset.features_config),
        "metadata": dataset.metadata,
        "writer": writer,
        "quarantined_files": quarantined,
        "problems": problems,
    }


def render_info(summary: dict[str, Any]) -> str:
    """Formats an `info` dict for people."""
    lines = [
        f"{summary['path']}",
        f"  dataset {summary['name']} version {summary['version']}, "
        f"{summary['file_format']} shards",
    ]
    if summary["writer"]:
        lines.append(f"  being written: {locking.describe_holder(summary['writer'])}")
    lines.append("splits:")
    for split, s in summary["splits"].items():
        steps = "? steps" if s["steps"] is None else counted(s["steps"], "step")
        lines.append(
            f"  {split}: {counted(s['episodes'], 'episode')}, {steps}, "
            f"{counted(s['num_bytes'], 'byte')} in {counted(s['shards'], 'shard')} "
            f"{s['shard_lengths'] if s['shards'] <= 12 else ''}".rstrip()
        )
    lines.append("features:")
    lines.extend("  " + line for line in render_features(summary["features"]))
    if summary["metadata"] is not None:
        lines.append("metadata:")
        text = json.dumps(summary["metadata"], indent=2, sort_keys=True)
        lines.extend("  " + line for line in text.splitlines())
    if summary["quarantined_files"]:
        lines.append(f"set aside by recover: {', '.join(summary['quarantined_files'])}")
    if summary["problems"]:
        lines.append("problems:")
        lines.extend(f"  {p}" for p in summary["problems"])
    return "\n".join(lines)
