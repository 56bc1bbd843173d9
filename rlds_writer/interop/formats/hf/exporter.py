"""RLDS to a Hugging Face `datasets` dataset directory (Parquet, one row per transition).

`datasets.load_dataset(DEST)` opens the result (its `README.md` names two
configurations), and it can be pushed to the Hub as is:

* `transitions` (default): one row per transition, the rules of
  `open_dataset(...).episodes().transitions()`: `episode_index`,
  `step_index`, `observation`, `action`, `reward`, `discount`,
  `next_observation`, `terminated`, `truncated`, and each step metadata field
  under its RLDS name (the values recorded with observation `t`);
* `episodes`: one row per episode: `episode_index`, `num_transitions`,
  `end` ("terminated", "truncated", "cut_short") and every episode-level field.

Features follow the RLDS features: scalars are `Value`s, vectors `List`s of
their length, higher ranks `Array2D`..`Array5D`, images `Image`s (PNG), text
`Value("string")`, dicts stay dicts. The files are written with `datasets`'
own `ParquetWriter`, so they carry the features; at most
`episodes_per_file` episodes per file, written in batches (memory bounded by
about one episode plus one batch).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.interop.export import (
    ExportReport,
    check_cut_short,
    episode_metadata,
    needs_libraries,
    new_output_directory,
    open_source,
    source_episodes,
    text,
)
from rlds_writer.read.nest import rows
from rlds_writer.read.transitions import episode_transitions

_ARRAYS = {2: "Array2D", 3: "Array3D", 4: "Array4D", 5: "Array5D"}


def _leaf_feature(leaf: Any) -> Any:
    import datasets

    if leaf.is_image:
        return datasets.Image()
    if leaf.dtype == np.object_:
        if leaf.shape:
            raise SpecError(f"{leaf.key}: {leaf.describe()} text arrays are not supported")
        return datasets.Value("string")
    value = datasets.Value("bool" if leaf.dtype == np.bool_ else leaf.dtype.name)
    shape = leaf.shape
    if not shape:
        return value
    if len(shape) == 1:
        return datasets.List(value, length=-1 if shape[0] is None else int(shape[0]))
    if None in shape[1:] or len(shape) not in _ARRAYS:
        raise SpecError(f"{leaf.key}: {leaf.describe()} has no Hugging Face array feature")
    return getattr(datasets, _ARRAYS[len(shape)])(shape=tuple(shape), dtype=value.dtype)


def _tree_features(leaves: list[Any], depth: int) -> Any:
    if len(leaves) == 1 and len(leaves[0].path) == depth:
        return _leaf_feature(leaves[0])
    children: dict[str, list[Any]] = {}
    for leaf in leaves:
        children.setdefault(leaf.path[depth], []).append(leaf)
    return {k: _tree_features(v, depth + 1) for k, v in children.items()}


def features_of(reader: Any) -> tuple[Any, Any]:
    """The `datasets.Features` of the transitions and episodes tables of a dataset."""
    import datasets

    steps: dict[str, list[Any]] = {}
    for leaf in reader.features.step_leaves:
        steps.setdefault(leaf.path[1], []).append(leaf)
    if "observation" not in steps:
        raise SpecError(f"{reader.path}: the dataset has no steps/observation")
    transitions: dict[str, Any] = {
        "episode_index": datasets.Value("int64"),
        "step_index": datasets.Value("int64"),
        "observation": _tree_features(steps["observation"], 2),
    }
    if "action" in steps:
        transitions["action"] = _tree_features(steps["action"], 2)
    transitions["reward"] = (
        _tree_features(steps["reward"], 2) if "reward" in steps else datasets.Value("float32")
    )
    transitions["discount"] = (
        _tree_features(steps["discount"], 2) if "discount" in steps else datasets.Value("float32")
    )
    transitions["next_observation"] = transitions["observation"]
    transitions["terminated"] = datasets.Value("bool")
    transitions["truncated"] = datasets.Value("bool")
    for name, leaves in steps.items():
        if name not in ("observation", "action", "reward", "discount") and name not in (
            "is_first",
            "is_last",
            "is_terminal",
        ):
            if name in transitions:
                raise SpecError(f"steps/{name}: clashes with the transition column {name!r}")
            transitions[name] = _tree_features(leaves, 2)
    episodes: dict[str, Any] = {
        "episode_index": datasets.Value("int64"),
        "num_transitions": datasets.Value("int64"),
        "end": datasets.Value("string"),
    }
    for leaf in reader.features.episode_leaves:
        if leaf.path[0] in episodes:
            raise SpecError(f"{leaf.key}: clashes with the episodes column {leaf.path[0]!r}")
    by_name: dict[str, list[Any]] = {}
    for leaf in reader.features.episode_leaves:
        by_name.setdefault(leaf.path[0], []).append(leaf)
    for name, leaves in by_name.items():
        episodes[name] = _tree_features(leaves, 1)
    return datasets.Features(transitions), datasets.Features(episodes)


def _python(value: Any) -> Any:
    """Values `datasets` encodes: text as str, arrays as arrays, dicts recursively."""
    if isinstance(value, Mapping):
        return {k: _python(v) for k, v in value.items()}
    return text(value)


_CARD = """---
configs:
- config_name: transitions
  default: true
  data_files:
  - split: {split}
    path: transitions/*.parquet
- config_name: episodes
  data_files:
  - split: {split}
    path: episodes/*.parquet
tags:
- rlds
- offline-rl
---

# {name}

Exported from an RLDS dataset by `rlds-writer export --to hf`: one row per
transition (`transitions`, the default configuration) and one row per episode
(`episodes`). {description}
"""


class _Tables:
    """The two Parquet tables, `episodes_per_file` episodes per file."""

    def __init__(
        self, directory: Path, split: str, features: tuple[Any, Any], episodes_per_file: int
    ):
        self.directory = directory
        self.split = split
        self.features = dict(zip(("transitions", "episodes"), features))
        self.episodes_per_file = episodes_per_file
        self.writers: dict[str, Any] = {}
        self.files = 0

    def write(self, index: int, transitions: list[dict], episode: dict) -> None:
        from datasets.arrow_writer import ParquetWriter

        if index % self.episodes_per_file == 0:
            self.close()
            for table, features in self.features.items():
                (self.directory / table).mkdir(exist_ok=True)
                path = self.directory / table / f"{self.split}-{self.files:05d}.parquet"
                self.writers[table] = ParquetWriter(features=features, path=str(path))
            self.files += 1
        for row in transitions:
            self.writers["transitions"].write(row)
        self.writers["episodes"].write(episode)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.finalize()
        self.writers = {}


@needs_libraries("hf")
def export(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    split: str = "train",
    cut_short: str = "truncated",
    episodes_per_file: int = 1000,
    progress: bool = False,
) -> ExportReport:
    """Exports an RLDS dataset as a Hugging Face `datasets` directory (see the module doc).

    Args:
      src: the RLDS dataset directory.
      dest: the directory to write (created; must not hold files).
      split: the split to export (TFDS split syntax); the Hugging Face split
        takes its name (`train[:10%]` becomes `train`).
      cut_short: "truncated" (default) exports episodes the recorder cut short
        as truncated; "drop" leaves them out.
      episodes_per_file: episodes per Parquet file.
      progress: show a tqdm progress bar.

    Returns:
      The `ExportReport`.

    Raises:
      FileExistsError: if `dest` holds files.
      ValueError: for an unknown split.
    """
    from tqdm import tqdm

    check_cut_short(cut_short)
    directory = new_output_directory(dest, episodes_per_file)
    reader = open_source(src, split)
    hf_split = split.split("[")[0].split("+")[0] or "train"
    features = features_of(reader)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    report = ExportReport(source=os.fspath(src), destination=os.fspath(dest), format="hf")
    tables = _Tables(directory, hf_split, features, episodes_per_file)
    try:
        episodes = source_episodes(reader, split, report, cut_short=cut_short)
        for episode, end in tqdm(episodes, desc="export", unit="ep", disable=not progress):
            batch = episode_transitions(episode, cut_short="truncated")
            index = report.episodes
            columns = {
                "observation": batch["observation"],
                "reward": batch["reward"],
                "discount": batch["discount"],
                "next_observation": batch["next_observation"],
                "terminated": batch["terminated"],
                "truncated": batch["truncated"],
                **batch["step_metadata"],
            }
            if batch["action"] is not None:
                columns["action"] = batch["action"]
            t = len(batch["terminated"])
            rows_ = [
                {"episode_index": index, "step_index": i, **_python(row)}
                for i, row in enumerate(rows(columns))
            ]
            summary = {"episode_index": index, "num_transitions": t, "end": end}
            summary.update(_python(episode_metadata(episode)))
            tables.write(index, rows_, summary)
            report.episodes += 1
            report.transitions += t
            if end == "terminated":
                report.terminated += 1
            else:
                report.truncated += 1
        tables.close()
        description = str(reader.info.get("description") or "")
        (directory / "README.md").write_text(
            _CARD.format(split=hf_split, name=reader.name, description=description)
        )
    except BaseException:
        tables.close()
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        reader.close()
    report.notes.append(f"load it with datasets.load_dataset({os.fspath(dest)!r})")
    return report
