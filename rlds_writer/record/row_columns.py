"""Columns of small fixed-shape rows, and of values kept as they are.

A small array field (an observation vector) keeps one row of raw bytes per
step (or, where the C step is built, its rows end to end in one `RowBuffer`);
text, TFDS-encoded values and shapes that vary are kept in a list, checked
and cast by `cast_value` as they come (`ChecksItself`: the compiled step calls
their `append` as it is). `skip` is the append of a field the dataset lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rlds_writer.record import step_kernel
from rlds_writer.record.scalar_columns import PACKED_FLOAT
from rlds_writer.record.values import cast_value
from rlds_writer.store.episodes.episode_data import PackedColumn, RowBytes
from rlds_writer.store.features import field_specs

# Rows at least this large are copied into recycled buffers instead.
LARGE_ROW = 8192


class _ArrayColumn:
    """A fixed-shape tensor field with small rows: one row of raw bytes per step.

    `ndarray.tobytes()` copies a row (so envs may reuse their arrays) several
    times faster than numpy's row assignment or `copy()`, and joining the rows
    at episode end is one memcpy. Bytes-encoded fields are never joined: the
    encoder writes the rows as they are.
    """

    __slots__ = ("field", "shape", "dtype", "rows", "append")

    def __init__(self, field: field_specs.FieldSpec):
        self.field = field
        self.shape = field.shape
        self.dtype = field.dtype
        # Where the C step is built, numeric rows go end to end into one
        # growing buffer (no `bytes` per step, no join at the end); the rows
        # of a bytes-encoded field are written one by one, so they stay a list.
        row_buffer = step_kernel.row_buffer_type()
        if row_buffer is not None and field.kind != field_specs.BYTES:
            self.rows: Any = row_buffer(self.dtype.itemsize * math.prod(self.shape))
        else:
            self.rows = []
        self.append = self._make_append()

    def _make_append(self) -> Callable[[Any], None]:
        push = self.rows.append
        dtype, shape, field = self.dtype, self.shape, self.field
        ndarray = np.ndarray

        def append(value: Any) -> None:
            if type(value) is ndarray and value.dtype is dtype and value.shape == shape:
                push(value.tobytes())
            else:
                push(cast_value(field, value).tobytes())

        return append

    def inline_names(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": self.shape, "push": self.rows.append}

    def zero_append(self, zero: Any) -> tuple[Callable[[], int], Callable[[Any], None], Any]:
        """(size, push, value) that `EpisodeBuffer.finish` uses to add the final step's zero."""
        if type(zero) is np.ndarray and zero.dtype is self.dtype and zero.shape == self.shape:
            return self.rows.__len__, self.rows.append, zero.tobytes()  # what `append` stores
        return self.rows.__len__, self.append, zero

    def kernel_leaf(self) -> tuple:
        """The same test and append for the C step (`record.step_kernel`)."""
        nbytes = self.dtype.itemsize * math.prod(self.shape)
        return ("array", self.rows, None, False, self.dtype, tuple(self.shape), nbytes)

    def inline_source(self) -> tuple[str, str]:
        """The test and the append of `record.appender.compile_step_add` (same as `append`)."""
        test = "type({v}) is _ndarray and {v}.dtype is {dtype} and {v}.shape == {shape}"
        return test, "{push}({v}.tobytes())"

    @property
    def n(self) -> int:
        return len(self.rows)

    def truncate(self, n: int) -> None:
        if type(self.rows) is list:
            del self.rows[n:]
        else:
            self.rows.truncate(n)

    def reset(self) -> None:
        self.rows.clear()  # values() copied them; the appenders keep this list

    def values(self) -> np.ndarray | RowBytes | PackedColumn:
        rows = self.rows
        if self.field.kind == field_specs.BYTES:
            return RowBytes(list(rows), self.shape, self.dtype)
        data = b"".join(rows) if type(rows) is list else rows.take()
        if self.dtype == PACKED_FLOAT and self.field.kind == field_specs.FLOAT:
            return PackedColumn(data, len(rows), self.shape, self.dtype)
        flat = np.frombuffer(data, dtype=self.dtype)
        return flat.reshape((len(rows),) + self.shape)


class ChecksItself:
    """A column whose `append` checks every value: the compiled step calls it as it is."""

    __slots__ = ()

    def inline_names(self) -> dict[str, Any]:
        return {"append": self.append}

    def zero_append(self, zero: Any) -> tuple[Callable[[], int], Callable[[Any], None], Any]:
        """(size, push, value) that `EpisodeBuffer.finish` uses to add the final step's zero."""
        return (lambda: self.n), self.append, zero

    def kernel_leaf(self) -> None:
        """None: the C step cannot take what `append` checks (`record.step_kernel`)."""
        return None

    def inline_source(self) -> tuple[str, str]:
        """No test: `append` checks the value itself (`record.appender.compile_step_add`)."""
        return "", "{append}({v})"


class _ListColumn(ChecksItself):
    """A text or fallback field: a list of values."""

    __slots__ = ("field", "items", "_is_text", "append")

    def __init__(self, field: field_specs.FieldSpec):
        self.field = field
        self.items: list[Any] = []
        self._is_text = field.kind == field_specs.TEXT
        self.append = self._append

    @property
    def n(self) -> int:
        return len(self.items)

    def _append(self, value: Any) -> None:
        if not (self._is_text and type(value) is bytes):
            value = cast_value(self.field, value)
        self.items.append(value)

    def truncate(self, n: int) -> None:
        del self.items[n:]

    def reset(self) -> None:
        self.items = []

    def values(self) -> list[Any]:
        return self.items


def skip(value: Any) -> None:
    """Appender for a group the dataset does not store (e.g. no discount)."""
