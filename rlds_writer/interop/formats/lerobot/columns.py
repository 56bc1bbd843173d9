"""LeRobot columns of RLDS fields: which field each column holds and its Arrow/`datasets` types.

Frame columns (`data/...parquet`) hold the step fields, one row per frame;
meta/episodes columns hold the episode fields and the RLDS final step. A
feature of shape `(1,)` is a scalar column, `(n,)` a fixed-size list, higher
ranks `ArrayND` storage (nested lists), `image` a struct of PNG `bytes` and
`path` (what Hugging Face `datasets` calls `Image`). Used both ways: the
exporter writes with `arrow_column`, the importer reads back with
`column_values`.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.interop.formats.lerobot.layout import DEFAULT_FEATURES, DONE, TRUNCATED
from rlds_writer.store.images.image_codecs import encode_png


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
        image = leaf.is_image and leaf.dtype == np.uint8
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
