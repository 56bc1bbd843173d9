"""RLDS to a LeRobot dataset (codebase_version "v3.0"), for `LeRobotDataset(repo_id, root=DEST)`.

Layout and column types: `rlds_writer.interop.lerobot_layout`; statistics:
`rlds_writer.interop.lerobot_stats`. Mapping, for an episode of `n` RLDS steps:

* `n - 1` frames, one per transition: frame `t` holds observation `o_t`
  (`observation.state`, `observation.image`, or `observation.<name>` /
  `observation.images.<name>` for a dict), `action`, `next.reward`,
  `next.discount` (RLDS's discount), the other step fields as
  `complementary_info.<path>`, and LeRobot's `timestamp` (`frame_index /
  fps`), `frame_index`, `episode_index`, `index`, `task_index`;
* `next.done` is set on the last frame of an episode whose final step has
  `is_terminal` (a termination); `next.truncated` on the last frame of one
  that ended without it (time limit, or cut short by the recorder);
* the RLDS final step (the last observation, which has no action) is not a
  frame: its values go to `meta/episodes` as `final/<column>` columns, and
  the episode fields as `rlds/<path>` columns, so `convert --from lerobot`
  gives the RLDS dataset back;
* uint8 `Image` fields are LeRobot `image` features (PNG in the Parquet
  files, which LeRobot loads without video decoding), or with `video=True`
  MP4 `video` features (`rlds_writer.interop.lerobot_video`; lossy);
* the task text: a Text step or episode field (`task_field`), else a constant.

Streaming: one decoded episode at a time; frames are appended to the open
data file, which is closed and the next one begun (`chunk-XXX/file-YYY`) when
it would pass `data_files_size_in_mb`, as LeRobot does.
"""

from __future__ import annotations

import json
import os
import shutil
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
    value_at,
)
from rlds_writer.interop.formats.lerobot import layout
from rlds_writer.interop.formats.lerobot import stats as stats_lib
from rlds_writer.interop.formats.lerobot.video import VideoStreams, eligible, meta_types
from rlds_writer.read.decode import flatten
from rlds_writer.store import names
from rlds_writer.store.layout import jsonable


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
        names = sorted("/".join(p) for p in texts) or ["none"]
        raise ValueError(
            f"task_field {task_field!r}: no Text step or episode field of that name; the "
            f"dataset's text fields are {names} (or leave it out for a constant task)"
        )
    return texts[path], "/".join(path)


def _episode_columns(reader: Any) -> list[dict[str, Any]]:
    """The episode fields, as columns of meta/episodes (`rlds/<path>`)."""
    out = []
    for leaf in reader.features.episode_leaves:
        if not leaf.static or (leaf.dtype == np.object_ and leaf.shape):
            raise SpecError(f"{leaf.key}: {leaf.describe()} cannot be kept in meta/episodes")
        kind = "string" if leaf.dtype == np.object_ else "numeric"
        if leaf.kind == "image" and leaf.dtype == np.uint8:
            kind = "image"
        shape = tuple(int(d) for d in leaf.shape)
        out.append({"path": list(leaf.path), "kind": kind, "dtype": leaf.dtype, "shape": shape})
    return out


@needs_libraries("lerobot")
def export(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    split: str = "train",
    cut_short: str = "truncated",
    fps: int | None = None,
    task: str | None = None,
    task_field: str | None = None,
    robot_type: str | None = None,
    video: bool = False,
    video_codec: str = "h264",
    data_files_size_in_mb: float = layout.DATA_FILE_SIZE_MB,
    chunks_size: int = layout.CHUNKS_SIZE,
    progress: bool = False,
) -> ExportReport:
    """Exports an RLDS dataset as a LeRobot v3.0 dataset directory (see the module doc).

    Args:
      src: the RLDS dataset directory.
      dest: the directory to write (created; must not hold files); open it with
        `LeRobotDataset(repo_id, root=dest)`.
      split: the split to export (TFDS split syntax).
      cut_short: "truncated" (default) exports episodes the recorder cut short
        as truncated; "drop" leaves them out.
      fps: frames per second (LeRobot's `fps`, an int); default the `fps` of
        the dataset's `metadata.json`, else 10.
      task: the constant task text (default: the env id, else the dataset name).
      task_field: a Text step field (one task per frame, e.g.
        `language_instruction`) or episode field giving the task instead.
      robot_type: LeRobot's `robot_type` (default none).
      video: store RGB images of even height and width as MP4 videos (LeRobot
        `video` features, lossy; needs PyAV) instead of PNG `image` features.
      video_codec: "h264" (default) or "libsvtav1" (LeRobot's own default).
      data_files_size_in_mb: size at which a data file is closed and the next begun.
      chunks_size: files per `chunk-XXX` directory.
      progress: show a tqdm progress bar.

    Returns:
      The `ExportReport`.

    Raises:
      FileExistsError: if `dest` holds files.
      ValueError: for an unknown split, task field or a bad option.
      UnsupportedFeatureError: (a NotImplementedError) for `video=True` without PyAV.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tqdm import tqdm

    check_cut_short(cut_short)
    if data_files_size_in_mb <= 0 or chunks_size < 1:
        raise ValueError(
            f"data_files_size_in_mb must be positive and chunks_size at least 1, got "
            f"{data_files_size_in_mb} and {chunks_size}"
        )
    directory = new_output_directory(dest)
    reader = open_source(src, split)
    try:
        metadata = reader.metadata or {}
        fps = fps if fps is not None else metadata.get("fps", 10)
        if isinstance(fps, float) and fps.is_integer():
            fps = int(fps)
        if isinstance(fps, bool) or not isinstance(fps, int | np.integer) or fps <= 0:
            raise ValueError(
                f"fps must be a positive integer (LeRobot's fps), got {fps!r}; pass --fps"
            )
        fps = int(fps)
        task_where, task_path = _task_source(reader, task_field)
        constant_task = task or str(metadata.get("env_id") or reader.name)
        columns = layout.columns_of(reader, skip=(task_path,) if task_where == "step" else ())
        final_columns = layout.columns_of(reader)
        episode_columns = _episode_columns(reader)

        cameras = {
            c.key: c.shape for c in columns if video and c.kind == "image" and eligible(c.shape)
        }
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
        features = {c.key: c.feature() for c in columns}
        features[layout.DONE] = {"dtype": "bool", "shape": [1], "names": None}
        features[layout.TRUNCATED] = {"dtype": "bool", "shape": [1], "names": None}
        features.update(layout.DEFAULT_FEATURES)
        data_kinds = {c.key: (c.kind, c.dtype, c.shape) for c in columns if c.key not in cameras}
        data_kinds[layout.DONE] = data_kinds[layout.TRUNCATED] = ("numeric", np.dtype(bool), ())
        data_kinds["timestamp"] = ("numeric", np.dtype(np.float32), ())
        for key in ("frame_index", "episode_index", "index", "task_index"):
            data_kinds[key] = ("numeric", np.dtype(np.int64), ())
        data_schema = pa.schema(
            [(k, layout.arrow_type(*v)) for k, v in data_kinds.items()],
            metadata={
                "huggingface": json.dumps(
                    {
                        "info": {
                            "features": {k: layout.hf_feature(*v) for k, v in data_kinds.items()}
                        }
                    }
                )
            },
        )
        stat_keys = {k: v for k, v in data_kinds.items() if v[0] != "string"}
        stat_keys.update({k: ("image", np.dtype(np.uint8), shape) for k, shape in cameras.items()})
        meta_fields: list[tuple[str, Any]] = [
            ("episode_index", pa.int64()),
            ("tasks", pa.list_(pa.string())),
            ("length", pa.int64()),
            ("data/chunk_index", pa.int64()),
            ("data/file_index", pa.int64()),
            ("dataset_from_index", pa.int64()),
            ("dataset_to_index", pa.int64()),
            ("meta/episodes/chunk_index", pa.int64()),
            ("meta/episodes/file_index", pa.int64()),
        ]
        shapes = {k: stats_lib.stats_shape(v[0], v[2]) for k, v in stat_keys.items()}
        meta_fields += list(stats_lib.arrow_types(shapes).items())
        for field in episode_columns:
            name = layout.EPISODE_PREFIX + "/".join(field["path"])
            meta_fields.append(
                (name, layout.meta_type(field["kind"], field["dtype"], field["shape"]))
            )
        for c in final_columns:
            meta_fields.append(
                (layout.FINAL_PREFIX + c.key, layout.meta_type(c.kind, c.dtype, c.shape))
            )
        meta_schema = pa.schema(meta_fields + meta_types(list(cameras)))

        videos = None
        if cameras:
            size = layout.VIDEO_FILE_SIZE_MB
            videos = VideoStreams(directory, cameras, fps, size, chunks_size, video_codec)
            for key in cameras:
                features[key] = {**features[key], "dtype": "video", "info": videos.info(key)}
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        report = ExportReport(source=os.fspath(src), destination=os.fspath(dest), format="lerobot")
        data = layout.RollingParquet(
            directory, layout.DATA_PATH, data_schema, data_files_size_in_mb, chunks_size
        )
        episodes_file = layout.RollingParquet(
            directory, layout.EPISODES_PATH, meta_schema, data_files_size_in_mb, chunks_size
        )
        tasks: dict[str, int] = {}
        totals = stats_lib.Aggregate()
        index = 0
        try:
            episodes = source_episodes(reader, split, report, cut_short=cut_short)
            for episode, _ in tqdm(episodes, desc="export", unit="ep", disable=not progress):
                steps = episode["steps"]
                n = len(steps["is_last"])
                frames = n - 1
                terminated = bool(steps["is_terminal"][-1])
                if task_where == "step":
                    texts = [layout.text_of(v) for v in value_at(steps, task_path.split("/"))]
                elif task_where == "episode":
                    texts = [layout.text_of(value_at(episode, task_path.split("/")))] * n
                else:
                    texts = [constant_task] * n
                for text in texts[:frames]:
                    tasks.setdefault(text, len(tasks))
                values: dict[str, Any] = {c.key: value_at(steps, c.path)[:frames] for c in columns}
                done = np.zeros(frames, bool)
                truncated = np.zeros(frames, bool)
                (done if terminated else truncated)[-1] = True
                values[layout.DONE], values[layout.TRUNCATED] = done, truncated
                values["frame_index"] = np.arange(frames, dtype=np.int64)
                values["timestamp"] = (values["frame_index"] / fps).astype(np.float32)
                values["episode_index"] = np.full(frames, report.episodes, np.int64)
                values["index"] = np.arange(index, index + frames, dtype=np.int64)
                values["task_index"] = np.array([tasks[t] for t in texts[:frames]], np.int64)
                table = pa.table(
                    {k: layout.arrow_column(*data_kinds[k], values[k]) for k in data_kinds},
                )
                chunk, file = data.write(table)
                episode_stats = {
                    k: stats_lib.feature_stats(values[k], v[0] == "image")
                    for k, v in stat_keys.items()
                }
                totals.add(episode_stats)
                row: dict[str, Any] = {
                    "episode_index": report.episodes,
                    "tasks": list(dict.fromkeys(texts[:frames])),
                    "length": frames,
                    "data/chunk_index": chunk,
                    "data/file_index": file,
                    "dataset_from_index": index,
                    "dataset_to_index": index + frames,
                }
                row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = (
                    episodes_file.target(1)
                )
                row.update(stats_lib.flat_columns(episode_stats))
                for key in cameras:
                    row.update(videos.write(key, values[key]))
                fields = dict(flatten(episode_metadata(episode)))
                for field in episode_columns:
                    value = fields[tuple(field["path"])]
                    row[layout.EPISODE_PREFIX + "/".join(field["path"])] = layout.meta_value(
                        field["kind"], value
                    )
                for c in final_columns:
                    value = value_at(steps, c.path)[-1]
                    row[layout.FINAL_PREFIX + c.key] = layout.meta_value(c.kind, value)
                episodes_file.write(pa.Table.from_pylist([row], meta_schema))
                index += frames
                report.episodes += 1
                report.transitions += frames
                if terminated:
                    report.terminated += 1
                else:
                    report.truncated += 1
            data.close()
            episodes_file.close()
            if videos is not None:
                videos.close()
            if not report.episodes:
                raise ValueError(f"{src}: no episode to export (split {split!r})")
            import pandas as pd

            frame = pd.DataFrame(
                {"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task")
            )
            pq.write_table(pa.Table.from_pandas(frame), directory / layout.TASKS_PATH)
            info = {
                "codebase_version": layout.CODEBASE_VERSION,
                "robot_type": robot_type,
                "total_episodes": report.episodes,
                "total_frames": report.transitions,
                "total_tasks": len(tasks),
                "chunks_size": chunks_size,
                "data_files_size_in_mb": data_files_size_in_mb,
                "video_files_size_in_mb": layout.VIDEO_FILE_SIZE_MB,
                "fps": fps,
                "splits": {"train": f"0:{report.episodes}"},
                "data_path": layout.DATA_PATH,
                "video_path": layout.VIDEO_PATH if cameras else None,
                "features": features,
            }
            layout.write_json(directory / layout.INFO_PATH, info)
            layout.write_json(directory / layout.STATS_PATH, totals.result())
            mapping = {
                "format": 1,
                "name": reader.name,
                "columns": [c.to_json() for c in final_columns],
                "frame_columns": [c.key for c in columns if c.key not in cameras],
                "video_columns": list(cameras),
                "task": {"where": task_where, "path": task_path},
                "episode_fields": [
                    {**f, "dtype": "string" if f["kind"] == "string" else f["dtype"].name}
                    for f in episode_columns
                ],
                "metadata": jsonable(metadata),
            }
            layout.write_json(directory / layout.MAPPING_PATH, mapping)
        except BaseException:
            data.close()
            episodes_file.close()
            if videos is not None:
                videos.close()
            if created:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        if video:
            kept = [c.key for c in columns if c.kind == "image" and c.key not in cameras]
            report.notes.append(
                f"video: {len(cameras)} cameras as MP4 {sorted(cameras)}"
                + (
                    f"; kept as PNG images (not RGB of even height and width): {kept}"
                    if kept
                    else ""
                )
            )
        report.notes.append(
            f"load it with LeRobotDataset({reader.name!r}, root={os.fspath(dest)!r}) (fps {fps})"
        )
        return report
    finally:
        reader.close()
