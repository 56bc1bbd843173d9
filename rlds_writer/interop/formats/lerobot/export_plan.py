"""What a LeRobot export will write, decided from the dataset's features before any episode.

`plan(...)` maps the RLDS features to LeRobot's: the frame columns, the RLDS
final step and the episode fields kept in meta/episodes, the cameras written
as videos, the task's source, `info.json`'s features and the Arrow schemas
of the data and meta/episodes files. Every refusal (a field LeRobot cannot
hold, an unknown task field, a camera name that is not a safe directory
name) happens here, before the destination is created.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.interop.formats.lerobot import columns as columns_lib
from rlds_writer.interop.formats.lerobot import layout
from rlds_writer.interop.formats.lerobot import stats as stats_lib
from rlds_writer.interop.formats.lerobot.video import eligible, meta_types
from rlds_writer.store.dataset import names

# (kind, dtype, shape) of a data column, as `columns.arrow_type` takes them.
Kind = tuple[str, np.dtype, tuple[int, ...]]

# The columns of meta/episodes before the statistics and our own.
_EPISODE_INDEX_FIELDS = (
    "episode_index",
    "tasks",
    "length",
    "data/chunk_index",
    "data/file_index",
    "dataset_from_index",
    "dataset_to_index",
    "meta/episodes/chunk_index",
    "meta/episodes/file_index",
)


@dataclasses.dataclass
class Plan:
    """The mapping of one export, from the features alone.

    Attributes:
      columns: the frame columns (the task field left out when it is per step).
      final_columns: every step field, kept from the RLDS final step.
      episode_columns: the episode fields, as `rlds/<path>` meta/episodes columns.
      cameras: the columns written as MP4 videos, with their shapes.
      task_where: "step", "episode" or None (a constant task).
      task_path: the task field's path ("a/b"), or None.
      constant_task: the task text when there is no task field.
      features: `info.json`'s features (the videos' info is added later).
      data_kinds: every column of the data files (cameras left out).
      data_schema: their Arrow schema.
      stat_keys: the columns with statistics (cameras included).
      meta_schema: the Arrow schema of meta/episodes.
    """

    columns: list[columns_lib.Column]
    final_columns: list[columns_lib.Column]
    episode_columns: list[dict[str, Any]]
    cameras: dict[str, tuple[int, ...]]
    task_where: str | None
    task_path: str | None
    constant_task: str
    features: dict[str, Any]
    data_kinds: dict[str, Kind]
    data_schema: Any
    stat_keys: dict[str, Kind]
    meta_schema: Any


def plan(reader: Any, *, task: str | None, task_field: str | None, video: bool) -> Plan:
    """Maps the dataset's features to LeRobot's (see the module doc).

    Raises:
      ValueError: for an unknown task field.
      SpecError: for a field LeRobot cannot hold.
      UnsafePathError: for a camera name that is not a safe directory name.
    """
    task_where, task_path = _task_source(reader, task_field)
    skip = (task_path,) if task_where == "step" and task_path else ()
    columns = columns_lib.columns_of(reader, skip=skip)
    final_columns = columns_lib.columns_of(reader)
    episode_columns = _episode_columns(reader)
    cameras = _cameras(columns) if video else {}
    data_kinds = _data_kinds(columns, cameras)
    stat_keys = {k: v for k, v in data_kinds.items() if v[0] != "string"}
    stat_keys.update({k: ("image", np.dtype(np.uint8), shape) for k, shape in cameras.items()})
    metadata = reader.metadata or {}
    return Plan(
        columns=columns,
        final_columns=final_columns,
        episode_columns=episode_columns,
        cameras=cameras,
        task_where=task_where,
        task_path=task_path,
        constant_task=task or str(metadata.get("env_id") or reader.name),
        features=_features(columns),
        data_kinds=data_kinds,
        data_schema=_data_schema(data_kinds),
        stat_keys=stat_keys,
        meta_schema=_meta_schema(stat_keys, episode_columns, final_columns, list(cameras)),
    )


def _task_source(reader: Any, task_field: str | None) -> tuple[str | None, str | None]:
    """Where the task text comes from: ("step" | "episode" | None, field path)."""
    if task_field is None:
        return None, None
    path = tuple(p for p in task_field.replace(".", "/").split("/") if p)
    texts = {}
    for leaf in reader.features.leaves:
        if leaf.dtype == np.object_ and not leaf.shape:
            inner = leaf.path[1:] if leaf.in_steps else leaf.path
            texts[inner] = "step" if leaf.in_steps else "episode"
    if path not in texts:
        known = sorted("/".join(p) for p in texts) or ["none"]
        raise ValueError(
            f"task_field {task_field!r}: no Text step or episode field of that name; the "
            f"dataset's text fields are {known} (or leave it out for a constant task)"
        )
    return texts[path], "/".join(path)


def _episode_columns(reader: Any) -> list[dict[str, Any]]:
    """The episode fields, as columns of meta/episodes (`rlds/<path>`)."""
    out = []
    for leaf in reader.features.episode_leaves:
        if not leaf.static or (leaf.dtype == np.object_ and leaf.shape):
            raise SpecError(f"{leaf.key}: {leaf.describe()} cannot be kept in meta/episodes")
        kind = "string" if leaf.dtype == np.object_ else "numeric"
        if leaf.is_image and leaf.dtype == np.uint8:
            kind = "image"
        shape = tuple(int(d) for d in leaf.shape)
        out.append({"path": list(leaf.path), "kind": kind, "dtype": leaf.dtype, "shape": shape})
    return out


def _cameras(columns: list[columns_lib.Column]) -> dict[str, tuple[int, ...]]:
    """The image columns written as videos (RGB of even size), their names checked."""
    cameras = {c.key: c.shape for c in columns if c.kind == "image" and eligible(c.shape)}
    for c in columns:
        if c.key in cameras:
            # The camera's name is a directory of its videos: videos/<name>/...
            names.check_name(
                c.key,
                "LeRobot camera name",
                where=f"steps/{'/'.join(c.path)}",
                fix="it names the directory of its videos; rename the field or export "
                "without --video",
            )
    return cameras


def _features(columns: list[columns_lib.Column]) -> dict[str, Any]:
    """`info.json`'s features: the columns, `next.done`/`next.truncated`, LeRobot's own."""
    features = {c.key: c.feature() for c in columns}
    features[layout.DONE] = {"dtype": "bool", "shape": [1], "names": None}
    features[layout.TRUNCATED] = {"dtype": "bool", "shape": [1], "names": None}
    features.update(layout.DEFAULT_FEATURES)
    return features


def _data_kinds(
    columns: list[columns_lib.Column], cameras: dict[str, tuple[int, ...]]
) -> dict[str, Kind]:
    kinds = {c.key: (c.kind, c.dtype, c.shape) for c in columns if c.key not in cameras}
    kinds[layout.DONE] = kinds[layout.TRUNCATED] = ("numeric", np.dtype(bool), ())
    kinds["timestamp"] = ("numeric", np.dtype(np.float32), ())
    for key in ("frame_index", "episode_index", "index", "task_index"):
        kinds[key] = ("numeric", np.dtype(np.int64), ())
    return kinds


def _data_schema(kinds: dict[str, Kind]) -> Any:
    """The data files' schema, with the `datasets` features LeRobot's loader reads."""
    import pyarrow as pa

    hf = {"info": {"features": {k: columns_lib.hf_feature(*v) for k, v in kinds.items()}}}
    return pa.schema(
        [(k, columns_lib.arrow_type(*v)) for k, v in kinds.items()],
        metadata={"huggingface": json.dumps(hf)},
    )


def _meta_schema(
    stat_keys: dict[str, Kind],
    episode_columns: list[dict[str, Any]],
    final_columns: list[columns_lib.Column],
    cameras: list[str],
) -> Any:
    """meta/episodes' schema: LeRobot's index columns, statistics, then ours and the videos'."""
    import pyarrow as pa

    types = {"tasks": pa.list_(pa.string())}
    fields: list[tuple[str, Any]] = [(k, types.get(k, pa.int64())) for k in _EPISODE_INDEX_FIELDS]
    shapes = {k: stats_lib.stats_shape(v[0], v[2]) for k, v in stat_keys.items()}
    fields += list(stats_lib.arrow_types(shapes).items())
    for field in episode_columns:
        name = layout.EPISODE_PREFIX + "/".join(field["path"])
        fields.append((name, columns_lib.meta_type(field["kind"], field["dtype"], field["shape"])))
    for c in final_columns:
        fields.append(
            (layout.FINAL_PREFIX + c.key, columns_lib.meta_type(c.kind, c.dtype, c.shape))
        )
    return pa.schema(fields + meta_types(cameras))
