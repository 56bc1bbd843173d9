"""LeRobot's dataset layout (codebase_version "v3.0", lerobot 0.4.x) and how RLDS fields map to it.

The on-disk facts, as LeRobot's own `lerobot.datasets` reads and writes them:

* `meta/info.json`: `codebase_version`, `robot_type`, `total_episodes`,
  `total_frames`, `total_tasks`, `chunks_size` (files per chunk directory),
  `data_files_size_in_mb`, `video_files_size_in_mb`, `fps` (an int), `splits`
  (`{"train": "0:N"}`), `data_path` and `video_path` templates, `features`
  (`{key: {"dtype", "shape", "names"}}`, with the five default features
  `timestamp`, `frame_index`, `episode_index`, `index`, `task_index`);
* `data/chunk-XXX/file-XXX.parquet`: one row per frame, one column per
  feature; episodes are contiguous, `index` is global and contiguous;
* `meta/episodes/chunk-XXX/file-XXX.parquet`: one row per episode with
  `episode_index`, `tasks`, `length`, `data/chunk_index`, `data/file_index`,
  `dataset_from_index`, `dataset_to_index`, `meta/episodes/chunk_index`,
  `meta/episodes/file_index` and `stats/<feature>/<stat>`;
* `meta/tasks.parquet`: a pandas frame indexed by the task text, column
  `task_index`; `meta/stats.json`: per feature `min`, `max`, `mean`, `std`,
  `count` and the quantiles `q01`, `q10`, `q50`, `q90`, `q99`.

How RLDS fields become columns, and their types: `columns.py`.

`meta/rlds_writer.json` is ours (LeRobot ignores it): which RLDS field each
column came from, so that `convert --from lerobot` restores the RLDS dataset.
"""

from __future__ import annotations

import json
import os
import re
import string
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import IncompatibleDatasetError
from rlds_writer.store.dataset import names

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
DATA_FILE_SIZE_MB = 100
VIDEO_FILE_SIZE_MB = 200
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE + ".parquet"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
MAPPING_PATH = "meta/rlds_writer.json"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
DONE, TRUNCATED = "next.done", "next.truncated"
# Prefixes of the extra columns of meta/episodes: episode fields and the final step.
EPISODE_PREFIX, FINAL_PREFIX = "rlds/", "final/"


_VIDEO_FIELDS = ("video_key", "chunk_index", "file_index")
# `{chunk_index:03d}`: an optional 0, a width of at most 2 digits, an optional d.
_INDEX_SPEC = re.compile(r"0?(\d{0,2})d?")
_MAX_INDEX_WIDTH = 20  # a 64-bit index has 20 digits; wider only pads (memory)


def check_video_path(template: Any, where: str) -> str:
    """Returns info.json's `video_path` template if it names files inside the dataset.

    The template may hold `{video_key}` (no format spec) and `{chunk_index}`,
    `{file_index}` with an integer spec of width at most 20 (a width is
    memory: `{chunk_index:0600000000d}` would be a 600 MB string); filled in,
    it must be a relative path of safe names (`store.dataset.names`): no absolute
    path, no `..`.

    Raises:
      IncompatibleDatasetError: naming the template and what is allowed.
    """
    fix = f"expected a relative template like {VIDEO_PATH!r}; fix {where}"
    if not isinstance(template, str) or len(template) > 1024:
        raise IncompatibleDatasetError(f"{where}: video_path {template!r:.100}: {fix}")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise IncompatibleDatasetError(f"{where}: video_path {template!r}: {e}; {fix}") from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        width = _INDEX_SPEC.fullmatch(spec or "")
        ok = (
            field in _VIDEO_FIELDS
            and not conversion
            and (
                not spec
                if field == "video_key"
                else width is not None and int(width.group(1) or 0) <= _MAX_INDEX_WIDTH
            )
        )
        if not ok:
            raise IncompatibleDatasetError(
                f"{where}: video_path {template!r}: field {{{field}"
                f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                f"(expected {{video_key}}, {{chunk_index}} and {{file_index}} with an integer "
                f"format of width at most {_MAX_INDEX_WIDTH}); {fix}"
            )
    sample = template.format(video_key="key", chunk_index=0, file_index=0)
    names.check_relative_path(
        sample,
        f"video_path {template!r}, filled in,",
        where=where,
        fix=fix,
        error=IncompatibleDatasetError,
    )
    return template


def video_file(root: Path, template: str, key: str, chunk: Any, file: Any) -> Path:
    """The path of camera `key`'s video file (`template` checked by `check_video_path`).

    Raises:
      IncompatibleDatasetError: for a key that is not a safe name or indexes
        that are not non-negative integers.
    """
    names.check_name(
        key,
        "video feature",
        where=str(root / INFO_PATH),
        fix="rename the feature",
        error=IncompatibleDatasetError,
    )
    for what, value in (("chunk_index", chunk), ("file_index", file)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise IncompatibleDatasetError(
                f"{root}/meta/episodes: videos/{key}/{what} {value!r}: expected a non-negative "
                "integer; fix the file"
            )
    return root / template.format(video_key=key, chunk_index=int(chunk), file_index=int(file))


def next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """The (chunk, file) after `(chunk, file)`: a chunk directory holds `chunks_size` files."""
    return (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)


# Rows are gathered into row groups of about this size: a row group per episode
# would keep every group's footer entry in memory and bloat the file (33 MB of
# footer for 1,000 one-row groups of per-episode statistics).
_ROW_GROUP_BYTES = 16 * 1024 * 1024
_ROW_GROUP_ROWS = 100_000


class RollingParquet:
    """Parquet files `<template>`, written in row groups of bounded size, a new file past a size."""

    def __init__(self, root: Path, template: str, schema: Any, limit_mb: float, chunks: int):
        self.root, self.template, self.schema = root, template, schema
        self.limit, self.chunks = limit_mb * 1024 * 1024, chunks
        self.chunk = self.file = 0
        self.writer: Any = None
        self.rows = 0
        self.pending: list[Any] = []
        self.pending_rows = 0
        self.pending_bytes = 0

    def _size(self) -> int:
        """Bytes of the current file: what is on disk plus the rows not yet written."""
        on_disk = os.path.getsize(self.path) if self.writer is not None else 0
        return on_disk + self.pending_bytes

    def target(self, num_rows: int) -> tuple[int, int]:
        """The (chunk, file) the next `num_rows` rows go to (a new file past the size limit)."""
        if self.writer is not None and self.rows:
            size = self._size()
            if size + size / self.rows * num_rows >= self.limit:
                self.close()
                self.chunk, self.file = next_file(self.chunk, self.file, self.chunks)
        return self.chunk, self.file

    def write(self, table: Any) -> tuple[int, int]:
        """Appends `table`; returns the (chunk, file) it went to."""
        import pyarrow.parquet as pq

        self.target(table.num_rows)
        if self.writer is None:
            self.path = self.root / self.template.format(
                chunk_index=self.chunk, file_index=self.file
            )
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.path, self.schema, compression="snappy")
            self.rows = 0
        table = table.cast(self.schema)
        self.pending.append(table)
        self.pending_rows += table.num_rows
        self.pending_bytes += table.nbytes
        self.rows += table.num_rows
        if self.pending_bytes >= _ROW_GROUP_BYTES or self.pending_rows >= _ROW_GROUP_ROWS:
            self._flush()
        return self.chunk, self.file

    def _flush(self) -> None:
        if self.pending:
            import pyarrow as pa

            self.writer.write_table(pa.concat_tables(self.pending))
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def close(self) -> None:
        if self.writer is not None:
            self._flush()
            self.writer.close()
            self.writer = None


def write_json(path: Any, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False))
