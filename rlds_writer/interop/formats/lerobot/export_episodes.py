"""Writing a LeRobot export's episodes: frames to the data files, one row each to meta/episodes.

`EpisodeFiles` holds the files open during an export (the rolling data and
meta/episodes Parquet files, the camera videos) and what runs across
episodes (the task index, the global frame index, the statistics); `write`
adds one decoded RLDS episode, streaming: nothing of it is kept afterwards
but its statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.interop.export import ExportReport, episode_metadata, value_at
from rlds_writer.interop.formats.lerobot import columns as columns_lib
from rlds_writer.interop.formats.lerobot import layout
from rlds_writer.interop.formats.lerobot import stats as stats_lib
from rlds_writer.interop.formats.lerobot.export_plan import Plan
from rlds_writer.interop.formats.lerobot.video import VideoStreams
from rlds_writer.read.nest import flatten


class EpisodeFiles:
    """The files of an export in progress and the state carried from episode to episode."""

    def __init__(
        self,
        directory: Path,
        plan: Plan,
        *,
        fps: int,
        data_files_size_in_mb: float,
        chunks_size: int,
        video_codec: str,
    ):
        self.plan, self.fps = plan, fps
        self.videos = None
        if plan.cameras:
            size = layout.VIDEO_FILE_SIZE_MB
            self.videos = VideoStreams(directory, plan.cameras, fps, size, chunks_size, video_codec)
        self.data = layout.RollingParquet(
            directory, layout.DATA_PATH, plan.data_schema, data_files_size_in_mb, chunks_size
        )
        self.episodes = layout.RollingParquet(
            directory, layout.EPISODES_PATH, plan.meta_schema, data_files_size_in_mb, chunks_size
        )
        self.tasks: dict[str, int] = {}  # task text -> task_index, in order of appearance
        self.totals = stats_lib.Aggregate()
        self.index = 0  # LeRobot's global frame index

    def video_info(self, key: str) -> dict[str, Any]:
        """`info.json`'s `info` of a camera's video feature."""
        assert self.videos is not None
        return self.videos.info(key)

    def write(self, episode: dict[str, Any], report: ExportReport) -> None:
        """Adds one decoded RLDS episode: its frames, statistics and meta/episodes row."""
        import pyarrow as pa

        steps = episode["steps"]
        frames = len(steps["is_last"]) - 1
        terminated = bool(steps["is_terminal"][-1])
        texts = self._task_texts(episode)[:frames]
        for text in texts:
            self.tasks.setdefault(text, len(self.tasks))
        values = self._frame_values(steps, frames, terminated, report.episodes, texts)
        kinds = self.plan.data_kinds
        chunk, file = self.data.write(
            pa.table({k: columns_lib.arrow_column(*kinds[k], values[k]) for k in kinds})
        )
        episode_stats = {
            k: stats_lib.feature_stats(values[k], v[0] == "image")
            for k, v in self.plan.stat_keys.items()
        }
        self.totals.add(episode_stats)
        row = self._episode_row(episode, values, texts, report.episodes, (chunk, file))
        row.update(stats_lib.flat_columns(episode_stats))
        self.episodes.write(pa.Table.from_pylist([row], self.plan.meta_schema))
        self.index += frames
        report.episodes += 1
        report.transitions += frames
        if terminated:
            report.terminated += 1
        else:
            report.truncated += 1

    def close(self) -> None:
        """Closes the files (the last data and meta/episodes files are written out)."""
        self.data.close()
        self.episodes.close()
        if self.videos is not None:
            self.videos.close()

    def _task_texts(self, episode: dict[str, Any]) -> list[str]:
        """The task text of each RLDS step."""
        steps, plan = episode["steps"], self.plan
        n = len(steps["is_last"])
        if plan.task_where is None or plan.task_path is None:
            return [plan.constant_task] * n
        path = plan.task_path.split("/")
        if plan.task_where == "step":
            return [columns_lib.text_of(v) for v in value_at(steps, path)]
        return [columns_lib.text_of(value_at(episode, path))] * n

    def _frame_values(
        self,
        steps: dict[str, Any],
        frames: int,
        terminated: bool,
        episode_index: int,
        texts: list[str],
    ) -> dict[str, Any]:
        """Every column of the episode's frames (one per transition), LeRobot's own included."""
        values: dict[str, Any] = {
            c.key: value_at(steps, c.path)[:frames] for c in self.plan.columns
        }
        done = np.zeros(frames, bool)
        truncated = np.zeros(frames, bool)
        (done if terminated else truncated)[-1] = True
        values[layout.DONE], values[layout.TRUNCATED] = done, truncated
        values["frame_index"] = np.arange(frames, dtype=np.int64)
        values["timestamp"] = (values["frame_index"] / self.fps).astype(np.float32)
        values["episode_index"] = np.full(frames, episode_index, np.int64)
        values["index"] = np.arange(self.index, self.index + frames, dtype=np.int64)
        values["task_index"] = np.array([self.tasks[t] for t in texts], np.int64)
        return values

    def _episode_row(
        self,
        episode: dict[str, Any],
        values: dict[str, Any],
        texts: list[str],
        episode_index: int,
        data_file: tuple[int, int],
    ) -> dict[str, Any]:
        """The episode's meta/episodes row (statistics apart): where its frames are, its videos,
        its episode fields (`rlds/<path>`) and its RLDS final step (`final/<column>`)."""
        frames = len(values["index"])
        row: dict[str, Any] = {
            "episode_index": episode_index,
            "tasks": list(dict.fromkeys(texts)),
            "length": frames,
            "data/chunk_index": data_file[0],
            "data/file_index": data_file[1],
            "dataset_from_index": self.index,
            "dataset_to_index": self.index + frames,
        }
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = self.episodes.target(1)
        for key in self.plan.cameras:
            assert self.videos is not None
            row.update(self.videos.write(key, values[key]))
        fields = dict(flatten(episode_metadata(episode)))
        for field in self.plan.episode_columns:
            value = fields[tuple(field["path"])]
            name = layout.EPISODE_PREFIX + "/".join(field["path"])
            row[name] = columns_lib.meta_value(field["kind"], value)
        for c in self.plan.final_columns:
            value = value_at(episode["steps"], c.path)[-1]
            row[layout.FINAL_PREFIX + c.key] = columns_lib.meta_value(c.kind, value)
        return row
