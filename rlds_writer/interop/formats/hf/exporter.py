"""RLDS to a Hugging Face `datasets` dataset directory (Parquet, one row per transition).

`datasets.load_dataset(DEST)` opens the result (its `README.md` names two
configurations), and it can be pushed to the Hub as is:

* `transitions` (default): one row per transition, the rules of
  `open_dataset(...).episodes().transitions()`: `episode_index`,
  `step_index`, `observation`, `action`, `reward`, `discount`,
  `next_observation`, `terminated`, `truncated`, and each step metadata field
  under its RLDS name (the values recorded with observation `t`);
* `episodes`: one row per episode, one-step episodes (no transition)
  included: `episode_index`, `num_transitions`, `end` ("terminated",
  "truncated", "cut_short") and every episode-level field.

`episode_index` is the episode's position in the exported split of the
source, counting every episode (as `qlearning_dataset`'s `episode_ids`): it
names the same episode in both tables, and an episode left out
(`cut_short="drop"`) leaves a gap rather than shifting the ones after it.

Features follow the RLDS features: scalars are `Value`s, vectors `List`s of
their length, higher ranks `Array2D`..`Array5D`, text `Value("string")`,
dicts stay dicts. uint8 `Image`s of 1, 3 or 4 channels are `Image`s: the
stored PNG or JPEG bytes go into the Parquet files as they are (each checked
from its header first); a value a plain decoder would not read as the
feature's image (a palette PNG, a grey frame of a colour feature) is decoded
and written as PNG. One-channel images load as Pillow "L" images, `(H, W)`
arrays. Other images (uint16, float32) are arrays of their shape. The files
are written with `datasets`' own `ParquetWriter`, so they carry the
features; at most `episodes_per_file` episodes per file, an episode's
transitions written as one batch (memory bounded by about one episode).
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
    numbered_episodes,
    open_source,
    text,
    value_at,
)
from rlds_writer.read.images import check_stored, decode_image
from rlds_writer.read.nest import flatten, put, rows
from rlds_writer.read.transitions import episode_transitions

_ARRAYS = {2: "Array2D", 3: "Array3D", 4: "Array4D", 5: "Array5D"}


def is_hf_image(leaf: Any) -> bool:
    """Whether an RLDS field is a Hugging Face `Image` (uint8, 1, 3 or 4 channels)."""
    return leaf.is_image and leaf.dtype == np.uint8 and leaf.shape[-1] in (1, 3, 4, None)


def _leaf_feature(leaf: Any) -> Any:
    import datasets

    if is_hf_image(leaf):
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


def _png(image: np.ndarray) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image[:, :, 0] if image.shape[-1] == 1 else image).save(out, format="PNG")
    return out.getvalue()


def _image_values(column: Any, leaf: Any) -> list[dict[str, Any]]:
    """A column of stored image bytes as `datasets.Image` values, the bytes kept where they can."""
    values = []
    for data in column:
        if not check_stored(data, leaf):
            data = _png(decode_image(data, leaf))
        values.append({"bytes": data, "path": None})
    return values


def _image_leaves(reader: Any) -> dict[tuple, Any]:
    """The `Image` fields by their path in a transition row (`next_observation` too)."""
    images = {}
    for leaf in reader.features.step_leaves:
        if is_hf_image(leaf):
            images[leaf.path[1:]] = leaf
            if leaf.path[1] == "observation":
                images[("next_observation", *leaf.path[2:])] = leaf
    return images


def _stored_keys(reader: Any) -> list[str]:
    """The image fields read as their stored bytes (the Hugging Face `Image`s)."""
    return [leaf.key for leaf in reader.features.step_leaves if is_hf_image(leaf)]


def _columns(tree: Mapping[str, Any], images: Mapping[tuple, Any]) -> dict[str, Any]:
    """A transition batch's columns with images as `Image` values and text as str."""
    out: dict[str, Any] = {}
    for path, column in flatten(tree):
        leaf = images.get(path)
        if leaf is not None:
            value = _image_values(column, leaf)
        elif isinstance(column, np.ndarray) and column.dtype == object:
            value = text(column)
        else:
            value = column
        put(out, path, value)
    return out


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

    def write(self, count: int, transitions: dict[str, list], episode: dict) -> None:
        """Writes the `count`-th episode written (from 0): its transitions and its row."""
        from datasets.arrow_writer import ParquetWriter

        if count % self.episodes_per_file == 0:
            self.close()
            for table, features in self.features.items():
                (self.directory / table).mkdir(exist_ok=True)
                path = self.directory / table / f"{self.split}-{self.files:05d}.parquet"
                self.writers[table] = ParquetWriter(features=features, path=str(path))
            self.files += 1
        if transitions:
            self.writers["transitions"].write_batch(transitions)
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
        images = _image_leaves(reader)
        episode_images = [leaf for leaf in reader.features.episode_leaves if is_hf_image(leaf)]
        episodes = numbered_episodes(
            reader, split, report, cut_short=cut_short, min_steps=1, encoded=_stored_keys(reader)
        )
        for index, episode, end in tqdm(episodes, desc="export", unit="ep", disable=not progress):
            batch = episode_transitions(episode, cut_short="truncated")
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
            transitions = {}
            if t:
                columns = _columns(columns, images)
                transitions = {
                    "episode_index": [index] * t,
                    "step_index": list(range(t)),
                    **{
                        name: list(value) if not isinstance(value, Mapping) else rows(value)
                        for name, value in columns.items()
                    },
                }
            summary = {"episode_index": index, "num_transitions": t, "end": end}
            summary.update(_python(episode_metadata(episode)))
            for leaf in episode_images:  # decoded with the episode: encoded here
                put(summary, leaf.path, {"bytes": _png(value_at(episode, leaf.path)), "path": None})
            tables.write(report.episodes, transitions, summary)
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
