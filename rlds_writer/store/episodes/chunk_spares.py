"""Chunks of large-row columns that closed recordings leave to the next ones of the process.

A fresh multi-megabyte chunk costs a page fault per page at its first touch
(on a virtual machine about as much as writing the same bytes to a file), so
a process that records one dataset after another keeps a few: bounded in
bytes (`_SPARE_BYTES`), let go after `_SPARE_IDLE` seconds unused, and never
handed out in a forked child. `episode_data.BufferPool` puts a closed
recording's free chunks here and takes from here before making new ones.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from rlds_writer.store.episodes.shared_frames import is_shared

# Bytes of chunks closed recordings leave for the next ones of the process,
# and how long they are kept unused before they are let go.
_SPARE_BYTES = 32 << 20
_SPARE_IDLE = 30.0


class _Spares:
    """Chunks of closed recordings, for the next recording of this process.

    Bounded in bytes, let go after `_SPARE_IDLE` seconds unused, and never
    handed out in a forked child (its copies of the parent's chunks would
    fault page by page on first write; shared ones are the parent's memory).
    Chunks are kept as flat bytes and matched by size, whatever their field.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[int, bool, np.ndarray]] = []  # (nbytes, shared, flat bytes)
        self._nbytes = 0
        self._last_use = 0.0
        self._timer: threading.Timer | None = None

    def put(self, buf: np.ndarray, shared: bool) -> None:
        if shared and not is_shared(buf):
            return
        flat = buf.reshape(-1).view(np.uint8)
        with self._lock:
            if self._nbytes + flat.nbytes > _SPARE_BYTES:
                return  # dropped: freed with its last reference
            self._items.append((flat.nbytes, shared, flat))
            self._nbytes += flat.nbytes
            self._last_use = time.monotonic()
            if self._timer is None:
                self._schedule(_SPARE_IDLE)

    def take(self, nbytes: int, shared: bool) -> np.ndarray | None:
        with self._lock:
            for i, (size, kind, flat) in enumerate(self._items):
                if size == nbytes and kind == shared:
                    del self._items[i]
                    self._nbytes -= size
                    self._last_use = time.monotonic()
                    return flat
        return None

    def clear(self) -> None:
        with self._lock:
            self._items = []
            self._nbytes = 0
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _schedule(self, delay: float) -> None:
        timer = threading.Timer(delay, self._drop_if_idle)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # interpreter shutdown (a recording closed at exit): keep none
            self._items = []
            self._nbytes = 0
            return
        self._timer = timer

    def _drop_if_idle(self) -> None:
        with self._lock:
            self._timer = None
            idle = time.monotonic() - self._last_use
            if idle >= _SPARE_IDLE:
                self._items = []
                self._nbytes = 0
            elif self._items:
                self._schedule(_SPARE_IDLE - idle)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._items = []
        self._nbytes = 0
        self._timer = None


spares = _Spares()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=spares._after_fork)
