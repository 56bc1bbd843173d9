"""Columns of large rows and images: rows copied into recycled chunks, or frames streamed.

Large rows (at least `row_columns.LARGE_ROW` bytes) and fixed-shape image
frames are copied at the step into chunks (2 MiB, 8 MB for images) from the
recorder's `BufferPool` (image chunks in shared memory, where the encoding
processes read them, once those run: until then ordinary memory, cheaper to
fault in), and handed to the store as `ChunkedRows`. An image field encoded
while the episode runs keeps, per step, where its bytes will be
(`_StreamedImageColumn`, over `store.images.frame_stream`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.record.row_columns import ChecksItself
from rlds_writer.record.values import cast_value
from rlds_writer.store.episodes import shared_frames
from rlds_writer.store.episodes.episode_data import BufferPool, ChunkedRows, put_row
from rlds_writer.store.features import field_specs
from rlds_writer.store.features.wire import bytes_entry_head
from rlds_writer.store.images import frame_stream

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


class LargeArrayColumn(ChecksItself):
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


class _StreamedImageColumn(ChecksItself):
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
