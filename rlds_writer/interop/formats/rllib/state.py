"""RLlib's episode items decoded as data: msgpack without pickle, states without RLlib.

An item of RLlib's episode Parquet is
`msgpack.packb(SingleAgentEpisode.get_state(), default=msgpack_numpy.encode)`.
Decoding it with `msgpack_numpy.decode` unpickles arrays of dtype object, and
`SingleAgentEpisode.from_state` reads the spaces with
`np.load(..., allow_pickle=True)`: a crafted file would run code either way.
So here:

* `decode_item` unpacks msgpack with an object hook that builds only numeric,
  bool and string numpy arrays and scalars (msgpack-numpy's `nd` maps) and
  refuses every other array (object, structured, datetime) with
  `SourceError` (the caller adds the file, column and row); nothing is unpickled;
* `episode_arrays` reads a state's lookback buffers (`data`, `lookback`,
  `finalized`) itself, as `InfiniteLookbackBuffer.get` would;
* `space_text` rebuilds the spaces RLlib serialised (`gym_space_to_dict`),
  with `np.load(allow_pickle=False)` for `Box` bounds, and returns their text.
"""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import SourceError

# Array kinds an item may hold: bool, integers, floats, complex, bytes, str.
_SAFE_KINDS = "biufcSU"
# A space's packed Box bounds may not inflate beyond this.
_MAX_BOUNDS_BYTES = 64 << 20


def _dtype(descr: Any) -> np.dtype:
    if isinstance(descr, bytes):
        descr = descr.decode("ascii", "replace")
    if not isinstance(descr, str):
        raise SourceError(f"an array with a structured dtype description ({descr!r:.60})")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError):
        raise SourceError(f"an array of unknown dtype {descr!r:.60}") from None
    if dtype.kind not in _SAFE_KINDS or dtype.hasobject or dtype.itemsize == 0:
        raise SourceError(f"an array of dtype {dtype.str!r} (only numeric, bool and text)")
    return dtype


def _object_hook(obj: dict[Any, Any]) -> Any:
    """msgpack-numpy's arrays and scalars, numeric, bool and string only."""
    if b"nd" in obj:
        kind = obj.get(b"kind", b"")
        if kind == b"O":
            raise SourceError(
                "an array of dtype object (msgpack-numpy stores it pickled; pickles are not read)"
            )
        if kind not in (b"", ""):
            raise SourceError(f"an array of kind {kind!r:.20} (only numeric, bool and text)")
        dtype = _dtype(obj.get(b"type"))
        data = obj.get(b"data")
        if not isinstance(data, bytes):
            raise SourceError("an array whose data is not bytes")
        if obj[b"nd"] is True:
            shape = obj.get(b"shape")
            if not isinstance(shape, list | tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise SourceError(f"an array of shape {shape!r:.60}")
            if int(np.prod(shape, dtype=object)) * dtype.itemsize != len(data):
                raise SourceError(f"an array of shape {tuple(shape)} with {len(data)} bytes")
            array = np.frombuffer(data, dtype).reshape(shape)
        elif obj[b"nd"] is False:
            if len(data) != dtype.itemsize:
                raise SourceError(f"a {dtype} scalar of {len(data)} bytes")
            array = np.frombuffer(data, dtype)
        else:
            raise SourceError(f"an array marker {obj[b'nd']!r:.20}")
        if not dtype.isnative:
            array = array.astype(dtype.newbyteorder("="))
        return array if obj[b"nd"] is True else array[0]
    if b"complex" in obj:
        data = obj.get(b"data")
        try:
            return complex(data.decode("ascii") if isinstance(data, bytes) else data)
        except (TypeError, ValueError, UnicodeDecodeError):
            raise SourceError(f"a complex number {data!r:.40}") from None
    return obj


def decode_item(item: bytes) -> Any:
    """Unpacks one episode item; no pickle, no code.

    Raises:
      SourceError: for an array the decoder refuses, or bytes that are not
        one msgpack value.
    """
    import msgpack

    if not isinstance(item, bytes):
        raise SourceError(f"expected bytes, got {type(item).__name__}")
    try:
        return msgpack.unpackb(item, object_hook=_object_hook, strict_map_key=False)
    except SourceError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as e:
        raise SourceError(f"not a msgpack value ({type(e).__name__}: {e})"[:300]) from None


def _rows(values: list[Any]) -> Any:
    """Per-step values (arrays, numbers, dicts, lists as tuples) as a nest of columns."""
    if values and all(isinstance(v, Mapping) for v in values):
        keys = list(values[0])
        if any(list(v) != keys for v in values):
            raise SourceError("dict values with different keys across steps")
        return {str(k): _rows([v[k] for v in values]) for k in keys}
    if values and all(isinstance(v, list) for v in values):
        if all(np.ndim(x) == 0 and not isinstance(x, Mapping | list) for v in values for x in v):
            return _stack(values)
        n = len(values[0])
        if any(len(v) != n for v in values):
            raise SourceError("tuple values of different lengths across steps")
        return {str(i): _rows([v[i] for v in values]) for i in range(n)}
    return _stack(values)


def _stack(values: list[Any]) -> np.ndarray:
    try:
        out = np.asarray(values)
    except (ValueError, TypeError, OverflowError) as e:
        raise SourceError(f"values of different shapes across steps ({e})"[:200]) from None
    if out.dtype.kind not in _SAFE_KINDS:
        raise SourceError(f"values of mixed types across steps (dtype {out.dtype})")
    return out


def _batched(data: Any, start: int) -> Any:
    """A finalized buffer: arrays (a dict or list of them for dicts and tuples) from `start`."""
    if isinstance(data, Mapping):
        return {str(k): _batched(v, start) for k, v in data.items()}
    if isinstance(data, list):
        return {str(i): _batched(v, start) for i, v in enumerate(data)}
    return _stack(data[start:] if np.ndim(data) else [data][start:])


def buffer_values(state: Any, name: str, rows: bool = False) -> Any:
    """The values of one `InfiniteLookbackBuffer` state after its lookback.

    Args:
      state: the buffer's state (`data`, `lookback`, `finalized`).
      name: the buffer's name, for messages.
      rows: return the per-step list (infos) instead of a nest of columns.
    """
    if not isinstance(state, Mapping) or "data" not in state:
        raise SourceError(f"{name}: not a buffer state")
    data, lookback = state["data"], state.get("lookback", 0)
    if not isinstance(lookback, int) or isinstance(lookback, bool) or lookback < 0:
        raise SourceError(f"{name}: lookback {lookback!r:.40}")
    if state.get("finalized") and not isinstance(data, list):
        if rows:
            raise SourceError(f"{name}: a finalized buffer where a list was expected")
        return _batched(data, lookback)
    if not isinstance(data, list):
        raise SourceError(f"{name}: data of type {type(data).__name__}")
    values = data[lookback:]
    return values if rows else _rows(values)


def length(tree: Any) -> int:
    """The number of rows of a nest of columns."""
    while isinstance(tree, Mapping):
        if not tree:
            return 0
        tree = next(iter(tree.values()))
    return len(tree)


def space_text(d: Any) -> str | None:
    """The text (`str(space)`) of a space RLlib serialised with `gym_space_to_dict`.

    Returns None for a missing or unreadable space (it is then not recorded).

    Raises:
      SourceError: for bounds stored as a pickled (object) array.
    """
    try:
        space = _space(d, 0)
    except SourceError:
        raise
    except (ValueError, TypeError, KeyError, AssertionError, OSError, zlib.error):
        return None
    return None if space is None else str(space)


def _bounds(text: Any) -> np.ndarray:
    raw = zlib.decompressobj().decompress(base64.b64decode(text), _MAX_BOUNDS_BYTES)
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise SourceError(
                "space bounds stored as a pickled object array (pickles are not read)"
            ) from None
        raise
    if array.dtype.kind not in "biuf":
        raise SourceError(f"space bounds of dtype {array.dtype} (only numbers)")
    return array


def _space(d: Any, depth: int) -> Any:
    from gymnasium import spaces

    if not isinstance(d, Mapping) or depth > 32:
        return None
    kind = d.get("space")
    dtype = _dtype(d["dtype"]) if "dtype" in d else None
    if kind == "box":
        return spaces.Box(_bounds(d["low"]), _bounds(d["high"]), tuple(d["shape"]), dtype)
    if kind == "discrete":
        return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
    if kind == "multi-discrete":
        return spaces.MultiDiscrete(_bounds(d["nvec"]), dtype=dtype or np.int64)
    if kind == "multi-binary":
        return spaces.MultiBinary(d["n"])
    if kind == "dict":
        return spaces.Dict({str(k): _space(v, depth + 1) for k, v in d["spaces"].items()})
    if kind == "tuple":
        return spaces.Tuple([_space(v, depth + 1) for v in d["spaces"]])
    return None
