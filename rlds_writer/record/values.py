"""Checking and casting one recorded value the way TFDS would, with errors that name the field.

Every column of the episode buffer (`record.columns`) and the episode-level
metadata go through `cast_value`; what it refuses raises `StepValueError`
naming the field, what was expected and what arrived. A numpy array must
have the feature's exact dtype and shape; anything else goes through
`np.array(value, dtype)`, as TFDS's own encoder does. What a user's
`step_fn`/`episode_fn` returns is checked here too (`user_fn_result`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.store.features import field_specs

# A Python int is unbounded; int64 fields take this range.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def describe(value: Any) -> str:
    """Describes a received value as `dtype[shape]` or its Python type."""
    if value is None:
        return "None"
    if type(value) is int and value.bit_length() > 256:
        # Python refuses to print an int of more than 4,300 digits: never try.
        return f"int of {value.bit_length()} bits"
    if isinstance(value, np.ndarray | np.generic):
        dims = ",".join(str(d) for d in np.shape(value))
        return f"{value.dtype.name}[{dims}]"
    if isinstance(value, str | bytes):
        text = repr(value)
        return f"{type(value).__name__} {text[:40]}"
    if isinstance(value, Mapping):
        return f"dict with keys {sorted(map(str, value.keys()))}"
    if isinstance(value, list | tuple):
        try:
            arr = np.asarray(value)
            dims = ",".join(str(d) for d in arr.shape)
            return f"{type(value).__name__} of {arr.dtype.name}[{dims}]"
        except Exception:  # noqa: BLE001
            return type(value).__name__
    return f"{type(value).__name__} {value!r}"[:80]


def cast_value(field: field_specs.FieldSpec, value: Any) -> Any:
    """Validates one value for a field and casts it the way TFDS would.

    Args:
      field: the leaf field.
      value: the value given by the user for one step (or for the episode).

    Returns:
      A numpy array of the field's dtype and shape (fast-path numeric kinds),
      the str/bytes value (text), or the value itself (fallback kinds).

    Raises:
      StepValueError: naming the field, what was expected and what arrived.
    """
    kind = field.kind
    if value is None:
        raise StepValueError(field.key, f"expected {field.describe()}, got None")
    if kind == field_specs.TEXT:
        if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "SUO":
            value = value.item()
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            # Encoded here, at the step: text that is no UTF-8 (a lone surrogate)
            # must fail now, not later in the writer thread.
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise StepValueError(
                    field.key,
                    f"expected UTF-8 text, got {describe(value)} ({e.reason} at {e.start})",
                ) from None
        raise StepValueError(field.key, f"expected {field.describe()}, got {describe(value)}")
    if kind in (field_specs.FALLBACK, field_specs.PNG, field_specs.JPEG):
        return check_fallback(field, value)
    dtype = field.dtype
    if isinstance(value, np.ndarray):
        if value.dtype != dtype or value.shape != field.shape:
            raise StepValueError(field.key, f"expected {field.describe()}, got {describe(value)}")
        return value
    if dtype.kind == "b" and isinstance(value, str):
        raise StepValueError(
            field.key,
            f"expected {field.describe()}, got {describe(value)} (a string is not a bool)",
        )
    # A number first: the Mapping ABC's first check of a type is slow (~0.1 ms).
    if not isinstance(value, int | float) and isinstance(value, Mapping):
        raise StepValueError(field.key, f"expected {field.describe()}, got {describe(value)}")
    try:
        arr = np.array(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise StepValueError(
            field.key, f"expected {field.describe()}, got {describe(value)} ({e})"
        ) from None
    if arr.shape != field.shape:
        raise StepValueError(field.key, f"expected {field.describe()}, got {describe(value)}")
    return arr


def check_fallback(field: field_specs.FieldSpec, value: Any) -> Any:
    """Light check of a value for a feature that TFDS itself encodes."""
    if isinstance(value, np.ndarray):
        info = field.tfds_feature.get_tensor_info()
        if not isinstance(info, Mapping):
            shape = tuple(info.shape)
            ok_rank = len(shape) == value.ndim
            ok_dims = ok_rank and all(e is None or e == g for e, g in zip(shape, value.shape))
            dtype = np.dtype(info.np_dtype)
            ok_dtype = dtype.kind in "SUO" or value.dtype == dtype
            if not (ok_dims and ok_dtype):
                raise StepValueError(
                    field.key, f"expected {field.describe()}, got {describe(value)}"
                )
        return value.copy()
    return value


def user_fn_result(fn_name: str, result: Any, field: str) -> Mapping[str, Any] | None:
    """Returns what a user's `step_fn`/`episode_fn` gave, refusing anything but a dict or None.

    Args:
      fn_name: the option's name, for the message (`step_fn`, `episode_fn`).
      result: what the function returned.
      field: the feature path the values go to, for the message.
    """
    if result is None or isinstance(result, Mapping):
        return result
    raise StepValueError(
        field, f"{fn_name} must return a dict or None, got {type(result).__name__} {result!r:.60}"
    )
