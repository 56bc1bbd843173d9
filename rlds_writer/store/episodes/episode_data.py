"""A finished episode as the store receives it: per-field columns, ready to encode.

The recorder (`rlds_writer.record`) fills columns step by step and hands an
`Episode` to `DatasetWriter.write`; the writer encodes it, writes it and calls
`release()`, which returns large-row buffers to the recorder's `BufferPool`.
This module is the whole contract between the two: the store imports nothing
of the recorder.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.store.episodes.chunk_spares import spares as _spares
from rlds_writer.store.episodes.shared_frames import is_shared, shared_empty


class RowBytes:
    """A per-step tensor column kept as one raw-bytes row per step.

    Bytes-encoded tensors are stored exactly as these rows, so the encoder
    writes them without stacking them into one array first.

    Attributes:
      rows: one `bytes` per step (C order, the field's dtype).
      shape: the shape of one step's value.
      dtype: the field's dtype.
    """

    __slots__ = ("rows", "shape", "dtype")

    def __init__(self, rows: list[bytes], shape: tuple[int, ...], dtype: np.dtype):
        self.rows = rows
        self.shape = shape
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.rows)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        flat = np.frombuffer(b"".join(self.rows), dtype=self.dtype)
        arr = flat.reshape((len(self.rows),) + tuple(self.shape))
        return arr if dtype is None else arr.astype(dtype)


class PackedColumn:
    """A numeric per-step column given as the packed payload its `Feature` stores.

    Short episodes of small numeric fields (Catch-like recordings) are
    mostly per-field overhead: a numpy array per column at episode end,
    then views and casts to reach the same bytes again. The recorder hands
    over those bytes instead: a float32 field's values as little-endian
    float32 (a `FloatList`'s packed payload), or an integer or bool field
    whose values all lie in [0, 128) as one byte each (an `Int64List`'s packed
    varints). The encoder writes `payload` as it is; `np.asarray` gives the
    values as an array of `dtype` for anyone else.

    Attributes:
      payload: the packed bytes.
      n: number of steps.
      shape: the shape of one step's value.
      dtype: the field's dtype.
    """

    __slots__ = ("payload", "n", "shape", "dtype")

    def __init__(self, payload: bytes, n: int, shape: tuple[int, ...], dtype: np.dtype):
        self.payload = payload
        self.n = n
        self.shape = shape
        self.dtype = dtype

    def __len__(self) -> int:
        return self.n

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.dtype.kind == "f":
            arr = np.frombuffer(self.payload, "<f4").astype(self.dtype)
        else:  # one-byte varints: the values themselves
            arr = np.frombuffer(self.payload, np.uint8).astype(self.dtype)
        arr = arr.reshape((self.n,) + tuple(self.shape))
        return arr if dtype is None else arr.astype(dtype)

    def __getitem__(self, index: Any) -> Any:
        return np.asarray(self)[index]


class ChunkedRows:
    """A column of large rows kept in fixed-size chunks (the recorder grows by chunks).

    Growing by chunks never copies rows already recorded, so no step stalls on
    a reallocation; the encoder takes the rows chunk by chunk, and only
    `__array__` (on the writer thread) joins them into one array.

    Attributes:
      chunks: arrays of shape `(rows, *shape)`; the last may be partly used.
      n: number of rows.
      framed: for rows kept as they are written (`record.columns`, raw
        bytes fields): each chunk's buffer, shape `(rows, len(prefix) + row
        bytes)`, with `prefix` before every row; else None.
      prefix: the bytes before each row in `framed`.
    """

    __slots__ = ("chunks", "n", "framed", "prefix")

    def __init__(
        self,
        chunks: list[np.ndarray],
        n: int,
        framed: list[np.ndarray] | None = None,
        prefix: bytes = b"",
    ):
        self.chunks = chunks
        self.n = n
        self.framed = framed
        self.prefix = prefix

    def __len__(self) -> int:
        return self.n

    def parts(self) -> list[np.ndarray]:
        """The used part of each chunk, in order."""
        return _used(self.chunks, self.n)

    def framed_parts(self) -> list[np.ndarray]:
        """The used part of each framed buffer, in order (`framed` must be set)."""
        return _used(self.framed, self.n)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        i %= self.n
        rows = len(self.chunks[0])
        return self.chunks[i // rows][i % rows]

    def __iter__(self) -> Any:
        for part in self.parts():
            yield from part

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        parts = self.parts()
        arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return arr if dtype is None else arr.astype(dtype)


def _used(chunks: list[np.ndarray], n: int) -> list[np.ndarray]:
    out, left = [], n
    for chunk in chunks:
        if left <= 0:
            break
        out.append(chunk[:left])
        left -= len(out[-1])
    return out


# Finished episodes whose chunks a column that waits (`take(wait=True)`) lets
# the writer hold before it waits for one back instead of making a new one:
# one being written, one queued behind it, so the writer never idles.
_IN_FLIGHT = 2
# How long such a wait lasts at most (a writer that stopped returning chunks).
_WAIT_MAX = 5.0


def put_row(
    rows: np.ndarray,
    flat: memoryview,
    i: int,
    row_nbytes: int,
    value: np.ndarray,
    keep_gil: bool,
) -> None:
    """Copies a checked `value` into row `i` of `rows` (`flat`: `rows` as bytes).

    With `keep_gil` the copy goes through a memoryview, which keeps the GIL;
    numpy's copy releases it for a large row. Image frames keep it: the env
    thread would otherwise queue behind the encoding threads to get it back.
    Other large rows let it go: the writer thread, whose episode writes run
    mostly without the GIL, needs it between them, and an env thread that
    never lets go makes it wait out the 5 ms switch interval each time (raw
    84x84x3 frames: 20 -> 16 us/step, benchmarks/REPORT.md).
    """
    if keep_gil and value.flags.c_contiguous:
        flat[i * row_nbytes : (i + 1) * row_nbytes] = memoryview(value).cast("B")
    else:
        rows[i] = value


class BufferPool:
    """Recycles the buffers of large-row columns between episodes.

    A fresh multi-megabyte buffer costs a page fault per page at its first
    touch, more than the copy of the rows into it (on a virtual machine,
    about as much as writing the same bytes to a file); the writer thread
    hands each episode's buffers back here once its record is written. A
    column that asks to (`wait=True`) waits for one back while the writer
    holds the chunks of `_IN_FLIGHT` finished episodes, so a recording whose
    env outruns its writer keeps two episodes' chunks, not one per queued
    episode. `prefill` makes warm spares on a background thread. At `close`
    the free buffers go to a small process-wide store (`chunk_spares`) that the
    next recording's pool takes from.
    """

    def __init__(self, max_per_key: int = 3):
        self._free: dict[str, list[np.ndarray]] = {}
        self._max = max_per_key
        self._cap: dict[str, int] = {}
        self._shared: set[str] = set()  # keys that asked for shared buffers
        self._lent: dict[str, int] = {}  # chunks held by finished, unwritten episodes
        self._per_episode: dict[str, int] = {}  # chunks the last finished episode took
        # Entered as the lock itself (C code), not as the Condition, whose Python
        # __enter__/__exit__ a Ctrl-C can interrupt with the lock held, leaving
        # the writer thread waiting for it forever. Reentrant: a finished
        # episode's __del__ (`returned`) may run, from the garbage collector,
        # in a thread that holds it.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._pid = os.getpid()
        self._closed = False

    def expect(self, key: str, chunks: int) -> None:
        """An episode of `key` took `chunks` buffers: keep enough for the episodes in flight."""
        with self._lock:
            self._cap[key] = max(self._cap.get(key, self._max), chunks * self._max)

    def take(
        self,
        key: str,
        capacity: int,
        shape: tuple,
        dtype: np.dtype,
        shared: bool = False,
        wait: bool = False,
    ) -> np.ndarray:
        """A buffer for `key`: a recycled or prefilled one if any, else a new one.

        `shared` buffers live in shared memory (`shared_frames`), where the
        image-encoding processes read them; a key always asks for the same kind.
        With `wait`, a take that finds none free while the writer holds the
        chunks of `_IN_FLIGHT` finished episodes of `key` waits for one back.
        """
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's chunks are not ours
                self._forget_parent()
            if shared:
                self._shared.add(key)
            deadline = None
            while True:
                free = self._free.get(key)
                while free:
                    buf = free.pop()
                    if not shared or is_shared(buf):
                        return buf
                limit = _IN_FLIGHT * self._per_episode.get(key, 1)
                if not wait or self._lent.get(key, 0) < limit:
                    break
                now = time.monotonic()
                deadline = deadline or now + _WAIT_MAX
                if now >= deadline:
                    break
                self._cond.wait(deadline - now)
        dtype = np.dtype(dtype)
        nbytes = capacity * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        spare = _spares.take(nbytes, shared)
        if spare is not None:
            return spare.view(dtype).reshape((capacity,) + tuple(shape))
        return _new_buffer((capacity,) + tuple(shape), dtype, shared)

    def give(self, key: str, buf: np.ndarray) -> None:
        # A key that now asks for shared buffers lets its ordinary ones go
        # (image chunks made before the encoding processes started).
        if key in self._shared and not is_shared(buf):
            return
        with self._lock:
            if self._closed:
                _spares.put(buf, key in self._shared)
                return
            free = self._free.setdefault(key, [])
            if len(free) < self._cap.get(key, self._max):
                free.append(buf)
                self._cond.notify_all()

    def lend(self, keys: list[str]) -> None:
        """A finished episode holds these chunks (one key per chunk) until it is written."""
        counts: dict[str, int] = {}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        with self._lock:
            for key, n in counts.items():
                self._lent[key] = self._lent.get(key, 0) + n
                self._per_episode[key] = n

    def returned(self, key: str, buf: np.ndarray | None) -> None:
        """A lent chunk is back (`buf`), or gone with an episode never written (None)."""
        with self._lock:
            self._lent[key] = max(0, self._lent.get(key, 0) - 1)
            self._cond.notify_all()
        if buf is not None:
            self.give(key, buf)

    def close(self) -> None:
        """The recording is over: its free buffers go to the process's spares (bounded)."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, {}
            mine = self._pid == os.getpid()
        for key, bufs in free.items():
            for buf in bufs:
                if mine:
                    _spares.put(buf, key in self._shared)

    def _forget_parent(self) -> None:
        self._free.clear()
        self._lent.clear()
        self._pid = os.getpid()

    def prefill(
        self, key: str, capacity: int, shape: tuple, dtype: np.dtype, shared: bool = False
    ) -> None:
        """Asks for one warm spare of `capacity` rows for `key`, made in the background.

        Does nothing if a spare is already free (every buffer of a key has the
        same shape: the chunks of one field).
        """
        with self._lock:
            if self._free.get(key):
                return
        _prefill_requests().put((self, key, capacity, shape, dtype, shared))


_prefill_lock = threading.Lock()
_prefill_queue: queue.SimpleQueue | None = None


def _prefill_requests() -> queue.SimpleQueue:
    """The queue of the one background thread that makes warm spares for every pool."""
    global _prefill_queue
    with _prefill_lock:
        if _prefill_queue is None:
            _prefill_queue = queue.SimpleQueue()
            thread = threading.Thread(
                target=_prefill_loop, args=(_prefill_queue,), name="rlds_writer_buffers"
            )
            thread.daemon = True
            thread.start()
        return _prefill_queue


def _prefill_loop(requests: queue.SimpleQueue) -> None:
    while True:
        pool, key, capacity, shape, dtype, shared = requests.get()
        pool.give(key, _new_buffer((capacity,) + shape, dtype, shared, warm=True))


def _new_buffer(shape: tuple, dtype: np.dtype, shared: bool, warm: bool = False) -> np.ndarray:
    """A new buffer; `warm` allocates every page now, not at its first touch."""
    if shared:
        return shared_empty(shape, dtype, populate=warm)
    buf = np.empty(shape, dtype=dtype)
    if warm:
        buf.fill(0)
    return buf


def _estimate_nbytes(columns: Mapping[str, Any]) -> int:
    """Approximate memory held by an episode's columns (for the writer's budget)."""
    total = 0
    for values in columns.values():
        if type(values) is PackedColumn:
            total += len(values.payload)
        elif hasattr(values, "nbytes"):  # arrays, and frames encoded as they came
            total += values.nbytes
        elif isinstance(values, RowBytes):
            total += len(values.rows) * (len(values.rows[0]) if values.rows else 0)
        elif values and isinstance(values[0], np.ndarray):
            # Chunked rows (images waiting to be encoded, large tensors): count their
            # bytes, or a camera episode would look small enough to encode inline.
            total += values[0].nbytes * len(values)
        else:
            total += 64 * len(values)
    return total


class Episode:
    """A finished episode, ready to encode.

    Attributes:
      columns: per-step field key -> column (array or list), RLDS-aligned.
      episode_values: episode-level field key -> value.
      num_steps: number of steps.
      nbytes: approximate size of the columns in memory.
    """

    __slots__ = ("columns", "episode_values", "num_steps", "nbytes", "_buffers", "_pool")

    def __init__(
        self,
        columns: dict[str, Any],
        episode_values: dict[str, Any],
        num_steps: int,
        buffers: list[tuple[str, np.ndarray]] | None = None,
        pool: BufferPool | None = None,
    ):
        self.columns = columns
        self.episode_values = episode_values
        self.num_steps = num_steps
        self.nbytes = _estimate_nbytes(columns)
        self._buffers = buffers or []
        self._pool = pool
        if pool is not None and self._buffers:
            pool.lend([key for key, _ in self._buffers])

    def release(self) -> None:
        """Drops the episode's data once it is written, recycling large buffers.

        The columns must not be used afterwards.
        """
        if self._pool is not None:
            for key, buf in self._buffers:
                self._pool.returned(key, buf)
        self._buffers = []
        self.columns = {}
        self.episode_values = {}

    def __del__(self) -> None:
        # Never written (the writer failed or was closed): its chunks are not
        # coming back, so the pool must not wait for them.
        buffers = getattr(self, "_buffers", None)
        if buffers and self._pool is not None:
            for key, _ in buffers:
                self._pool.returned(key, None)
