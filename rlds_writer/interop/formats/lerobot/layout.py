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

A feature of shape `(1,)` is a scalar column, `(n,)` a fixed-size list,
higher ranks `ArrayND` storage (nested lists), `image` a struct of PNG
`bytes` and `path` (what Hugging Face `datasets` calls `Image`).

`meta/rlds_writer.json` is ours (LeRobot ignores it): which RLDS field each
column came from, so that `convert --from lerobot` restores the RLDS dataset.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import string
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import IncompatibleDatasetError, SpecError
from rlds_writer.store import features as features_json
from rlds_writer.store import names
from rlds_writer.store.image_codecs import encode_png

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
    it must be a relative path of safe names (`store.names`): no absolute
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


@dataclasses.dataclass
class Column:
    """One LeRobot frame column and the RLDS step field it holds.

    Attributes:
      key: the LeRobot feature name (`observation.state`, `action`, ...).
      path: the RLDS path inside `steps` (`("observation", "pos")`).
      dtype: the numpy dtype (`object` for text).
      shape: the RLDS shape of one value.
      kind: "image" (uint8 PNG), "string" or "numeric".
    """

    key: str
    path: tuple[str, ...]
    dtype: np.dtype
    shape: tuple[int, ...]
    kind: str

    @property
    def lerobot_shape(self) -> list[int]:
        return list(self.shape) or [1]

    def feature(self) -> dict[str, Any]:
        """The `info.json` feature entry."""
        if self.kind == "image":
            names: Any = ["height", "width", "channels"]
            return {"dtype": "image", "shape": list(self.shape), "names": names}
        if self.kind == "string":
            return {"dtype": "string", "shape": [1], "names": None}
        names = (
            [f"{self.path[-1]}_{i}" for i in range(self.shape[0])] if len(self.shape) == 1 else None
        )
        return {"dtype": _dtype_name(self.dtype), "shape": self.lerobot_shape, "names": names}

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "path": list(self.path),
            "dtype": "string" if self.kind == "string" else self.dtype.name,
            "shape": list(self.shape),
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Column:
        dtype = np.dtype(object) if data["kind"] == "string" else np.dtype(data["dtype"])
        return cls(data["key"], tuple(data["path"]), dtype, tuple(data["shape"]), data["kind"])


def _dtype_name(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else dtype.name


def column_key(path: tuple[str, ...], image: bool) -> str:
    """The LeRobot name of the RLDS step field at `path` (inside `steps`).

    LeRobot's conventions: `observation.state` for an array observation,
    `observation.image` for an image one, `observation.<name>` and
    `observation.images.<name>` for the entries of a dict observation,
    `action`, `next.reward`; other step fields become
    `complementary_info.<path>` (LeRobot's name for per-frame extras).
    """
    name, rest = path[0], ".".join(path[1:])
    if name == "observation":
        if not rest:
            return "observation.image" if image else "observation.state"
        return f"observation.images.{rest}" if image else f"observation.{rest}"
    base = {"action": "action", "reward": "next.reward", "discount": "next.discount"}.get(name)
    if base is None:
        return "complementary_info." + ".".join(path)
    return f"{base}.{rest}" if rest else base


def columns_of(reader: Any, skip: tuple[str, ...] = ()) -> list[Column]:
    """The frame columns of an RLDS dataset, one per step leaf (flags and `skip` left out).

    Raises:
      SpecError: for a field LeRobot cannot hold (unknown shape, text arrays,
        more than 5 dimensions) or two fields with one name.
    """
    columns: list[Column] = []
    for leaf in reader.features.step_leaves:
        path = tuple(leaf.path[1:])
        if path[0] in ("is_first", "is_last", "is_terminal") or "/".join(path) in skip:
            continue
        if not leaf.static or len(leaf.shape) > 5:
            raise SpecError(f"{leaf.key}: {leaf.describe()} has no LeRobot feature (shape)")
        image = leaf.kind == features_json.IMAGE and leaf.dtype == np.uint8
        if leaf.dtype == np.object_:
            if leaf.shape:
                raise SpecError(f"{leaf.key}: {leaf.describe()} text arrays are not supported")
            kind = "string"
        else:
            kind = "image" if image else "numeric"
        shape = tuple(int(d) for d in leaf.shape)
        columns.append(Column(column_key(path, image), path, leaf.dtype, shape, kind))
    keys = [c.key for c in columns]
    reserved = set(DEFAULT_FEATURES) | {DONE, TRUNCATED}
    for c in columns:
        if keys.count(c.key) > 1 or c.key in reserved:
            raise SpecError(f"steps/{'/'.join(c.path)}: its LeRobot name {c.key!r} is taken")
    return columns


# ------------------------------------------------------------------ arrow


def arrow_type(kind: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """The Arrow type of a data column, as `datasets` stores the LeRobot feature."""
    import pyarrow as pa

    if kind == "image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    if kind == "string":
        return pa.string()
    value = pa.from_numpy_dtype(dtype)
    if len(shape) <= 1 and (not shape or shape[0] == 1):
        return value
    if len(shape) == 1:
        return pa.list_(value, shape[0])
    for _ in shape:
        value = pa.list_(value)
    return value


def hf_feature(kind: str, dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, Any]:
    """The `datasets` feature (its JSON form) LeRobot builds for a column."""
    if kind == "image":
        return {"_type": "Image"}
    name = "string" if kind == "string" else _dtype_name(dtype)
    value = {"dtype": name, "_type": "Value"}
    if len(shape) <= 1 and (not shape or shape[0] == 1):
        return value
    if len(shape) == 1:
        return {"feature": value, "length": shape[0], "_type": "List"}
    return {"shape": list(shape), "dtype": name, "_type": f"Array{len(shape)}D"}


def arrow_column(kind: str, dtype: np.dtype, shape: tuple[int, ...], values: Any) -> Any:
    """An Arrow array of `len(values)` rows for a column of the given type."""
    import pyarrow as pa

    if kind == "image":
        pngs = [encode_png(v) for v in values]
        return pa.array([{"bytes": b, "path": None} for b in pngs], arrow_type(kind, dtype, shape))
    if kind == "string":
        return pa.array([text_of(v) for v in values], pa.string())
    arr = np.ascontiguousarray(values, dtype=dtype)
    rows = arr.shape[0]
    flat = pa.array(arr.reshape(-1))
    if len(shape) <= 1 and (not shape or shape[0] == 1):
        return flat
    if len(shape) == 1:
        return pa.FixedSizeListArray.from_arrays(flat, shape[0])
    for size in reversed(shape):
        count = len(flat) // size
        flat = pa.ListArray.from_arrays(pa.array(np.arange(count + 1) * size, pa.int32()), flat)
    assert len(flat) == rows
    return flat


def column_values(kind: str, dtype: np.dtype, shape: tuple[int, ...], array: Any) -> Any:
    """The numpy values (text as a list of str) of an Arrow column written by `arrow_column`."""
    if kind == "image":
        return np.stack([decode_png(item) for item in array.to_pylist()])
    if kind == "string":
        return [v if v is not None else "" for v in array.to_pylist()]
    import pyarrow as pa

    rows = len(array)
    values = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    if isinstance(values.type, pa.ExtensionType):  # datasets' ArrayND, when registered
        values = values.storage
    while (
        pa.types.is_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
        or (pa.types.is_large_list(values.type))
    ):
        values = values.flatten()
    flat = np.asarray(values.to_numpy(zero_copy_only=False), dtype=dtype)
    return flat.reshape((rows, *shape))


def decode_png(item: Any) -> np.ndarray:
    """An image cell (`{"bytes", "path"}` or raw bytes) as a uint8 (H, W, C) array."""
    from PIL import Image

    data = item.get("bytes") if isinstance(item, dict) else item
    if data is None:
        raise SpecError(
            f"an image cell holds no bytes (path {item.get('path')!r}); embed the images"
        )
    arr = np.asarray(Image.open(io.BytesIO(data)))
    return arr[:, :, None] if arr.ndim == 2 else arr


def text_of(value: Any) -> str:
    """A Text value (bytes, str or a 0-d array of either) as str."""
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


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


def meta_type(kind: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """Arrow type of a value kept in meta/episodes: PNG bytes for images, lists for arrays."""
    import pyarrow as pa

    if kind == "image":
        return pa.binary()
    if kind == "string":
        return pa.string()
    value = pa.from_numpy_dtype(dtype)
    for _ in shape:
        value = pa.list_(value)
    return value


def meta_value(kind: str, value: Any) -> Any:
    if kind == "image":
        return encode_png(value)
    if kind == "string":
        return text_of(value)
    return np.asarray(value).tolist()


def write_json(path: Any, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, ensure_ascii=False))
