"""The per-field columns of the episode buffer: how each kind of value is kept between steps.

Scalars go to Python lists (cast at episode end; float32, float64 and int64
ones, where the C step is built, into a buffer packed at the step), small
fixed-shape rows to lists of bytes (one buffer, with the C step), text and
TFDS-encoded values to lists, and large rows and images to recycled chunks
(2 MiB, 8 MB for images) from the recorder's `BufferPool` (image chunks in
shared memory, where the encoding processes read them, once those run: until
then ordinary memory, cheaper to fault in).
Every value is checked at the step (`record.values`) and copied: envs often
reuse their arrays.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record import step_kernel
from rlds_writer.record.values import INT64_MAX, INT64_MIN, cast_value
from rlds_writer.store.episodes import shared_frames
from rlds_writer.store.episodes.episode_data import (
    BufferPool,
    ChunkedRows,
    PackedColumn,
    RowBytes,
    put_row,
)
from rlds_writer.store.features import field_specs
from rlds_writer.store.features.wire import bytes_entry_head
from rlds_writer.store.images import frame_stream


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
_PACKED_FLOAT = _F4 if sys.byteorder == "little" else None
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
                        field.key, f"expected {field.describe()}, got int {value} (out of range)"
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
                    if self.dtype == _PACKED_FLOAT:
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


# The exact types `RowBuffer.append_number` always takes (np.float64 is a float).
_EXACT_FLOATS = frozenset((float, np.float64, np.float32))
# The numpy integers `RowBuffer.append_int` takes (each holds its values in int64).
_EXACT_INTS = frozenset(
    (np.int64, np.longlong, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32)
)


class _PackedScalars:
    """A scalar field kept in a `RowBuffer` as its dtype's bytes, packed at the step.

    Where the C step is built, float32, float64 and int64 scalar fields
    (rewards, discounts, actions) go into one buffer instead of a list of
    Python numbers converted at the episode's end; the values are the same
    (`_ScalarColumn`'s cast). Subclasses say what is packed (`put`: a
    `RowBuffer` method, False for what it refuses; `_TYPES` and `_ints`,
    the exact types and the range of Python ints it takes, mirrored in the
    compiled step's test) and how the column leaves the buffer.
    """

    __slots__ = ("field", "dtype", "rows", "append", "put", "_ints")
    _TYPES: frozenset = frozenset()
    _LEAF = ""  # the C step's leaf kind (`record.step_kernel`)

    def __init__(self, field: field_specs.FieldSpec, row_buffer: Any):
        self.field = field
        self.dtype = field.dtype
        self.rows = row_buffer(self.dtype.itemsize)

    def zero_append(self, zero: Any) -> tuple[Callable[[], int], Callable[[Any], None], Any]:
        """(size, push, value) that `EpisodeBuffer.finish` uses to add the final step's zero."""
        return self.rows.__len__, self.rows.append, np.array(zero, dtype=self.dtype).tobytes()

    def inline_names(self) -> dict[str, Any]:
        return {"types": self._TYPES, "put": self.put, "append": self.append}

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
    _TYPES = _EXACT_FLOATS
    _LEAF = "float"

    def __init__(self, field: field_specs.FieldSpec, row_buffer: Any):
        super().__init__(field, row_buffer)
        # Python ints the dtype holds exactly, as `float_value` in _step_kernel.c.
        exact = 1 << (24 if self.dtype.itemsize == 4 else 53)
        self._ints = (-exact, exact)
        self.put = self.rows.append_number
        put, push = self.put, self.rows.append

        def append(value: Any) -> None:
            if not put(value):
                push(cast_value(field, value).tobytes())

        self.append = append

    def values(self) -> np.ndarray | PackedColumn:
        data = self.rows.take()
        if self.dtype == _PACKED_FLOAT:
            return PackedColumn(data, len(self.rows), (), self.dtype)
        return np.frombuffer(data, dtype=self.dtype)


class _PackedIntColumn(_PackedScalars):
    """An int64 scalar field: a Python int within int64 or a numpy integer that
    int64 holds (`RowBuffer.append_int`); an int out of range is refused at the
    step, naming the field; anything else goes through `cast_value`."""

    __slots__ = ()
    _TYPES = _EXACT_INTS
    _LEAF = "int64"

    def __init__(self, field: field_specs.FieldSpec, row_buffer: Any):
        super().__init__(field, row_buffer)
        self._ints = (INT64_MIN, INT64_MAX)
        self.put = self.rows.append_int
        put, push = self.put, self.rows.append

        def append(value: Any) -> None:
            if put(value):
                return
            if type(value) is int:
                raise StepValueError(
                    field.key, f"expected {field.describe()}, got int {value} (out of range)"
                )
            push(cast_value(field, value).tobytes())

        self.append = append

    def values(self) -> np.ndarray | PackedColumn:
        small = self.rows.take_small_ints()
        if small is not None:  # one-byte varints, as `_packed_ints`
            return PackedColumn(small, len(self.rows), (), self.dtype)
        return np.frombuffer(self.rows.take(), dtype=self.dtype)


# Rows at least this large are copied into recycled buffers instead.
_LARGE_ROW = 8192


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
        if self.dtype == _PACKED_FLOAT and self.field.kind == field_specs.FLOAT:
            return PackedColumn(data, len(rows), self.shape, self.dtype)
        flat = np.frombuffer(data, dtype=self.dtype)
        return flat.reshape((len(rows),) + self.shape)


class _ChecksItself:
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


class _ListColumn(_ChecksItself):
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


# Rows of large columns are kept in chunks of about this many bytes. A chunk
# is recycled whole, so the memory an env that the writer keeps up with
# touches is about an episode plus the chunks taken while the previous one is
# written: with 8 MB chunks, a 400-step episode of 84x84x3 frames (8.5 MB)
# kept 4 chunks (32 MB) warm, and a fresh process paid for faulting them in
# (benchmarks/REPORT.md, raw84).
_CHUNK_BYTES = 2 << 20
# Image frames keep 8 MB chunks: in shared memory (`shared_frames`) each chunk
# is a segment the encoding processes map.
_IMAGE_CHUNK_BYTES = 8 << 20


class LargeArrayColumn(_ChecksItself):
    """A tensor field with large rows (images): recycled chunks of rows.

    The column grows a chunk at a time, so no step ever copies the rows
    recorded before it (a doubling buffer stalls one step for tens of ms on a
    long camera episode); chunks come back from the writer through the pool.
    A chunk is taken when a row needs it, not ahead: a recording's last
    episode leaves no unused chunk behind, and pages of a chunk that no row
    reached are never touched.
    """

    # Chunks in shared memory, where the image-encoding processes read them
    # (once they run: `shared_frames.wanted`).
    SHARED = False
    # Whether copying a row keeps the GIL (`episode_data.put_row`).
    KEEP_GIL = False

    __slots__ = (
        "field", "shape", "dtype", "chunks", "cur", "pos", "n", "rows", "append", "_pool",
        "_row_bytes", "_flat",
    )  # fmt: skip

    def __init__(self, field: field_specs.FieldSpec, pool: BufferPool):
        self.field = field
        self.shape = field.shape
        self.dtype = field.dtype
        self._pool = pool
        row_bytes = field.row_nbytes
        self._row_bytes = row_bytes
        chunk_bytes = _IMAGE_CHUNK_BYTES if self.SHARED else _CHUNK_BYTES
        self.rows = max(1, chunk_bytes // max(row_bytes, 1))
        self._empty()
        self.append = self._append

    def _empty(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.cur = np.empty((0,) + self.shape, self.dtype)  # full: the next row takes a chunk
        self._flat = memoryview(b"")
        self.pos = 0
        self.n = 0

    def _use(self, chunk: np.ndarray) -> None:
        self.cur = chunk
        self._flat = memoryview(chunk).cast("B")

    def _take(self) -> np.ndarray:
        # Shared memory only once encoding processes run: until then (and for
        # a recording that never starts them) ordinary memory faults in ~10x cheaper.
        shared = self.SHARED and shared_frames.wanted()
        # Chunks in shared memory feed encoding processes, which gain from
        # episodes queued ahead; others (frames the writer encodes on its own
        # threads too) wait for the writer to hand chunks back rather than
        # fault in new memory for every queued episode.
        chunk = self._pool.take(
            self.field.key, self.rows, self.shape, self.dtype, shared, wait=not shared
        )
        if shared:
            # Keep one warm chunk ahead, made off the env thread (shared memory
            # costs ~4x ordinary memory to fault in).
            self._pool.prefill(self.field.key, self.rows, self.shape, self.dtype, shared)
        return chunk

    def _append(self, value: Any) -> None:
        if not (
            type(value) is np.ndarray and value.dtype is self.dtype and value.shape == self.shape
        ):
            value = cast_value(self.field, value)
        self._store(value)

    def _store(self, value: np.ndarray) -> None:
        """Copies a checked row into the current chunk (a new one when it is full)."""
        pos = self.pos
        if pos == len(self.cur):
            chunk = self._take()
            self._use(chunk)
            self.chunks.append(chunk)
            if len(self.chunks) > 1:
                self._pool.expect(self.field.key, len(self.chunks))
            pos = 0
        put_row(self.cur, self._flat, pos, self._row_bytes, value, self.KEEP_GIL)
        self.pos = pos + 1
        self.n += 1

    def truncate(self, n: int) -> None:
        if n >= self.n:
            return
        keep = max(1, -(-n // self.rows))
        for chunk in self.chunks[keep:]:
            self._pool.give(self.field.key, chunk)
        del self.chunks[keep:]
        self._use(self.chunks[-1])
        self.pos = n - (keep - 1) * self.rows
        self.n = n

    def values(self) -> np.ndarray | ChunkedRows:
        if len(self.chunks) <= 1:
            return self.cur[: self.n]
        return ChunkedRows(list(self.chunks), self.n)

    def detach(self) -> list[tuple[str, np.ndarray]]:
        """Gives the chunks away (to the finished episode); the next row takes a new one."""
        given = [(self.field.key, chunk) for chunk in self.chunks]
        self._empty()
        return given

    def reset(self) -> None:
        self.truncate(0)


class FramedRowsColumn(LargeArrayColumn):
    """Large rows stored as raw bytes (a `Tensor` with bytes encoding, such as
    frames recorded with `image_encoding="bytes"`), kept as they are written.

    Each row sits in its chunk behind the bytes that precede it in the record
    (its `BytesList` entry head), so a chunk's used bytes are a stretch of the
    record as it will be written: the writer thread hashes and writes a chunk
    in one call each instead of two calls per row (a 400-step episode of
    84x84x3 frames: 5 chunks against 800 rows and heads), and so needs the
    GIL back that much less often while the env thread steps. One-byte dtypes
    only: every row then starts aligned.
    """

    __slots__ = ("_prefix", "_head", "_strides")

    def __init__(self, field: field_specs.FieldSpec, pool: BufferPool):
        super().__init__(field, pool)
        self._prefix = bytes_entry_head(self._row_bytes)
        self._head = np.frombuffer(self._prefix, np.uint8)
        stride = len(self._prefix) + self._row_bytes
        self.rows = max(1, _CHUNK_BYTES // stride)
        inner = [int(np.prod(self.shape[i + 1 :], dtype=np.int64)) for i in range(len(self.shape))]
        self._strides = (stride, *inner)

    @staticmethod
    def takes(field: field_specs.FieldSpec) -> bool:
        return field.kind == field_specs.BYTES and field.dtype.itemsize == 1

    def _take(self) -> np.ndarray:
        framed = self._pool.take(
            self.field.key, self.rows, (self._strides[0],), np.dtype(np.uint8), wait=True
        )
        framed[:, : len(self._prefix)] = self._head  # a recycled buffer may come from elsewhere
        return framed

    def _use(self, chunk: np.ndarray) -> None:
        self.cur = self._rows_of(chunk)

    def _rows_of(self, framed: np.ndarray) -> np.ndarray:
        """The rows of a framed buffer, as an array of the field's shape (a view)."""
        return np.ndarray(
            (len(framed), *self.shape),
            self.dtype,
            buffer=framed,
            offset=len(self._prefix),
            strides=self._strides,
        )

    def values(self) -> ChunkedRows:
        rows = [self._rows_of(chunk) for chunk in self.chunks]
        return ChunkedRows(rows, self.n, framed=list(self.chunks), prefix=self._prefix)


class _ImageColumn(LargeArrayColumn):
    """An image field of fixed shape (PNG/JPEG, encoded later off the env thread).

    Frames are copied into the recycled buffer at the step: envs often reuse one
    frame array and draw into it in place, so keeping a reference would record
    the last frame at every step. Values TFDS also takes for an image (encoded
    bytes, a file path) are kept as they are, by step index.
    """

    SHARED = True
    KEEP_GIL = True

    __slots__ = ("others",)

    def __init__(self, field: field_specs.FieldSpec, pool: BufferPool):
        super().__init__(field, pool)
        self.others: dict[int, Any] = {}

    def _append(self, value: Any) -> None:
        if not (
            type(value) is np.ndarray and value.dtype is self.dtype and value.shape == self.shape
        ):
            value = cast_value(self.field, value)
            if not isinstance(value, np.ndarray):
                # Still takes a row, so that row i is step i.
                self.others[self.n] = value
                value = np.zeros(self.shape, self.dtype)
        self._store(value)

    def truncate(self, n: int) -> None:
        super().truncate(n)
        self.others = {i: v for i, v in self.others.items() if i < self.n}

    def values(self) -> np.ndarray | ChunkedRows | list[Any]:
        rows = super().values()
        if not self.others:
            return rows
        return [self.others.get(i, rows[i]) for i in range(self.n)]

    def detach(self) -> list[tuple[str, np.ndarray]]:
        self.others = {}
        return super().detach()

    def reset(self) -> None:
        super().reset()
        self.others = {}


class _StreamedImageColumn(_ChecksItself):
    """An image field whose frames are encoded while the episode runs (`store.images.frame_stream`).

    Each frame is copied into the stream's ring at the step and encoded on a
    background thread; the column keeps, per step, where its bytes will be.
    """

    __slots__ = ("field", "shape", "dtype", "stream", "entries", "append")

    def __init__(self, field: field_specs.FieldSpec, stream: frame_stream.FrameStream):
        self.field = field
        self.shape = field.shape
        self.dtype = field.dtype
        self.stream = stream
        self.entries: list[Any] = []
        self.append = self._append

    @property
    def n(self) -> int:
        return len(self.entries)

    def _append(self, value: Any) -> None:
        if not (
            type(value) is np.ndarray and value.dtype is self.dtype and value.shape == self.shape
        ):
            value = cast_value(self.field, value)
            if not isinstance(value, np.ndarray):
                self.entries.append(frame_stream.other(value))
                return
        self.entries.append(self.stream.put(value))

    def truncate(self, n: int) -> None:
        dropped = self.entries[n:]
        if not dropped:
            return
        del self.entries[n:]
        framed = sum(1 for e in dropped if type(e) is tuple)
        self.stream.drop_last(framed)

    def values(self) -> frame_stream.EncodedFrames:
        self.stream.submit()  # the episode's last frames
        return frame_stream.EncodedFrames(self.field.key, self.entries, self.field.row_nbytes)

    def reset(self) -> None:
        self.entries = []


def make_column(
    field: field_specs.FieldSpec,
    pool: BufferPool,
    stream: frame_stream.FrameStream | None = None,
) -> (
    _ArrayColumn
    | LargeArrayColumn
    | _ScalarColumn
    | _PackedFloatColumn
    | _PackedIntColumn
    | _ListColumn
    | _StreamedImageColumn
):
    if stream is not None:
        return _StreamedImageColumn(field, stream)
    if field.kind in (field_specs.PNG, field_specs.JPEG) and None not in field.shape:
        return _ImageColumn(field, pool)
    if field.kind in (field_specs.FLOAT, field_specs.INT) and field.shape == ():
        row_buffer = step_kernel.row_buffer_type()
        if row_buffer is not None and field.kind == field_specs.FLOAT and field.dtype in _FLOATS:
            return _PackedFloatColumn(field, row_buffer)
        if row_buffer is not None and field.kind == field_specs.INT and field.dtype == _I8:
            return _PackedIntColumn(field, row_buffer)
        return _ScalarColumn(field)
    if field.kind in (field_specs.FLOAT, field_specs.INT, field_specs.BYTES, field_specs.ZLIB):
        if field.row_nbytes >= _LARGE_ROW:
            if FramedRowsColumn.takes(field):
                return FramedRowsColumn(field, pool)
            return LargeArrayColumn(field, pool)
        return _ArrayColumn(field)
    return _ListColumn(field)
