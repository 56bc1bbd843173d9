"""Looking into a dataset directory: `info` (what it holds) and `validate` (is it sound).

`info` reads the JSON files and walks the shard files itself (no TensorFlow),
so it is quick and works while a writer is running. `validate` decodes every
episode through TFDS, as a user's pipeline would, and checks the RLDS
invariants. Both return plain dicts (JSON-safe) for scripts and `--json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from etils import epath

from rlds_writer.errors import CorruptRecordError, DecodeError, WireError, counted
from rlds_writer.read.reader import open_dataset
from rlds_writer.store import features as features_lib
from rlds_writer.store import layout, locking, shards, tfrecord, wire
from rlds_writer.store.locate import require_dataset

# ------------------------------------------------------------ record access


def iter_shard_records(path: epath.PathLike, file_format: str) -> Iterator[bytes]:
    """Yields the complete records of one shard file, in file order, skipping damage."""
    return shards.adapter(file_format).records(path)


def record_step_count(record: bytes, key: str = "steps/is_first") -> int | None:
    """Returns how many values feature `key` of a serialized tf.train.Example holds.

    For an RLDS episode `steps/is_first` holds one value per step. None if the
    key is absent.
    """
    located = wire.parse_example(record).get(key)
    return None if located is None else wire.count_values(record, located)


# -------------------------------------------------------------------- info


def _shape(tensor: dict[str, Any]) -> list[Any]:
    dims = tensor.get("shape", {}).get("dimensions", [])
    return [None if int(d) < 0 else int(d) for d in dims]


def _describe_feature(node: dict[str, Any]) -> dict[str, Any]:
    """Turns one node of features.json into a small tree of plain dicts."""
    cls = node.get("pythonClassName", "").rsplit(".", 1)[-1]
    if "featuresDict" in node:
        return {
            "type": "FeaturesDict",
            "features": {
                k: _describe_feature(v) for k, v in node["featuresDict"]["features"].items()
            },
        }
    if "sequence" in node:
        seq = node["sequence"]
        out = {"type": cls or "Sequence", "feature": _describe_feature(seq["feature"])}
        if seq.get("length") not in (None, "-1", -1):
            out["length"] = int(seq["length"])
        return out
    if "tensor" in node:
        t = node["tensor"]
        out = {"type": cls or "Tensor", "dtype": t.get("dtype"), "shape": _shape(t)}
        if t.get("encoding", "none") != "none":
            out["encoding"] = t["encoding"]
        return out
    if "image" in node:
        img = node["image"]
        return {
            "type": "Image",
            "dtype": img.get("dtype"),
            "shape": _shape(img),
            "encoding": img.get("encodingFormat", "png"),
        }
    if "text" in node:
        return {"type": "Text"}
    if "classLabel" in node:
        return {"type": "ClassLabel", "num_classes": int(node["classLabel"].get("numClasses", 0))}
    return {"type": cls or "unknown"}


def features_tree(features_json: dict[str, Any]) -> dict[str, Any]:
    """Returns features.json as a nested dict of `{"type", "dtype", "shape", ...}` nodes."""
    return _describe_feature(features_json)


def render_features(tree: dict[str, Any], indent: str = "") -> list[str]:
    """Renders a `features_tree` as indented lines, one per feature."""
    lines = []
    children = tree.get("features")
    if children is None and "feature" in tree:
        return render_features(tree["feature"], indent)
    for name, node in (children or {}).items():
        kind = node["type"]
        if kind in ("FeaturesDict",) or "feature" in node:
            suffix = f" ({kind})" if kind != "FeaturesDict" else ""
            lines.append(f"{indent}{name}{suffix}")
            lines.extend(render_features(node, indent + "  "))
            continue
        text = f"{indent}{name}: {kind}"
        if "dtype" in node:
            shape = ", ".join("None" if d is None else str(d) for d in node["shape"])
            text += f" {node['dtype']}[{shape}]"
        if "encoding" in node:
            text += f" encoding={node['encoding']}"
        if "num_classes" in node:
            text += f" classes={node['num_classes']}"
        lines.append(text)
    return lines


def _add_steps(steps: int | None, record: bytes) -> int | None:
    if steps is None:
        return None
    n = record_step_count(record)
    return None if n is None else steps + n


def _count_shard(
    file: epath.Path,
    file_format: str,
    listed_n: int | None,
    count_steps: bool,
    steps: int | None,
    problems: list[str],
) -> int | None:
    """Walks one shard, streaming: notes what `recover` would fix, and adds the
    steps of its listed episodes to `steps` (None when not counting)."""
    take = listed_n or 0
    found = 0
    try:
        if file_format == "tfrecord":
            # Data CRCs too when every record is read anyway (counting steps).
            scan = tfrecord.scan(file, verify_data=count_steps, resync=True)
            problems.extend(str(e) for e in scan.errors(file))
            found = len(scan.spans)
            if count_steps:
                for record in _read_spans(file, scan.spans[:take]):
                    steps = _add_steps(steps, record)
        else:
            for index, record in enumerate(iter_shard_records(file, file_format)):
                found += 1
                if index < take:
                    steps = _add_steps(steps, record)
    except Exception as e:  # noqa: BLE001 - an open array_record shard, a bad record
        problems.append(f"{file.name} is unreadable: {e}")
        return steps
    if listed_n is not None and listed_n != found:
        problems.append(
            f"{file.name} holds {found} complete records, {layout.DATASET_INFO} lists {listed_n}"
        )
    return steps


def _read_spans(file: epath.Path, spans: list[tuple[int, int]]) -> Iterator[bytes]:
    with file.open("rb") as f:
        for offset, length in spans:
            f.seek(offset + tfrecord.HEADER_SIZE)
            yield f.read(length)


def info(path: epath.PathLike, *, count_steps: bool = True) -> dict[str, Any]:
    """Summarizes a dataset directory.

    Args:
      path: the dataset directory.
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
    require_dataset(path)
    path = epath.Path(path)
    dataset_info = layout.read_json(path / layout.DATASET_INFO)
    where = os.fspath(path / layout.DATASET_INFO)
    templates = layout.split_templates(dataset_info, where)
    name = dataset_info["name"]
    file_format = dataset_info.get("fileFormat", "tfrecord")
    features = layout.read_json(path / layout.FEATURES)
    metadata = None
    if (path / layout.METADATA).exists():
        metadata = layout.read_json(path / layout.METADATA)
    writer = locking.read_holder(path) if locking.is_locked(path) else None
    problems: list[str] = []
    splits: dict[str, Any] = {}
    listed = layout.read_splits(dataset_info, where)
    split_names = list(listed)
    for child in path.iterdir():
        m = layout.ANY_SHARD.match(child.name)
        if m and m["name"] == name and m["format"] == file_format:
            if m["split"] not in split_names:
                split_names.append(m["split"])
    for split in split_names:
        lengths, nbytes = listed.get(split, ([], 0))
        template = templates.get(split) or layout.ShardTemplate(
            layout.FILEPATH_TEMPLATE, name, split, file_format
        )
        files = template.files_on_disk(path)
        steps: int | None = 0 if count_steps else None
        file_bytes = 0
        for index, file in files.items():
            file_bytes += file.stat().length
            if index >= len(lengths):
                problems.append(f"{file.name} is not listed in {layout.DATASET_INFO}")
        for index in range(len(lengths)):
            if index not in files:
                problems.append(f"{template.filename(index, len(lengths))} is missing")
        for index, file in files.items():
            listed_n = lengths[index] if index < len(lengths) else None
            steps = _count_shard(file, file_format, listed_n, count_steps, steps, problems)
        splits[split] = {
            "episodes": sum(lengths),
            "steps": steps,
            "num_bytes": nbytes,
            "file_bytes": file_bytes,
            "shards": len(lengths),
            "shard_lengths": lengths,
        }
    quarantined = sorted(
        c.name for c in path.iterdir() if c.name.startswith(layout.QUARANTINE_PREFIX)
    )
    if problems:
        problems.append(
            "a writer is running" if writer else "run `rlds-writer recover` to list every episode"
        )
    step_counts = [s["steps"] for s in splits.values()]
    return {
        "path": os.fspath(path),
        "name": name,
        "version": dataset_info.get("version"),
        "file_format": file_format,
        "splits": splits,
        "total": {
            "episodes": sum(s["episodes"] for s in splits.values()),
            "steps": None if any(s is None for s in step_counts) else sum(step_counts),
            "num_bytes": sum(s["num_bytes"] for s in splits.values()),
            "shards": sum(s["shards"] for s in splits.values()),
        },
        "features": features_tree(features),
        "metadata": metadata,
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


# ---------------------------------------------------------------- validate


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


def _locate(lengths: list[int], episode: int) -> tuple[int | None, int | None]:
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


def _file_format(builder: Any) -> str:
    fmt = builder.info.file_format
    return getattr(fmt, "value", fmt) or "tfrecord"


def _stack_steps(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Turns a list of step dicts into a dict of arrays (lists where shapes vary)."""
    import numpy as np

    if not steps:
        return {}
    out: dict[str, Any] = {}
    for key, first in steps[0].items():
        values = [step[key] for step in steps]
        if isinstance(first, dict):
            out[key] = _stack_steps(values)
            continue
        try:
            out[key] = np.stack(values)
        except ValueError:
            out[key] = values
    return out


def decoded_episodes(builder: Any, split: str) -> Iterator[dict[str, Any]]:
    """Yields every episode of a split through TFDS, as numpy, steps batched into arrays.

    Args:
      builder: a TFDS builder, or a dataset directory to open with
        `tfds.builder_from_directory`.
      split: the split.

    Yields:
      Episode dicts whose `steps` is a dict of arrays with one row per step.
    """
    import tensorflow as tf

    if not hasattr(builder, "as_dataset"):
        import tensorflow_datasets as tfds

        builder = tfds.builder_from_directory(os.fspath(builder))
    if _file_format(builder) == "array_record":
        # TFDS reads array_record through a random-access data source only.
        for episode in builder.as_data_source(split=split):
            episode = dict(episode)
            episode["steps"] = _stack_steps(list(episode["steps"]))
            yield episode
        return

    steps_feature = builder.info.features["steps"]
    ragged = any(
        None in tuple(info.shape)
        for info in tf.nest.flatten(steps_feature.feature.get_tensor_info())
    )

    @tf.autograph.experimental.do_not_convert
    def batch_steps(episode: dict[str, Any]) -> dict[str, Any]:
        episode = dict(episode)
        steps = episode["steps"]
        batched = steps.ragged_batch(1 << 30) if ragged else steps.batch(1 << 30)
        episode["steps"] = batched.get_single_element()
        return episode

    ds = builder.as_dataset(split=split, shuffle_files=False).map(batch_steps)
    yield from ds.as_numpy_iterator()


def _check_shards(
    path: epath.Path, info_json: dict[str, Any], violations: _Violations, writing: bool
) -> list[str]:
    """Compares every shard file with dataset_info.json; returns notes."""
    notes = []
    file_format = info_json.get("fileFormat", "tfrecord")
    templates = layout.split_templates(info_json)
    for split, (lengths, _) in layout.read_splits(info_json).items():
        files = templates[split].files_on_disk(path)
        for index, n in enumerate(lengths):
            file = files.get(index)
            where = {"split": split, "shard": templates[split].filename(index, len(lengths))}
            if file is None:
                violations.add("listed shard file is missing", **where)
                continue
            if file_format == "tfrecord":
                # The same scan and the same words as recover, info and the reader.
                scan = tfrecord.scan(file, verify_data=True, resync=True)
                errors = scan.errors(file)
                problem = str(errors[0]) if errors else None
                found = len(scan.spans)
            else:
                try:
                    found = sum(1 for _ in iter_shard_records(file, file_format))
                    problem = None
                except Exception as e:  # noqa: BLE001
                    found, problem = 0, f"unreadable: {e}"
            if problem or found != n:
                # A damaged record is named as every tool names it (it carries the advice).
                message = problem or (
                    f"{layout.DATASET_INFO} lists {counted(n, 'episode')}, the file holds {found}; "
                    "run `rlds-writer recover`"
                )
                if writing:
                    notes.append(f"{where['shard']}: {message} (a writer is running)")
                else:
                    violations.add(message, **where)
        for index, file in files.items():
            if index >= len(lengths):
                message = f"{file.name} is not listed in {layout.DATASET_INFO}"
                if writing:
                    notes.append(message + " (a writer is running)")
                else:
                    violations.add(message + "; run `rlds-writer recover`", split=split)
    return notes


def _check_records(path: epath.Path, splits: Sequence[str] | None, violations: Any) -> None:
    """Decodes every listed record with the TF-free reader (bounded memory)."""
    reader = open_dataset(path)
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


def validate(
    path: epath.PathLike,
    *,
    splits: Sequence[str] | None = None,
    max_violations: int = 20,
) -> dict[str, Any]:
    """Decodes every episode through TFDS and checks the RLDS invariants.

    Checks that every shard file holds exactly the complete records
    `dataset_info.json` lists, that every episode decodes with
    `tfds.builder_from_directory`, and in every episode: at least one step;
    `is_first` True on step 0 and only there; `is_last` True on the final step
    and only there; `is_terminal` True on no step but the final one; all step
    fields of equal length; and that each split has as many episodes as
    `dataset_info.json` lists.

    Args:
      path: the dataset directory.
      splits: the splits to check (default: all).
      max_violations: stop collecting after this many.

    Returns:
      A dict: `ok`, `path`, `splits` (per split: `episodes`, `steps`),
      `violations` (each with `split`, `episode`, `step`, `shard`, `record`,
      `message` where known, in the order found), `first_violation` (or
      None), `notes`.
    """
    import tensorflow_datasets as tfds

    require_dataset(path)
    path = epath.Path(path)
    violations = _Violations(max_violations)
    info_json = layout.read_json(path / layout.DATASET_INFO)
    # Names, counts and feature shapes are checked by our own parsers first: a
    # crafted file must give an error here, not crash TensorFlow natively.
    layout.split_templates(info_json, os.fspath(path / layout.DATASET_INFO))
    features_lib.load_features(path / layout.FEATURES)
    writing = locking.is_locked(path)
    notes = _check_shards(path, info_json, violations, writing)
    if not writing:
        _check_records(path, splits, violations)
    # TFDS would stop at the same damage with its own (different) offset: splits
    # whose files failed the shared checks are not decoded again.
    damaged = {v.get("split") for v in violations.items}
    listed = layout.read_splits(info_json)
    builder = tfds.builder_from_directory(os.fspath(path))
    results: dict[str, Any] = {}
    for split in splits or list(listed):
        lengths = listed.get(split, ([], 0))[0]
        if split not in listed:
            violations.add(f"split {split!r} is not in {layout.DATASET_INFO}", split=split)
            continue
        episodes = 0
        total_steps = 0
        if split in damaged:
            results[split] = {"episodes": None, "steps": None}
            continue
        if sum(lengths) > 0:
            iterator = decoded_episodes(builder, split)
            while not violations.full:
                shard, record = _locate(lengths, episodes)
                where = {
                    "split": split,
                    "episode": episodes,
                    "shard": None
                    if shard is None
                    else layout.split_templates(info_json)[split].filename(shard, len(lengths)),
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
        "path": os.fspath(path),
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
