"""RLDS to a LeRobot dataset (codebase_version "v3.0"), for `LeRobotDataset(repo_id, root=DEST)`.

Layout: `layout.py`, column types: `columns.py`, statistics: `stats.py`. The
export runs in three steps: `export_plan.plan` maps the features (every
refusal happens there, before the destination is made), `export_episodes`
writes each episode's frames and meta/episodes row, and `_write_meta` the
metadata files once all episodes are in. Mapping, for an episode of `n` RLDS
steps:

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
  MP4 `video` features (`video.py`; lossy);
* the task text: a Text step or episode field (`task_field`), else a constant.

Streaming: one decoded episode at a time; frames are appended to the open
data file, which is closed and the next one begun (`chunk-XXX/file-YYY`) when
it would pass `data_files_size_in_mb`, as LeRobot does.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.interop.export import (
    ExportReport,
    check_cut_short,
    needs_libraries,
    new_output_directory,
    open_source,
    source_episodes,
)
from rlds_writer.interop.formats.lerobot import export_plan, layout
from rlds_writer.interop.formats.lerobot.export_episodes import EpisodeFiles
from rlds_writer.store.dataset.json_values import jsonable


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
        fps = _fps(fps, reader.metadata or {})
        mapping = export_plan.plan(reader, task=task, task_field=task_field, video=video)
        created = not directory.exists()
        files = EpisodeFiles(
            directory,
            mapping,
            fps=fps,
            data_files_size_in_mb=data_files_size_in_mb,
            chunks_size=chunks_size,
            video_codec=video_codec,
        )
        directory.mkdir(parents=True, exist_ok=True)
        report = ExportReport(source=os.fspath(src), destination=os.fspath(dest), format="lerobot")
        try:
            episodes = source_episodes(reader, split, report, cut_short=cut_short)
            for episode, _ in tqdm(episodes, desc="export", unit="ep", disable=not progress):
                files.write(episode, report)
            files.close()
            if not report.episodes:
                raise ValueError(f"{src}: no episode to export (split {split!r})")
            _write_meta(
                directory,
                reader,
                mapping,
                files,
                report,
                fps=fps,
                robot_type=robot_type,
                chunks_size=chunks_size,
                data_files_size_in_mb=data_files_size_in_mb,
            )
        except BaseException:
            files.close()
            if created:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        if video:
            report.notes.append(_video_note(mapping))
        report.notes.append(
            f"load it with LeRobotDataset({reader.name!r}, root={os.fspath(dest)!r}) (fps {fps})"
        )
        return report
    finally:
        reader.close()


def _fps(fps: Any, metadata: dict[str, Any]) -> int:
    """LeRobot's fps (a positive int): the option, else the dataset's metadata, else 10."""
    fps = fps if fps is not None else metadata.get("fps", 10)
    if isinstance(fps, float) and fps.is_integer():
        fps = int(fps)
    if isinstance(fps, bool) or not isinstance(fps, int | np.integer) or fps <= 0:
        raise ValueError(f"fps must be a positive integer (LeRobot's fps), got {fps!r}; pass --fps")
    return int(fps)


def _write_meta(
    directory: Path,
    reader: Any,
    mapping: export_plan.Plan,
    files: EpisodeFiles,
    report: ExportReport,
    *,
    fps: int,
    robot_type: str | None,
    chunks_size: int,
    data_files_size_in_mb: float,
) -> None:
    """Writes meta/tasks.parquet, info.json, stats.json and our meta/rlds_writer.json."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    tasks = files.tasks
    frame = pd.DataFrame(
        {"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task")
    )
    pq.write_table(pa.Table.from_pandas(frame), directory / layout.TASKS_PATH)
    features = dict(mapping.features)
    for key in mapping.cameras:
        features[key] = {**features[key], "dtype": "video", "info": files.video_info(key)}
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
        "video_path": layout.VIDEO_PATH if mapping.cameras else None,
        "features": features,
    }
    layout.write_json(directory / layout.INFO_PATH, info)
    layout.write_json(directory / layout.STATS_PATH, files.totals.result())
    ours = {
        "format": 1,
        "name": reader.name,
        "columns": [c.to_json() for c in mapping.final_columns],
        "frame_columns": [c.key for c in mapping.columns if c.key not in mapping.cameras],
        "video_columns": list(mapping.cameras),
        "task": {"where": mapping.task_where, "path": mapping.task_path},
        "episode_fields": [
            {**f, "dtype": "string" if f["kind"] == "string" else f["dtype"].name}
            for f in mapping.episode_columns
        ],
        "metadata": jsonable(reader.metadata or {}),
    }
    layout.write_json(directory / layout.MAPPING_PATH, ours)


def _video_note(mapping: export_plan.Plan) -> str:
    cameras = mapping.cameras
    kept = [c.key for c in mapping.columns if c.kind == "image" and c.key not in cameras]
    note = f"video: {len(cameras)} cameras as MP4 {sorted(cameras)}"
    if kept:
        note += f"; kept as PNG images (not RGB of even height and width): {kept}"
    return note
