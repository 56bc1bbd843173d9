"""Frame buffers in shared memory, readable by the image-encoding processes.

The recorder copies each camera frame once, into a chunk from its
`BufferPool`. Image columns take those chunks from here: slices of one
`memfd` file (the *arena*), so an encoding process that maps the same file
reads the frames where they are, with no second copy and no pickling. One file
serves every chunk of the process, so a long episode costs one file
descriptor, not one per chunk.

A chunk's slice goes back to the arena when the last array using it is
garbage-collected; its pages are then freed (`MADV_REMOVE`) and the slice is
reused for the next chunk of the same size. Shared memory is not backed by
huge pages here, so a new chunk's first touch costs about 4x that of ordinary
memory: chunks are recycled (`BufferPool`) and made ahead, pages populated, on
a background thread. Where `memfd_create` is missing (not Linux),
`shared_empty` returns ordinary arrays and encoding stays in this process.
Image columns take shared chunks only once image processes have started in the
process (`want`/`wanted`): a recording that never starts them keeps its frames
in ordinary memory, which is cheaper to fault in.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

_PAGE = mmap.PAGESIZE


class Arena:
    """One growing `memfd` file cut into page-aligned slices, one per chunk.

    Attributes:
      fd: the file's descriptor (passed to the encoding processes).
      pid: the process that made it (a forked child makes its own).
    """

    def __init__(self) -> None:
        self.fd = os.memfd_create("rlds_writer_frames", os.MFD_CLOEXEC)
        self.pid = os.getpid()
        self._size = 0
        self._free: dict[int, list[int]] = {}  # slice length -> offsets
        self._lock = threading.Lock()
        # id(mmap of a slice) -> (weak ref to it, offset in the file, address of its first byte)
        self._slices: dict[int, tuple[weakref.ref, int, int]] = {}

    def empty(self, shape: tuple[int, ...], dtype: Any, populate: bool = False) -> np.ndarray:
        """An uninitialised C-order array in a slice of the file.

        Args:
          shape: the array's shape.
          dtype: its dtype.
          populate: allocate its pages now (`MAP_POPULATE`), not at first touch.
        """
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        length = max(_PAGE, -(-count * dtype.itemsize // _PAGE) * _PAGE)
        with self._lock:
            free = self._free.get(length)
            if free:
                offset = free.pop()
            else:
                offset = self._size
                os.ftruncate(self.fd, offset + length)
                self._size = offset + length
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        try:
            view = mmap.mmap(self.fd, length, flags=flags, offset=offset)
        except BaseException:
            with self._lock:
                self._free.setdefault(length, []).append(offset)
            raise
        arr = np.frombuffer(view, dtype, count).reshape(shape)
        key = id(view)
        self._slices[key] = (weakref.ref(view), offset, arr.ctypes.data)
        release = weakref.finalize(view, self._release, key, offset, length)
        # Not at exit: `finalize`'s exit hook runs before the recorder's, which
        # still encodes the open episodes from these slices (the file goes
        # with the process anyway).
        release.atexit = False
        return arr

    def _release(self, key: int, offset: int, length: int) -> None:
        self._slices.pop(key, None)
        try:
            # Free the pages now: the slice may wait long for a chunk of its size.
            hole = mmap.mmap(self.fd, length, offset=offset)
            hole.madvise(mmap.MADV_REMOVE)
            hole.close()
        except (OSError, ValueError):
            pass
        with self._lock:
            self._free.setdefault(length, []).append(offset)

    def locate(self, arr: np.ndarray) -> int | None:
        """The file offset of a C-contiguous array that lies in this arena, else None."""
        if not arr.flags.c_contiguous:
            return None
        base = arr
        while isinstance(base, np.ndarray):
            base = base.base
        owner = base.obj if isinstance(base, memoryview) else base
        entry = self._slices.get(id(owner))
        if entry is None or entry[0]() is not owner:
            return None
        _, offset, address = entry
        return offset + (arr.ctypes.data - address)


_arena: Arena | None = None
_arena_lock = threading.Lock()


def arena() -> Arena | None:
    """This process's arena (made on first use), or None where `memfd` is missing."""
    global _arena
    if not hasattr(os, "memfd_create") or not hasattr(mmap, "MADV_REMOVE"):
        return None
    with _arena_lock:
        # A forked child must not hand out slices of its parent's file.
        if _arena is None or _arena.pid != os.getpid():
            try:
                _arena = Arena()
            except OSError:
                return None
        return _arena


# How many started pools of image-encoding processes this process has (and
# its pid: a forked child has none). While there are none, image columns keep
# their frames in ordinary memory, whose first touch costs a tenth of shared
# memory's (benchmarks/REPORT.md, "Where the time goes"), so a recording that
# never starts a process pays nothing for them.
_users = 0
_users_pid: int | None = None


def wanted() -> bool:
    """Whether frames should go to shared memory: image processes run in this process."""
    return _users > 0 and _users_pid == os.getpid()


def want() -> None:
    """A pool of image processes started: image chunks made from now on are shared."""
    global _users, _users_pid
    with _arena_lock:
        if _users_pid != os.getpid():
            _users, _users_pid = 0, os.getpid()
        _users += 1


def unwant() -> None:
    """A pool that called `want` closed."""
    global _users
    with _arena_lock:
        if _users_pid == os.getpid() and _users > 0:
            _users -= 1


def is_shared(arr: np.ndarray) -> bool:
    """Whether `arr` lies in this process's arena."""
    shared = _arena if _arena is not None and _arena.pid == os.getpid() else None
    return shared is not None and shared.locate(arr) is not None


def shared_empty(shape: tuple[int, ...], dtype: Any, populate: bool = False) -> np.ndarray:
    """An uninitialised array the encoding processes can read (ordinary memory if they cannot).

    Args:
      shape: the array's shape.
      dtype: its dtype.
      populate: allocate its pages now, not at first touch (for buffers made ahead).
    """
    shared = arena()
    if shared is not None:
        try:
            return shared.empty(shape, dtype, populate)
        except OSError:  # out of address space or descriptors: ordinary memory still records
            pass
    return np.empty(shape, dtype=dtype)
