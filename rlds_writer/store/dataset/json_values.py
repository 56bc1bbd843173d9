"""Values as JSON: metadata made JSON-safe, dataset_info.json's text, and JSON diffs.

`jsonable` turns any metadata value (numpy scalars and arrays, dm_env specs,
bytes, types) into plain JSON types, never raising; `dumps_info` is how
dataset_info.json is written; `json_diff` names where two JSON documents
(e.g. two features.json) differ, for one-line errors.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

_MISSING = "<missing>"


def json_diff(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Lists (path, value in a, value in b) where two JSON values (e.g. features.json) differ.

    A key present on one side only shows `<missing>` on the other.
    """
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in sorted(set(a) | set(b)):
            sub = f"{path}/{key}" if path else str(key)
            out.extend(json_diff(a.get(key, _MISSING), b.get(key, _MISSING), sub))
        return out
    return [] if a == b else [(path, a, b)]


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
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type):
        return np.dtype(value).name if _is_dtype_like(value) else value.__name__
    spec = _spec_to_dict(value)
    if spec is not None:
        return spec
    # Mappings last: the Mapping ABC's first check of a type walks every
    # Mapping subclass loaded (0.1-0.25 ms per type with TFDS imported).
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return repr(value)


def _is_dtype_like(value: Any) -> bool:
    try:
        np.dtype(value)
        return True
    except TypeError:
        return False


def _spec_to_dict(value: Any) -> dict[str, Any] | None:
    """Describes a dm_env spec (Array, BoundedArray, DiscreteArray, StringArray)."""
    # A value can be a spec only once dm_env is loaded; importing it here
    # would cost a recording's metadata 0.5-1 ms for nothing.
    specs = sys.modules.get("dm_env.specs")
    if specs is None or not isinstance(value, specs.Array):
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
