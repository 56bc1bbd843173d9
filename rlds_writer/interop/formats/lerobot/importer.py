"""LeRobot datasets (codebase_version "v3.0") to RLDS.

Reads the layout described in `layout.py` (columns: `columns.py`) with
pyarrow alone (no LeRobot, no torch): `meta/info.json`, `meta/tasks.parquet`,
the `meta/episodes` files and the `data` files, streaming one episode at a
time (episodes are contiguous in the data files, in `episode_index` order).

* A dataset written by `rlds-writer export --to lerobot` (it has
  `meta/rlds_writer.json`) comes back as it was: every column to its RLDS
  field with its dtype and shape, the final step from the `final/<column>`
  columns of `meta/episodes`, the episode fields from `rlds/<path>`, the
  task-field text from the tasks, `is_terminal` from `next.done`.
* Any other LeRobot dataset: `observation.<a>.<b>` columns become
  `steps/observation/<a>/<b>` (a lone `observation.state` stays a dict
  entry), `action` the action, `next.reward` the reward; each frame is one
  RLDS step and the last frame is the final step with its own action and
  reward (the observation after it is not in the dataset; the layout of
  TFDS's `d4rl_*` RLDS datasets). An episode is terminated when its last
  frame has `next.done` (LeRobot's recorders set `next.done` on time-limit
  ends too, so without `next.truncated` a truncation reads as a
  termination). The task text becomes `steps/language_instruction`,
  `timestamp` a step field, other columns step fields by their dotted path;
  `frame_index`, `index`, `episode_index` and `task_index` are dropped
  (`episode_index` is kept as episode metadata).
* Video features (MP4 cameras) are decoded with PyAV
  (`video.VideoFrames`), each file once, in order,
  and become uint8 (H, W, 3) arrays (PNG `Image`s in the RLDS dataset); the
  frames are what the lossy video holds, not the pixels that were encoded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import (
    IncompatibleDatasetError,
    SourceError,
    SpecError,
    UnsupportedFeatureError,
)
from rlds_writer.interop.episodes import ConversionReport, SourceEpisode, write_episodes
from rlds_writer.interop.export import default_discount
from rlds_writer.interop.formats.lerobot import columns as columns_lib
from rlds_writer.interop.formats.lerobot import layout
from rlds_writer.interop.formats.lerobot import meta as lerobot_meta
from rlds_writer.interop.formats.lerobot.video import VideoFrames
from rlds_writer.interop.source_limits import check_parquet, source_errors
from rlds_writer.store.dataset import names

_DROPPED = ("frame_index", "index", "episode_index", "task_index")


def _root(src: os.PathLike | str) -> Path:
    root = Path(os.fspath(src))
    if not (root / layout.INFO_PATH).is_file():
        raise FileNotFoundError(
            f"{src}: not a LeRobot dataset (no {layout.INFO_PATH}); pass the directory given to "
            "LeRobotDataset(repo_id, root=...)"
        )
    return root


def _json(path: Path) -> dict[str, Any]:
    try:
        with source_errors(path):
            text = path.read_text()
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, huge ints, deep nesting
        raise IncompatibleDatasetError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise IncompatibleDatasetError(f"{path}: expected a JSON object")
    return data


def load_info(root: Path) -> dict[str, Any]:
    """`meta/info.json`, checked for the v3 layout.

    Raises:
      UnsupportedFeatureError: (a NotImplementedError) for another codebase_version.
    """
    info = _json(root / layout.INFO_PATH)
    if not isinstance(info.get("features"), dict):
        raise IncompatibleDatasetError(f"{root / layout.INFO_PATH}: no 'features' object")
    videos = [
        k for k, f in info["features"].items() if isinstance(f, dict) and f.get("dtype") == "video"
    ]
    if videos:
        # Checked before any file is opened: these name the files the importer reads.
        where = str(root / layout.INFO_PATH)
        layout.check_video_path(info.get("video_path") or layout.VIDEO_PATH, where)
        for key in videos:
            names.check_name(
                key,
                "video feature",
                where=where,
                fix="rename the feature",
                error=IncompatibleDatasetError,
            )
    version = str(info.get("codebase_version", "?"))
    if not version.startswith("v3."):
        raise UnsupportedFeatureError(
            f"{root}: LeRobot codebase_version {version}; only v3.x is read (convert older ones "
            "with LeRobot's lerobot.datasets.v30.convert_dataset_v21_to_v30 first)"
        )
    lerobot_meta.check_info(info, root / layout.INFO_PATH)
    return info


def _parquet_rows(files: list[Path]) -> Iterator[dict[str, Any]]:
    """Rows of Parquet files in order, as dicts (for the small meta/episodes tables)."""
    import pyarrow.parquet as pq

    for file in files:
        check_parquet(file)
        with source_errors(file):
            batches = list(pq.ParquetFile(file).iter_batches(batch_size=64))
        for batch in batches:
            yield from batch.to_pylist()


def data_files(src: os.PathLike | str) -> list[str]:
    """The data files of a LeRobot v3 dataset (`chunk-000/file-000.parquet`, ...), in order."""
    root = _root(src)
    files = sorted((root / "data").glob("*/*.parquet"))
    if not files:
        raise FileNotFoundError(f"{root}: no data/chunk-*/file-*.parquet files")
    return [f.relative_to(root / "data").as_posix() for f in files]


def _episode_tables(root: Path, files: list[str] | None = None) -> Iterator[Any]:
    """The frames of each episode, as one Arrow table per episode, in data-file order."""
    import pyarrow as pa

    files = [root / "data" / f for f in (data_files(root) if files is None else files)]
    pending: list[Any] = []
    current = None
    for file in files:
        check_parquet(file)
        for batch in _batches(file):
            if "episode_index" not in batch.schema.names:
                raise SourceError(f"{file}: no episode_index column")
            index = batch.column("episode_index").to_numpy()
            start = 0
            for cut in [*np.flatnonzero(np.diff(index)) + 1, len(index)]:
                if start == cut:
                    continue
                if current is not None and index[start] != current:
                    yield pa.Table.from_batches(pending)
                    pending = []
                current = int(index[start])
                pending.append(batch.slice(start, cut - start))
                start = cut
    if pending:
        yield pa.Table.from_batches(pending)


def _batches(file: Path) -> Iterator[Any]:
    """The record batches of a data file, its read errors one line naming it."""
    import pyarrow.parquet as pq

    with source_errors(file):
        batches = pq.ParquetFile(file).iter_batches(batch_size=1024)
        while True:
            batch = next(batches, None)
            if batch is None:
                return
            yield batch


def _nest(tree: dict[str, Any], path: tuple[str, ...], value: Any, where: str) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise SpecError(f"{where}: both a field and a dict of fields")
    if path[-1] in tree:
        raise SpecError(f"{where}: two columns for one field")
    tree[path[-1]] = value


def _final_value(column: columns_lib.Column, cell: Any) -> Any:
    if cell is None and column.kind != "string":
        raise SpecError(
            f"meta/episodes: no value for {'/'.join(column.path)} (a column is missing)"
        )
    if column.kind == "image":
        return columns_lib.decode_png(cell)
    if column.kind == "string":
        return "" if cell is None else cell
    return np.asarray(cell, dtype=column.dtype).reshape(column.shape)


def _ours(
    table: Any, meta: dict[str, Any], mapping: dict, tasks: dict[int, str], videos: Any
) -> SourceEpisode:
    """An episode written by our exporter, with its final step."""
    columns = [columns_lib.Column.from_json(c) for c in mapping["columns"]]
    frames = set(mapping["frame_columns"])
    steps: dict[str, Any] = {}
    task_index = table.column("task_index").to_numpy()
    task = mapping.get("task") or {}
    for column in columns:
        final = _final_value(column, meta.get(layout.FINAL_PREFIX + column.key))
        if column.key in frames:
            values = columns_lib.column_values(
                column.kind, column.dtype, column.shape, table.column(column.key)
            )
        elif column.key in mapping.get("video_columns", ()):
            values = videos.episode(column.key, meta)
        elif task.get("where") == "step" and "/".join(column.path) == task.get("path"):
            values = lerobot_meta.task_texts(tasks, task_index, f"episode {meta['episode_index']}")
        else:
            raise SpecError(f"{column.key}: in meta/rlds_writer.json but not in the data")
        if column.kind == "string":
            values = [*values, final]
        else:
            values = np.concatenate([values, np.asarray(final, column.dtype)[None]])
        _nest(steps, column.path, values, column.key)
    done = table.column(layout.DONE).to_numpy(zero_copy_only=False)
    episode_metadata: dict[str, Any] = {}
    for field in mapping.get("episode_fields", []):
        column = columns_lib.Column(
            "", tuple(field["path"]), _dtype(field), tuple(field["shape"]), ""
        )
        column.kind = field["kind"]
        cell = meta.get(layout.EPISODE_PREFIX + "/".join(field["path"]))
        _nest(episode_metadata, column.path, _final_value(column, cell), "/".join(column.path))
    if "observation" not in steps:
        raise SpecError("meta/rlds_writer.json: no observation column")
    observations = steps.pop("observation")
    rewards = steps.pop("reward", np.zeros(table.num_rows + 1, np.float32))
    discounts = steps.pop("discount", None)
    if discounts is None:  # what rlds_writer's recorders write, final step included
        discounts = default_discount(len(rewards), bool(done[-1]))
    return SourceEpisode(
        observations=observations,
        actions=steps.pop("action", {}),
        rewards=rewards,
        terminated=bool(done[-1]),
        discounts=discounts,
        step_metadata=steps,
        episode_metadata=episode_metadata,
    )


def _dtype(field: dict[str, Any]) -> np.dtype:
    return np.dtype(object) if field["kind"] == "string" else np.dtype(field["dtype"])


def _foreign(
    table: Any, meta: dict[str, Any], info: dict, tasks: dict[int, str], videos: Any
) -> SourceEpisode:
    """An episode of any LeRobot dataset: each frame one RLDS step."""
    steps: dict[str, Any] = {}
    features = info["features"]
    for key, feature in features.items():
        if feature.get("dtype") == "video":
            _nest(steps, tuple(key.split(".")), videos.episode(key, meta), key)
    for key in table.column_names:
        feature = features.get(key)
        if key in _DROPPED or feature is None or key in (layout.DONE, layout.TRUNCATED):
            continue
        kind = {"image": "image", "string": "string"}.get(feature["dtype"], "numeric")
        shape = tuple(feature["shape"])
        dtype = np.dtype({"string": object, "image": np.uint8}.get(kind, feature["dtype"]))
        if kind == "numeric" and shape == (1,):
            shape = ()
        values = columns_lib.column_values(kind, dtype, shape, table.column(key))
        if key == "next.reward":
            path: tuple[str, ...] = ("reward",)
        else:
            path = tuple(key.split("."))
        _nest(steps, path, values, key)
    steps["language_instruction"] = lerobot_meta.task_texts(
        tasks, table.column("task_index").to_numpy(), f"episode {meta['episode_index']}"
    )
    names = table.column_names
    done = (
        table.column(layout.DONE).to_numpy(zero_copy_only=False) if layout.DONE in names else None
    )
    truncated = (
        table.column(layout.TRUNCATED).to_numpy(zero_copy_only=False)
        if layout.TRUNCATED in names
        else None
    )
    terminated = bool(
        done is not None and done[-1] and not (truncated is not None and truncated[-1])
    )
    if "observation" not in steps:
        raise SpecError("the LeRobot dataset has no observation.* feature")
    frames = table.num_rows
    rewards = steps.pop("reward", np.zeros(frames, np.float32))
    return SourceEpisode(
        observations=steps.pop("observation"),
        actions=steps.pop("action", {}),
        rewards=rewards,
        terminated=terminated,
        step_metadata=steps,
        episode_metadata={"episode_index": np.int64(meta["episode_index"])},
    )


def read_episodes(
    src: os.PathLike | str, files: list[str] | None = None
) -> Iterator[SourceEpisode]:
    """Yields the episodes of a LeRobot v3 dataset, one at a time (see the module doc).

    Args:
      src: the dataset directory.
      files: only the episodes of these data files (from `data_files`; a Beam
        work item reads one), default all. LeRobot writes each episode into
        one file; an episode split across these files is refused, naming it.
    """
    root = _root(src)
    info = load_info(root)
    tasks = lerobot_meta.load_tasks(root)
    mapping_file = root / layout.MAPPING_PATH
    mapping = _json(mapping_file) if mapping_file.is_file() else None
    metas = _parquet_rows(sorted((root / "meta" / "episodes").glob("*/*.parquet")))
    has_videos = any(f.get("dtype") == "video" for f in info["features"].values())
    videos = VideoFrames(root, info) if has_videos else None
    try:
        with source_errors(root):
            yield from _episodes(root, info, tasks, mapping, metas, videos, files)
    finally:
        if videos is not None:
            videos.close()


def _episodes(
    root: Path,
    info: dict[str, Any],
    tasks: dict[int, str],
    mapping: dict[str, Any] | None,
    metas: Iterator[dict[str, Any]],
    videos: VideoFrames | None,
    files: list[str] | None = None,
) -> Iterator[SourceEpisode]:
    for table in _episode_tables(root, files):
        index = int(table.column("episode_index")[0].as_py())
        meta = lerobot_meta.meta_row(next(metas, None), root)
        while meta is not None and meta["episode_index"] < index:
            meta = lerobot_meta.meta_row(next(metas, None), root)
        if meta is None or meta["episode_index"] != index:
            raise SpecError(f"{root}: episode {index} has frames but no meta/episodes row")
        if meta["length"] != table.num_rows:
            raise SpecError(
                f"{root}: episode {index} has {table.num_rows} frames, meta/episodes says "
                f"{meta['length']}"
            )
        if mapping is not None:
            yield _ours(table, meta, mapping, tasks, videos)
        else:
            yield _foreign(table, meta, info, tasks, videos)


def convert(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    name: str | None = None,
    **write_kwargs: Any,
) -> ConversionReport:
    """Converts a LeRobot v3 dataset directory into an RLDS dataset.

    Args:
      src: the LeRobot dataset directory (what `LeRobotDataset(..., root=)` takes).
      dest: the dataset directory to write.
      name: the dataset name (default: the exported dataset's, else the directory name).
      **write_kwargs: `episodes.write_episodes` options (mode, file_format, ...).

    Returns:
      The conversion report.
    """
    root = _root(src)
    info = load_info(root)
    mapping_file = root / layout.MAPPING_PATH
    mapping = _json(mapping_file) if mapping_file.is_file() else {}
    safe = "".join(c if c.isalnum() else "_" for c in root.name.lower()).strip("_")
    lerobot = {k: info.get(k) for k in ("codebase_version", "fps", "robot_type", "total_tasks")}
    metadata = {"format": "lerobot", **(mapping.get("metadata") or {}), "lerobot": lerobot}
    return write_episodes(
        lambda: read_episodes(root),
        dest,
        name=name or mapping.get("name") or safe or "lerobot_dataset",
        source=os.fspath(src),
        metadata=metadata,
        **write_kwargs,
    )
