"""LeRobot's metadata files, read and checked before the importer computes with them.

`meta/info.json`'s `fps` and feature dtypes and shapes, `meta/tasks.parquet`
(task indices are 0 to n - 1, kept in a dict: an index of 10**11 is one
entry, not a list of 10**11) and the `meta/episodes` rows' `episode_index`
and `length`. A value the importer cannot use is a one-line `SourceError`
naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import SourceError, SpecError
from rlds_writer.interop.formats.lerobot import layout
from rlds_writer.interop.source_limits import check_parquet, source_errors


def check_info(info: dict[str, Any], where: Path) -> None:
    """The info.json values the importer computes with: fps and each feature's dtype and shape."""
    fps = info.get("fps")
    videos = any(
        isinstance(f, dict) and f.get("dtype") == "video" for f in info["features"].values()
    )
    if fps is not None or videos:
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < float("inf"):
            raise SourceError(
                f"{where}: fps is {fps!r}; expected a positive number of frames per second "
                "(LeRobot writes an integer, e.g. 30)"
            )
    for key, feature in info["features"].items():
        if not isinstance(feature, dict):
            raise SourceError(f"{where}: features[{key!r}] is not an object")
        dtype, shape = feature.get("dtype"), feature.get("shape")
        if not isinstance(dtype, str):
            raise SourceError(f"{where}: features[{key!r}].dtype is {dtype!r}; expected a string")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape
        ):
            raise SourceError(
                f"{where}: features[{key!r}].shape is {shape!r}; expected a list of sizes"
            )
        if dtype not in ("image", "video", "string"):
            try:
                ok = np.dtype(dtype).kind in "biuf"
            except TypeError:
                ok = False
            if not ok:
                raise SourceError(
                    f"{where}: features[{key!r}].dtype is {dtype!r}; expected a numeric dtype, "
                    "image, video or string"
                )


def load_tasks(root: Path) -> dict[int, str]:
    """Task texts by task_index (the index of LeRobot's tasks frame is the text)."""
    import pyarrow.parquet as pq

    path = root / layout.TASKS_PATH
    check_parquet(path)
    with source_errors(path):
        table = pq.read_table(path)
    names = table.column_names
    text = next(
        (n for n in ("task", "__index_level_0__") if n in names),
        next((n for n in names if n != "task_index"), None),
    )
    if text is None or "task_index" not in names:
        raise SpecError(f"{path}: expected task text and task_index columns")
    tasks: dict[int, str] = {}
    count = table.num_rows
    for index, task in zip(
        table.column("task_index").to_pylist(), table.column(text).to_pylist(), strict=True
    ):
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise SourceError(
                f"{path}: task_index {index!r} of task {task!r}; expected 0 to {count - 1} "
                f"(LeRobot numbers its {count} tasks from 0)"
            )
        if index in tasks:
            raise SourceError(f"{path}: task_index {index} is given to two tasks")
        tasks[index] = "" if task is None else str(task)
    return tasks


def task_texts(tasks: dict[int, str], indices: Any, where: str) -> list[str]:
    """The task text of each frame; an index the tasks file lacks is an error naming it."""
    try:
        return [tasks[int(i)] for i in indices]
    except KeyError as e:
        raise SourceError(
            f"{where}'s frames: task_index {e.args[0]} is not in {layout.TASKS_PATH} "
            f"(it has {len(tasks)} tasks)"
        ) from None


def meta_row(row: dict[str, Any] | None, root: Path) -> dict[str, Any] | None:
    """A meta/episodes row, its episode_index and length checked."""
    if row is None:
        return None
    for name in ("episode_index", "length"):
        value = row.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SourceError(
                f"{root}/meta/episodes: {name} is {value!r} in a row; expected an integer >= 0"
            )
    return row
