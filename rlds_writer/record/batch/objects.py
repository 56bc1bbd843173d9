"""Text and other TFDS-encoded step fields of a batch: one Python value per sub-env.

A Gymnasium `Text` observation space (or a `Sequence`, or any feature TFDS
encodes itself: `FALLBACK`) has no array form: its batch is a tuple of `N`
values. For those fields only, the ring (`ring.py`) keeps an object column
`[L, N]`, each value checked and cast at the step exactly as the single-env
recorder's list column does (`record.values.cast_value`), so an episode's
list of values, and its record, are what `RecordRLDS` writes for that sub-env
alone. Every other field of the step stays a numeric column.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record.batch.ring import BatchField
from rlds_writer.record.values import cast_value, describe
from rlds_writer.store.features import field_specs

KINDS = (field_specs.TEXT, field_specs.FALLBACK)


class _ObjectSpec:
    """What the ring needs of a field spec, for a column of Python values."""

    __slots__ = ("key", "shape", "dtype", "row_nbytes")

    def __init__(self, key: str):
        self.key = key
        self.shape = ()
        self.dtype = np.dtype(object)
        self.row_nbytes = 64  # a reference and a short value, for the ring's size


def ring_field(field: BatchField) -> BatchField:
    """The ring's object column for a text or fallback field."""
    zero = None
    if field.zero is not None:  # a 0-d holder: the ring's assignments store the value itself
        zero = np.empty((), object)
        zero[()] = field.zero
    return BatchField(_ObjectSpec(field.key), field.role, zero)  # type: ignore[arg-type]


def value_batch(spec: field_specs.FieldSpec, value: Any, n: int) -> np.ndarray:
    """A batch of `n` values of a text or fallback field, each cast as the single-env recorder does.

    Raises:
      StepValueError: naming the field, for a batch of another size or a bad value.
    """
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise StepValueError(
            spec.key,
            f"expected a batch of {n} values (one per sub-env) of {spec.describe()}, "
            f"got {describe(value)}",
        )
    items = list(value)
    if len(items) != n:
        raise StepValueError(
            spec.key,
            f"expected a batch of {n} values (one per sub-env) of {spec.describe()}, "
            f"got {len(items)}",
        )
    out = np.empty(n, object)
    for j, item in enumerate(items):
        out[j] = cast_value(spec, item)
    return out


def one_value(spec: field_specs.FieldSpec, value: Any) -> Any:
    """One sub-env's value (`BatchRecorder.replace`), cast as in a batch."""
    return cast_value(spec, value)


def as_lists(columns: dict[str, Any], keys: list[str]) -> None:
    """An episode's object columns as the lists the encoder takes, in place."""
    for key in keys:
        columns[key] = columns[key].tolist()
