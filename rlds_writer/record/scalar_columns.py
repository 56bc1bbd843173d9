"""Columns of scalar numbers: Python lists cast at the episode's end, or packed at the step.

Rewards, discounts, discrete actions and other per-step numbers. Each value
is appended as it is when its type casts without surprise (`_fast_scalar_types`)
and checked at the step otherwise; the column becomes one array at the
episode's end (struct-packed where `struct` gives numpy's bytes). Where the C
step is built, float32, float64 and int64 fields go instead into a `RowBuffer`
packed at the step (`_PackedFloatColumn`, `_PackedIntColumn`), taking the same
values (`packed_accepts`: the C module's own lists).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record import step_kernel
from rlds_writer.record.values import INT64_MAX, INT64_MIN, cast_value, describe
from rlds_writer.store.episodes.episode_data import PackedColumn
from rlds_writer.store.features import field_specs


def _fast_scalar_types(dtype: np.dtype) -> frozenset:
    """Scalar types that `np.array(v, dtype)` casts without loss of validity.

    Values of these types are appended to a list as they are and converted in
    one vectorised call at episode end; anything else is validated per step.
    """
    if dtype.kind == "b":
        return frozenset((bool, np.bool_))
    if dtype.kind == "f":
        # Not np.int64: the end's struct cast goes through a double, numpy's (and
        # TFDS's) straight to float32, which rounds some values above 2**53 apart.
        return frozenset((float, int, np.float64, np.float32, np.float16, np.int32))
    if dtype == np.int64:
        # Python ints outside int64 are caught at the step (see _ScalarColumn).
        return frozenset(
            (int, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32)
        )
    if dtype.kind in "iu":
        # A Python int within the dtype's range (dm_env's `DiscreteArray` is int32).
        return frozenset((int, dtype.type))
    return frozenset((dtype.type,))


# The largest Python int that converts to a float (a double): numpy's cast of a
# larger one to any float dtype raises OverflowError (`float(2**1024)` does).
FLOAT_INT_MAX = 2**1024 - 2**970 - 1


def _int_range(dtype: np.dtype) -> tuple[int, int] | None:
    """The range of Python ints a numeric column takes as they are (None: not one).

    An integer dtype's own range; for a float dtype, the ints a double holds
    (numpy casts them, to inf past the dtype's range, as TFDS does): a larger
    one would fail the whole episode's cast at its end, so it is refused at
    the step instead.
    """
    if dtype.kind == "f":
        return -FLOAT_INT_MAX, FLOAT_INT_MAX
    if dtype.kind not in "iu":
        return None
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


# Scalar dtypes whose columns of Python numbers `struct` packs to the bytes
# numpy's cast gives (little-endian: only where that is numpy's native order).
_STRUCT_CODES = (
    {np.dtype(np.float32): "f", np.dtype(np.float64): "d", np.dtype(np.int64): "q"}
    if sys.byteorder == "little"
    else {}
)
# float32 is the one dtype whose native bytes are a `FloatList`'s payload (on a
# little-endian machine): its columns are handed over packed (`PackedColumn`).
_F4 = np.dtype(np.float32)
PACKED_FLOAT = _F4 if sys.byteorder == "little" else None
_FLOATS = (_F4, np.dtype(np.float64))
_I8 = np.dtype(np.int64)


def _packed_ints(items: list[Any], dtype: np.dtype) -> PackedColumn | None:
    """The items as one-byte varints if they all lie in [0, 128), else None."""
    try:
        payload = bytes(items)  # refuses values outside [0, 256) and non-integers
    except (TypeError, ValueError):
        return None
    return PackedColumn(payload, len(items), (), dtype) if payload.isascii() else None


def _struct_packer(code: str) -> Callable[[list[Any]], bytes]:
    """`pack(items)`: the items as packed `code` values, one `Struct` per length."""
    structs: dict[int, struct.Struct] = {}

    def pack(items: list[Any]) -> bytes:
        n = len(items)
        packer = structs.get(n)
        if packer is None:
            if len(structs) >= 64:  # episode lengths vary: keep the recent ones
                structs.clear()
            packer = structs[n] = struct.Struct(f"<{n}{code}")
        return packer.pack(*items)

    return pack


class _ScalarColumn:
    """A scalar numeric field: a list of Python/numpy scalars, cast at episode end."""

    __slots__ = (
        "field", "dtype", "items", "_fast", "_range", "append", "_pack", "_packed_type",
        "_ints",
    )  # fmt: skip

    def __init__(self, field: field_specs.FieldSpec):
        self.field = field
        self.dtype = field.dtype
        self.items: list[Any] = []
        self._fast = _fast_scalar_types(self.dtype)
        self._range = _int_range(self.dtype)  # (lo, hi) of the ints taken as they are
        self.append = self._make_append()
        code = _STRUCT_CODES.get(self.dtype)
        self._pack = _struct_packer(code) if code else None
        self._packed_type = int if code == "q" else float
        # Integer and bool columns go out as one-byte varints when they can.
        self._ints = self.dtype.kind in "iub"

    def _make_append(self) -> Callable[[Any], None]:
        # A closure over locals: the per-step path does no attribute lookups.
        fast = self._fast
        push = self.items.append
        field = self.field
        # A Python int is unbounded: check the dtype's range here, at the step,
        # not when the episode ends (that would drop the whole episode).
        lo, hi = self._range or (None, None)
        bounded = lo is not None
        # A float column's int too large for a double: `cast_value` refuses it.
        floats = self.dtype.kind == "f"

        def append(value: Any) -> None:
            kind = type(value)
            if kind in fast:
                if bounded and kind is int and not lo <= value <= hi:
                    if floats:
                        cast_value(field, value)  # raises StepValueError (numpy's OverflowError)
                    raise StepValueError(
                        field.key,
                        f"expected {field.describe()}, got {describe(value)} (out of range)",
                    )
                push(value)
            else:
                push(cast_value(field, value))

        return append

    def inline_names(self) -> dict[str, Any]:
        if self._range:
            names = {"others": self._fast - {int}, "push": self.items.append}
            if self.dtype.kind == "f":  # bound as names: the source stays short
                names["lo"], names["hi"] = self._range
            return names
        return {"types": self._fast, "push": self.items.append}

    def zero_append(self, zero: Any) -> tuple[Callable[[], int], Callable[[Any], None], Any]:
        """(size, push, value) that `EpisodeBuffer.finish` uses to add the final step's zero."""
        if type(zero) in self._fast:  # taken as it is: no check to run at every episode end
            return self.items.__len__, self.items.append, zero
        return self.items.__len__, self.append, zero

    def kernel_leaf(self) -> tuple:
        """The same test and append for the C step (`record.step_kernel`)."""
        if self.dtype.kind == "f":
            # With its float dtype, the C step takes a Python int only if it
            # converts to a double (FLOAT_INT_MAX).
            return ("scalar", self.items, frozenset(self._fast), True, self.dtype, (), 0)
        if self._range:
            others = frozenset(self._fast - {int})
            return ("int", self.items, others, False, self.dtype, (), 0)
        return ("scalar", self.items, frozenset(self._fast), float in self._fast, None, (), 0)

    def inline_source(self) -> tuple[str, str]:
        """The test and the append of `record.appender.compile_step_add` (same as `append`)."""
        bounds = self._range
        if bounds and self.dtype.kind == "f":
            # A Python float first (the common reward and discount): one identity test.
            test = "type({v}) is float or type({v}) is int and {lo} <= {v} <= {hi}"
            return f"{test} or type({{v}}) in {{others}}", "{push}({v})"
        if bounds:
            # A Python int first (the common action), with one type test.
            test = f"type({{v}}) is int and {bounds[0]} <= {{v}} <= {bounds[1]}"
            return f"{test} or type({{v}}) in {{others}}", "{push}({v})"
        if float in self._fast:
            return "type({v}) is float or type({v}) in {types}", "{push}({v})"
        return "type({v}) in {types}", "{push}({v})"

    @property
    def n(self) -> int:
        return len(self.items)

    def truncate(self, n: int) -> None:
        del self.items[n:]

    def reset(self) -> None:
        self.items.clear()  # values() copied them; the appenders keep this list

    def values(self) -> np.ndarray | PackedColumn:
        items = self.items
        if self._ints and items:
            packed = _packed_ints(items, self.dtype)
            if packed is not None:
                return packed
        pack = self._pack
        if pack is not None and items and type(items[0]) is self._packed_type:
            # struct converts a list of Python numbers about twice as fast as
            # np.array; values it refuses (out of range) take numpy's way below.
            try:
                data = pack(items)
            except (struct.error, OverflowError, TypeError):
                pass
            else:
                packed = np.frombuffer(data, dtype=self.dtype)
                # struct casts every float through a double, numpy an np.float32 or
                # np.float16 straight: the same number, but a signalling NaN comes
                # out quieted. A column with a NaN takes numpy's way below.
                if self.dtype.kind != "f" or not np.isnan(packed).any():
                    if self.dtype == PACKED_FLOAT:
                        return PackedColumn(data, len(items), (), self.dtype)
                    return packed
        try:
            return np.array(items, dtype=self.dtype)
        except OverflowError:
            for i, v in enumerate(self.items):
                if type(v) is int and not INT64_MIN <= v <= INT64_MAX:
                    raise StepValueError(
                        self.field.key,
                        f"step {i}: expected {self.field.describe()}, got int {v} "
                        "(out of int64 range)",
                    ) from None
            raise


def packed_accepts(kind: str, itemsize: int) -> tuple[frozenset, tuple[int, int]]:
    """The exact types and the range of Python ints a `RowBuffer` takes as they are.

    `append_number` (kind "float", rows of `itemsize` bytes) or `append_int`
    ("int64"), as the C module lists them (`NUMBER_TYPES`, `INT64_TYPES`, ...,
    in `_step_kernel.c`): the compiled step's test is made from the same lists.
    """
    kernel = step_kernel.extension()
    if kind == "float":
        exact = kernel.FLOAT32_EXACT_INT if itemsize == 4 else kernel.FLOAT64_EXACT_INT
        return frozenset(kernel.NUMBER_TYPES), (-exact, exact)
    return frozenset(kernel.INT64_TYPES), (INT64_MIN, INT64_MAX)


class _PackedScalars:
    """A scalar field kept in a `RowBuffer` as its dtype's bytes, packed at the step.

    Where the C step is built, float32, float64 and int64 scalar fields
    (rewards, discounts, actions) go into one buffer instead of a list of
    Python numbers converted at the episode's end; the values are the same
    (`_ScalarColumn`'s cast). Subclasses say what is packed (`put`: a
    `RowBuffer` method, False for what it refuses; the exact types and the
    range of Python ints it takes come from the C module, `packed_accepts`,
    and make the compiled step's test) and how the column leaves the buffer.
    """

    __slots__ = ("field", "dtype", "rows", "append", "put", "_types", "_ints")
    _LEAF = ""  # the C step's leaf kind (`record.step_kernel`), and what `put` takes

    def __init__(self, field: field_specs.FieldSpec, row_buffer: Any):
        self.field = field
        self.dtype = field.dtype
        self.rows = row_buffer(self.dtype.itemsize)
        self._types, self._ints = packed_accepts(self._LEAF, self.dtype.itemsize)

    def zero_append(self, zero: Any) -> tuple[Callable[[], int], Callable[[Any], None], Any]:
        """(size, push, value) that `EpisodeBuffer.finish` uses to add the final step's zero."""
        return self.rows.__len__, self.rows.append, np.array(zero, dtype=self.dtype).tobytes()

    def inline_names(self) -> dict[str, Any]:
        return {"types": self._types, "put": self.put, "append": self.append}

    def inline_source(self) -> tuple[str, str]:
        """The test and the append of `record.appender.compile_step_add` (what `put` takes;
        should the test ever pass a value it refuses, `append` casts it: none is lost)."""
        lo, hi = self._ints
        test = f"type({{v}}) is int and {lo} <= {{v}} <= {hi} or type({{v}}) in {{types}}"
        return test, "{put}({v}) or {append}({v})"

    def kernel_leaf(self) -> tuple:
        """The same test and append for the C step (`record.step_kernel`)."""
        return (self._LEAF, self.rows, None, False, self.dtype, (), self.dtype.itemsize)

    @property
    def n(self) -> int:
        return len(self.rows)

    def truncate(self, n: int) -> None:
        self.rows.truncate(n)

    def reset(self) -> None:
        self.rows.clear()  # values() copied them; the appenders keep this buffer


class _PackedFloatColumn(_PackedScalars):
    """A float32 or float64 scalar field: each value cast as numpy casts it
    (`RowBuffer.append_number`: a float, an np.float32 or an int the dtype
    holds exactly; anything else through `cast_value`)."""

    __slots__ = ()
    _LEAF = "float"

    def __init__(self, field: field_specs.FieldSpec, row_buffer: Any):
        super().__init__(field, row_buffer)
        self.put = self.rows.append_number
        put, push = self.put, self.rows.append

        def append(value: Any) -> None:
            if not put(value):
                push(cast_value(field, value).tobytes())

        self.append = append

    def values(self) -> np.ndarray | PackedColumn:
        data = self.rows.take()
        if self.dtype == PACKED_FLOAT:
            return PackedColumn(data, len(self.rows), (), self.dtype)
        return np.frombuffer(data, dtype=self.dtype)


class _PackedIntColumn(_PackedScalars):
    """An int64 scalar field: a Python int within int64 or a numpy integer that
    int64 holds (`RowBuffer.append_int`); an int out of range is refused at the
    step, naming the field; anything else goes through `cast_value`."""

    __slots__ = ()
    _LEAF = "int64"

    def __init__(self, field: field_specs.FieldSpec, row_buffer: Any):
        super().__init__(field, row_buffer)
        self.put = self.rows.append_int
        put, push = self.put, self.rows.append

        def append(value: Any) -> None:
            if put(value):
                return
            if type(value) is int:
                raise StepValueError(
                    field.key, f"expected {field.describe()}, got {describe(value)} (out of range)"
                )
            push(cast_value(field, value).tobytes())

        self.append = append

    def values(self) -> np.ndarray | PackedColumn:
        small = self.rows.take_small_ints()
        if small is not None:  # one-byte varints, as `_packed_ints`
            return PackedColumn(small, len(self.rows), (), self.dtype)
        return np.frombuffer(self.rows.take(), dtype=self.dtype)


def scalar_column(field: field_specs.FieldSpec) -> _ScalarColumn | _PackedScalars:
    """The column of a scalar number field: packed at the step where the C step is built."""
    row_buffer = step_kernel.row_buffer_type()
    if row_buffer is not None and field.kind == field_specs.FLOAT and field.dtype in _FLOATS:
        return _PackedFloatColumn(field, row_buffer)
    if row_buffer is not None and field.kind == field_specs.INT and field.dtype == _I8:
        return _PackedIntColumn(field, row_buffer)
    return _ScalarColumn(field)
