"""Metadata made JSON-safe: every kind of value becomes plain JSON, nothing raises."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
from dm_env import specs

from rlds_writer.store.dataset.json_values import jsonable


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


def test_metadata_values_of_every_kind_become_plain_json():
    value = {
        "read_only_mapping": types.MappingProxyType({"inner": (1, np.float32(2.5))}),
        "spec": specs.BoundedArray((2,), np.float32, 0.0, 1.0, name="obs"),
        "discrete": specs.DiscreteArray(3),
        "dtype_class": np.int64,
        "dtype": np.dtype("uint8"),
        "set": {3},
        "array": np.arange(3, dtype=np.int16),
        "bytes": b"caf\xc3\xa9",
        "nan": float("nan"),
        "other": _Opaque(),
        7: None,
    }
    out = jsonable(value)
    assert out == {
        "read_only_mapping": {"inner": [1, 2.5]},
        "spec": {
            "spec": "BoundedArray",
            "shape": [2],
            "dtype": "float32",
            "name": "obs",
            "minimum": 0.0,
            "maximum": 1.0,
        },
        "discrete": {
            "spec": "DiscreteArray",
            "shape": [],
            "dtype": "int32",
            "name": None,
            "minimum": 0,
            "maximum": 2,
            "num_values": 3,
        },
        "dtype_class": "int64",
        "dtype": "uint8",
        "set": [3],
        "array": [0, 1, 2],
        "bytes": "café",
        "nan": "nan",
        "other": "<opaque>",
        "7": None,
    }
    json.dumps(out, allow_nan=False)


def test_metadata_is_made_json_safe_without_importing_dm_env():
    # Only a loaded dm_env can have made a spec; importing it to rule one out
    # cost every Gymnasium recording's creation 0.5-1 ms.
    code = (
        "import sys\n"
        "from rlds_writer.store.dataset.json_values import jsonable\n"
        "assert 'dm_env' not in sys.modules, 'imported with the module'\n"
        "assert jsonable({'a': {'b': 1}, 'c': object}) == {'a': {'b': 1}, 'c': 'object'}\n"
        "print(sorted(m for m in sys.modules if m.startswith('dm_env')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
