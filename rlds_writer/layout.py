"""The on-disk layout of a dataset directory, as TFDS's `SequentialWriter` makes it.

```
<data_directory>/
  dataset_info.json                       splits, shard lengths, format, version
  features.json                           the FeaturesDict
  metadata.json                           optional dataset-level metadata
  {name}-{split}.{tfrecord|array_record}-{00000}   one record per episode
```

`dataset_info.json` is always replaced atomically (write to a temporary file in
the same directory, then rename), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
METADATA = "metadata.json"
LOCK = ".rlds_writer.lock"
FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"
FILE_FORMATS = ("tfrecord", "array_record")


def shard_name(name: str, split: str, file_format: str, index: int) -> str:
    """Returns the file name of shard `index`, e.g. `catch-train.tfrecord-00003`."""
    return f"{name}-{split}.{file_format}-{index:05d}"


def shard_pattern(name: str, split: str, file_format: str) -> re.Pattern:
    return re.compile(
        rf"^{re.escape(name)}-{re.escape(split)}\.{re.escape(file_format)}-(\d{{5,}})$"
    )


def list_shard_files(
    path: epath.PathLike, name: str, split: str, file_format: str
) -> dict[int, epath.Path]:
    """Returns shard index -> path for the shard files present on disk."""
    pattern = shard_pattern(name, split, file_format)
    out = {}
    for child in epath.Path(path).iterdir():
        m = pattern.match(child.name)
        if m:
            out[int(m.group(1))] = child
    return dict(sorted(out.items()))


def is_local(path: epath.PathLike) -> bool:
    return "://" not in os.fspath(path)


def atomic_write_text(path: epath.PathLike, text: str, fsync: bool = False) -> None:
    """Replaces `path` with `text` so that readers see the old or the new file."""
    path = epath.Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if is_local(path):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    else:
        tmp.write_text(text)
        tmp.rename(path)


def read_json(path: epath.PathLike) -> Any:
    return json.loads(epath.Path(path).read_text())


def holds_dataset(path: epath.PathLike) -> bool:
    """True if the directory holds a dataset (info file or any shard file)."""
    path = epath.Path(path)
    if not path.exists():
        return False
    if (path / DATASET_INFO).exists():
        return True
    pattern = re.compile(r".+-.+\.(tfrecord|array_record)-\d{5,}$")
    return any(pattern.match(p.name) for p in path.iterdir())


def split_entry(split: str, shard_lengths: list[int], num_bytes: int) -> dict[str, Any]:
    """Returns one `splits` entry of dataset_info.json (int64s as strings)."""
    return {
        "filepathTemplate": FILEPATH_TEMPLATE,
        "name": split,
        "numBytes": str(int(num_bytes)),
        "shardLengths": [str(int(n)) for n in shard_lengths],
    }


def read_splits(info: Mapping[str, Any]) -> dict[str, tuple[list[int], int]]:
    """Returns split name -> (shard lengths, num bytes) from dataset_info.json."""
    out = {}
    for entry in info.get("splits", []):
        lengths = [int(n) for n in entry.get("shardLengths", [])]
        out[entry["name"]] = (lengths, int(entry.get("numBytes", 0)))
    return out


def with_splits(
    info: Mapping[str, Any], splits: Mapping[str, tuple[list[int], int]]
) -> dict[str, Any]:
    """Returns a copy of dataset_info.json's dict with the given splits."""
    out = dict(info)
    out["splits"] = [
        split_entry(name, lengths, nbytes) for name, (lengths, nbytes) in splits.items()
    ]
    return out


def dumps_info(info: Mapping[str, Any]) -> str:
    return json.dumps(info, indent=2, sort_keys=True)


def jsonable(value: Any) -> Any:
    """Turns a metadata value into plain JSON types, never raising.

    Numpy scalars and arrays become numbers and lists, tuples and sets become
    lists, dm_env specs become dicts describing them, bytes are decoded, and
    anything else unknown becomes its `repr`.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if np.isfinite(value) else repr(value)
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type):
        return np.dtype(value).name if _is_dtype_like(value) else value.__name__
    spec = _spec_to_dict(value)
    if spec is not None:
        return spec
    return repr(value)


def _is_dtype_like(value: Any) -> bool:
    try:
        np.dtype(value)
        return True
    except TypeError:
        return False


def _spec_to_dict(value: Any) -> dict[str, Any] | None:
    """Describes a dm_env spec (Array, BoundedArray, DiscreteArray, StringArray)."""
    try:
        from dm_env import specs
    except ImportError:  # pragma: no cover - dm_env is a core dependency
        return None
    if not isinstance(value, specs.Array):
        return None
    out: dict[str, Any] = {
        "spec": type(value).__name__,
        "shape": list(value.shape),
        "dtype": np.dtype(value.dtype).name if value.dtype is not None else None,
        "name": value.name,
    }
    if isinstance(value, specs.BoundedArray):
        out["minimum"] = jsonable(value.minimum)
        out["maximum"] = jsonable(value.maximum)
    if isinstance(value, specs.DiscreteArray):
        out["num_values"] = int(value.num_values)
    return out
