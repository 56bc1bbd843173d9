"""Raw-bytes frames of a batch, kept in each sub-env's framed chunks.

A field recorded with `image_encoding="bytes"` (or any large raw-bytes
tensor) is written as its frames' own bytes, each behind its `BytesList`
entry head. The single-env recorder keeps such rows where they will be
written (`record.chunk_columns.FramedRowsColumn`): a chunk's used bytes are
a stretch of the record, hashed and written in one part. Here each sub-env
has a chunk of its own, and a step's frames go into them in one C call
(`_frame_rows.c`, the GIL released): no Python, no `bytes` object and no
allocation per frame. The time ring keeps, per sub-env and step, only the
chunk (an object reference) and the frame's place in it (an int64).

When an episode ends, its frames are runs of consecutive places in a few
chunks (a new chunk when one is full; a `replace`d final observation or a
reset's frame taken as the next episode's first break a run), and each run
is one framed part of a `ChunkedRows` the writer writes as it is: the
single-env recorder's parts, so the same records.

A chunk lives while anything refers to it (the sub-env filling it, rows of
the ring, a spilled or queued episode); a retired chunk nothing else refers
to is filled again, so the frames' memory is not faulted in anew at every
chunk (a reference count, checked once per chunk, not per frame).
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import numpy as np

from rlds_writer import _native
from rlds_writer.store.episodes.episode_data import ChunkedRows
from rlds_writer.store.features import field_specs
from rlds_writer.store.features.wire import bytes_entry_head

_native_rows = _native.load("rlds_writer.record.batch._frame_rows")

# A place: the chunk's number above ROW_BITS, the row in it below (C's the same).
ROW_BITS = 20
_ROW_MASK = (1 << ROW_BITS) - 1
# Bytes per chunk: per sub-env, one is being filled (64 sub-envs: 32 MiB).
CHUNK_BYTES = 512 << 10
# Retired chunks checked for reuse per chunk taken (the oldest first).
_CHECKS = 4


def _copy_rows_numpy(
    batch: np.ndarray,
    rows: np.ndarray | None,
    envs: np.ndarray,
    chunks: list[np.ndarray],
    fill: np.ndarray,
    places: np.ndarray,
    prefix: int,
) -> None:
    """`_frame_rows.copy` where it is not built: a numpy copy per frame."""
    flat = batch.reshape(len(batch), -1).view(np.uint8)
    for j, env in enumerate(envs.tolist()):
        place = int(fill[env])
        fill[env] = place + 1
        places[j] = place
        chunks[env][place & _ROW_MASK, prefix:] = flat[j if rows is None else rows[j]]


class FrameChunks:
    """The framed chunks of one raw-bytes field, one being filled per sub-env.

    Args:
      spec: the field (fixed shape and dtype).
      num_envs: the batch size `N`.
      chunk_bytes: about how many bytes per chunk (None: `CHUNK_BYTES`).
    """

    def __init__(self, spec: field_specs.FieldSpec, num_envs: int, chunk_bytes: int | None = None):
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        self.shape = tuple(spec.shape)
        self.dtype = np.dtype(spec.dtype)
        self.row_nbytes = spec.row_nbytes
        self.prefix = bytes_entry_head(self.row_nbytes)
        self.stride = len(self.prefix) + self.row_nbytes
        self.capacity = int(min(_ROW_MASK, max(1, chunk_bytes // self.stride)))
        item = self.dtype.itemsize
        inner = [
            int(np.prod(self.shape[i + 1 :], dtype=np.int64)) * item for i in range(len(self.shape))
        ]
        self._strides = (self.stride, *inner)
        self._head = np.frombuffer(self.prefix, np.uint8)
        # Sub-env -> the chunk being filled (a list for C, an array for the
        # ring's handles) and the place of its next row; full at first.
        self.current: list[Any] = [None] * num_envs
        self._handles = np.empty(num_envs, object)
        self.fill = np.full(num_envs, self.capacity, np.int64)
        self._serial = 0
        self._retired: collections.deque[np.ndarray] = collections.deque()
        self._free: list[np.ndarray] = []
        self.chunks_made = 0  # for tests: how often a chunk was not reused

    def copy(
        self, batch: Any, rows: np.ndarray | None, envs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Copies batch rows `rows` (None: all) of sub-envs `envs` into their chunks.

        Returns:
          `(handles, places)`: each frame's chunk (object) and place (int64).
        """
        frames = np.ascontiguousarray(batch, self.dtype)
        envs = np.asarray(envs, np.int64)
        full = (self.fill[envs] & _ROW_MASK) >= self.capacity
        if full.any():
            self._renew(envs[full])
        places = np.empty(len(envs), np.int64)
        if _native_rows is not None:
            _native_rows.copy(
                frames,
                rows,
                envs,
                self.current,
                self.fill,
                places,
                self.row_nbytes,
                self.stride,
                len(self.prefix),
                self.capacity,
            )
        else:
            _copy_rows_numpy(frames, rows, envs, self.current, self.fill, places, len(self.prefix))
        return self._handles[envs], places

    def _renew(self, envs: np.ndarray) -> None:
        """Gives each of `envs` (sub-envs whose chunk is full) a chunk to fill."""
        for i in envs.tolist():
            old = self.current[i]
            if old is not None:
                self._retired.append(old)
            chunk = self._take()
            self.current[i] = chunk
            self._handles[i] = chunk
            self._serial += 1
            self.fill[i] = self._serial << ROW_BITS

    def _take(self) -> np.ndarray:
        retired = self._retired
        for _ in range(min(_CHECKS, len(retired))):
            # Referred to by the deque and by this call only: nothing reads it any more.
            if sys.getrefcount(retired[0]) <= 2:
                self._free.append(retired.popleft())
            else:
                retired.rotate(-1)
        if self._free:
            chunk = self._free.pop()
            del self._free[len(self.current) :]  # more than a round of spares: let go
            return chunk
        self.chunks_made += 1
        chunk = np.empty((self.capacity, self.stride), np.uint8)
        chunk[:, : len(self.prefix)] = self._head
        return chunk

    def rows(self, handles: np.ndarray, places: np.ndarray) -> ChunkedRows:
        """An episode's frames (its gathered handles and places) as framed parts."""
        n = len(places)
        breaks = np.flatnonzero(np.diff(places) != 1) + 1
        starts = [0, *breaks.tolist()]
        ends = [*starts[1:], n]
        framed, views = [], []
        for a, b in zip(starts, ends):
            chunk = handles[a]
            row = int(places[a]) & _ROW_MASK
            framed.append(chunk[row : row + b - a])
            views.append(
                np.ndarray(
                    (b - a, *self.shape),
                    self.dtype,
                    buffer=chunk,
                    offset=row * self.stride + len(self.prefix),
                    strides=self._strides,
                )
            )
        return ChunkedRows(views, n, framed=framed, prefix=self.prefix)
