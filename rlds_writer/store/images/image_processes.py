"""Image encoding in worker processes, reading frames from shared memory.

Threads do not scale JPEG: Pillow holds the GIL while it unpacks RGB pixels
and sets up each save, so two encoding threads reach about 1.3-1.5x one. This
pool starts `image_worker` processes (on first use, off the env thread) and
hands them batches of frames by position in the shared-frame file
(`shared_frames`), where the recorder's image columns keep their frames: they
are neither copied nor pickled. Frames from elsewhere (a converter's arrays)
are first copied into a worker's slot in that file. Each batch comes back
over a socket as ready `BytesList` entries, which are written as they are: the
recording process does no work per frame.

If a worker cannot start or dies, `submit` or `wait` raises `WorkersLost`; the encoder
then encodes in its own process from that episode on, so no episode is lost.

Started pools outlive the dataset that started them: `give_back` keeps an idle
pool for the next recording in this process (`take_started`), which then pays
no start-up (about 0.5 s of wall time and 0.8 s of CPU for two workers). An
idle pool is closed after `IDLE_SECONDS`, by `shutdown()` or at exit.
"""

from __future__ import annotations

import atexit
import collections
import importlib
import os
import pickle
import selectors
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from rlds_writer import errors
from rlds_writer.store.episodes import shared_frames
from rlds_writer.store.images.image_worker import FAILED, RESULT_HEADER

# Tasks queued per worker: the next batch is waiting when one finishes.
_IN_FLIGHT = 2
# Frames per task at most; fewer toward the end of the frames, so both workers
# finish together, and when frames are large, to bound a slot's size.
_MAX_BATCH = 32
_SLOT_BYTES = 8 << 20
# Room in the result socket for a whole batch: the worker writes it in one go
# and starts its next task instead of waiting for this process to read.
_RESULT_BUFFER = 4 << 20
# A batch of frames takes milliseconds; a worker silent this long is stuck.
_STALL_SECONDS = 120.0
# An idle started pool is kept this long for the next recording (as loky keeps
# its workers), then closed: two idle Python processes hold ~60 MB.
IDLE_SECONDS = 300.0
# Idle pools kept at most (more only when several datasets closed together).
_MAX_IDLE = 2


class WorkersLost(errors.EncodingError):
    """An encoding process could not start, died or stalled."""


class BatchFailed(errors.EncodingError):
    """A worker could not encode a frame (the message says why).

    Attributes:
      job: the index of the job the frame belongs to.
    """

    def __init__(self, job: int, message: str):
        super().__init__(message)
        self.job = job


def supported() -> bool:
    """Whether this system can run the pool (Linux: `memfd` and descriptor passing)."""
    return (
        bool(sys.executable)
        and hasattr(socket, "send_fds")
        and hasattr(socket, "SOCK_SEQPACKET")
        and shared_frames.arena() is not None
    )


# The worker runs in isolated mode (`-I`): neither the working directory nor
# PYTHONPATH nor the user's site-packages is on its path, so a `mmap.py` (or
# any module named like one it imports) lying where the user works is never
# imported into it. The directories this process found the package and the
# worker's dependencies in are put back explicitly, after the standard library
# and before site-packages (a checkout then wins over an installed copy, as it
# does here).
_BOOTSTRAP = (
    "import os, site, sys\n"
    "known = set(site.getsitepackages())\n"
    "at = next((i for i, p in enumerate(sys.path) if p in known), len(sys.path))\n"
    "sys.path[at:at] = [p for p in sys.argv[1].split(os.pathsep) if p and p not in sys.path]\n"
    "from rlds_writer.store.images.image_worker import main\n"
    "main(sys.argv[2:])\n"
)


def _import_path() -> str:
    """Where this process found what the worker imports: absolute directories only."""
    dirs = []
    for name in ("rlds_writer", "numpy", "PIL"):
        try:
            module = importlib.import_module(name)
        except ImportError:  # the worker reports it when it first encodes
            continue
        # A package's `__file__` is `<dir>/<name>/__init__.py`.
        top = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))
        if top not in dirs:
            dirs.append(top)
    return os.pathsep.join(dirs)


class _Worker:
    __slots__ = ("process", "requests", "results", "has_fd", "slots", "sent", "in_flight")

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        results_ours, results_theirs = socket.socketpair()
        if _RESULT_BUFFER:
            try:  # the system's limit (net.core.wmem_max) caps it
                results_theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _RESULT_BUFFER)
            except OSError:
                pass
        fds = (theirs.fileno(), results_theirs.fileno())
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOTSTRAP, _import_path(), *map(str, fds)],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                # Out of the terminal's process group: Ctrl-C stops the env
                # loop, and the worker still encodes what the recorder then
                # writes. It ends with its sockets, whatever ends the recorder.
                start_new_session=True,
            )
        except BaseException:
            for sock in (ours, results_ours):
                sock.close()
            raise
        finally:
            theirs.close()
            results_theirs.close()
        self.requests = ours
        self.results = results_ours
        self.has_fd = False
        # Per task in flight, a slot in the shared file for frames from elsewhere;
        # used in turn (a worker answers in order, so a slot is free when reused).
        self.slots: list[np.ndarray | None] = [None] * _IN_FLIGHT
        self.sent = 0
        self.in_flight = 0

    def send(self, task: int, codec: str, quality: int, frames: np.ndarray) -> None:
        """Asks the worker to encode `frames` (copied into a free slot if not shared)."""
        arena = shared_frames.arena()
        offset = arena.locate(frames)
        if offset is None:
            i = self.sent % _IN_FLIGHT
            slot = self.slots[i]
            if slot is None or slot.nbytes < frames.nbytes:
                slot = self.slots[i] = arena.empty((frames.nbytes,), np.uint8)
            staged = slot[: frames.nbytes].view(frames.dtype).reshape(frames.shape)
            np.copyto(staged, frames)
            offset = arena.locate(staged)
        message = pickle.dumps(
            (task, codec, quality, offset, len(frames), frames.shape[1:], frames.dtype.str)
        )
        socket.send_fds(self.requests, [message], [] if self.has_fd else [arena.fd])
        self.has_fd = True
        self.sent += 1
        self.in_flight += 1

    def close(self) -> None:
        # Closing the sockets ends the worker's loop; kill it if it does not go.
        self.requests.close()
        self.results.close()
        self.slots = [None] * _IN_FLIGHT
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    # MSG_WAITALL: one call and no zero-filled buffer for a whole result.
    data = sock.recv(n, socket.MSG_WAITALL)
    while len(data) < n:
        more = sock.recv(n - len(data), socket.MSG_WAITALL)
        if not more:
            raise EOFError
        data += more
    return data


class _Batch:
    """The frames of one `submit`: encoded pieces per job, and how many tasks are left."""

    __slots__ = ("out", "left", "error")

    def __init__(self, out: list[list[bytes]], left: int):
        self.out = out
        self.left = left
        self.error: tuple[int, str] | None = None


class ImageProcessPool:
    """Encodes PNG/JPEG frames in `workers` processes.

    Work is submitted as batches (`submit`) and collected with `wait`; a batch
    submitted while an earlier one is collected queues behind it, so the
    workers go on with its frames while the caller writes the earlier one.

    Args:
      workers: number of encoding processes (started on the first `submit`).
    """

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self._pool: list[_Worker] = []
        self._pending: collections.deque = collections.deque()  # (task, batch, ...)
        self._running: dict[int, tuple[int, int, int]] = {}  # task -> (batch, job, piece)
        self._batches: dict[int, _Batch] = {}
        self._next_task = 0
        self._next_batch = 0
        self._selector: selectors.BaseSelector | None = None
        self._wants_shared = False

    def _start(self) -> None:
        try:
            for _ in range(self.workers - len(self._pool)):
                self._pool.append(_Worker())
        except OSError as e:
            self.close()
            raise WorkersLost(f"image-encoding processes could not start ({e})") from e
        # From now on image columns put their frames where the workers read them.
        shared_frames.want()
        self._wants_shared = True
        self._selector = selectors.DefaultSelector()
        for worker in self._pool:
            self._selector.register(worker.results, selectors.EVENT_READ, worker)

    @property
    def started(self) -> bool:
        """Whether the worker processes have been started (and not closed)."""
        return bool(self._pool)

    def reusable(self) -> bool:
        """Started, every worker alive, and no batch or task outstanding."""
        return (
            self.started
            and not self._batches
            and not self._running
            and not self._pending
            and all(worker.process.poll() is None for worker in self._pool)
        )

    def close(self) -> None:
        """Stops the workers; batches not yet collected are lost (`wait` raises)."""
        pool, self._pool = self._pool, []
        if self._wants_shared:
            self._wants_shared = False
            shared_frames.unwant()
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        for worker in pool:
            worker.close()
        self._pending.clear()
        self._running.clear()
        self._batches.clear()

    def encode(self, jobs: Sequence[tuple[str, int, Sequence[np.ndarray]]]) -> list[list[bytes]]:
        """Encodes every frame of `jobs` and waits for them (`submit`, then `wait`)."""
        return self.wait(self.submit(jobs))

    def submit(self, jobs: Sequence[tuple[str, int, Sequence[np.ndarray]]]) -> int:
        """Queues every frame of `jobs` for the workers; returns the batch's handle for `wait`.

        Args:
          jobs: `(codec, quality, parts)` per image field: codec `png` or
            `jpeg`, the JPEG quality, and the frames as arrays with a leading
            frame axis (in shared memory or not: others are copied there).
            The arrays must stay unchanged until the batch is collected.

        Raises:
          WorkersLost: the workers could not start or were lost.
        """
        if not self._pool:
            self._start()
        handle = self._next_batch
        self._next_batch += 1
        left = sum(len(part) for _, _, parts in jobs for part in parts)
        out: list[list[bytes]] = []
        tasks = 0
        for j, (codec, quality, parts) in enumerate(jobs):
            pieces = 0
            for part in parts:
                row = max(1, part[0].nbytes if len(part) else 1)
                i = 0
                while i < len(part):
                    # Guided sizes: large batches (few wake-ups of this thread),
                    # small ones at the end (the workers finish together).
                    size = max(1, min(_MAX_BATCH, left // (2 * self.workers), _SLOT_BYTES // row))
                    frames = part[i : i + size]
                    self._pending.append(
                        (self._next_task, handle, j, pieces, codec, quality, frames)
                    )
                    self._next_task += 1
                    tasks += 1
                    pieces += 1
                    i += len(frames)
                    left -= len(frames)
            out.append([b""] * pieces)
        self._batches[handle] = _Batch(out, tasks)
        self._guard(self._feed_all)
        return handle

    def wait(self, handle: int, between: Callable[[], bool] | None = None) -> list[list[bytes]]:
        """The frames of a submitted batch, once every one is encoded.

        Args:
          handle: what `submit` returned.
          between: called after each result until it returns True (it may
            `submit` the next batch, so the workers do not wait for it).

        Returns:
          Per job, the `BytesList` entries of its frames in order, in pieces
          (`wire.bytes_entries` of consecutive tasks).

        Raises:
          WorkersLost: a worker died or stalled (now or while an earlier batch
            was collected); the pool is closed (nothing of its batches is
            returned).
          BatchFailed: a frame of this batch could not be encoded.
        """
        batch = self._batches.get(handle)
        if batch is None:
            raise WorkersLost("the image-encoding processes were lost before this batch was done")
        while batch.left:
            self._guard(self._collect)
            if between is not None and between():
                between = None
        if between is not None:
            between()
        del self._batches[handle]
        if batch.error is not None:
            raise BatchFailed(*batch.error)
        return batch.out

    def discard(self, handle: int) -> None:
        """Drops a submitted batch that will not be collected (its frames are not encoded)."""
        if self._batches.pop(handle, None) is None:
            return
        kept = [t for t in self._pending if t[1] != handle]
        self._pending.clear()
        self._pending.extend(kept)

    def _guard(self, step) -> None:
        try:
            step()
        except (OSError, EOFError) as e:
            codes = [w.process.poll() for w in self._pool]
            self.close()
            raise WorkersLost(
                f"an image-encoding process was lost ({e!r}; exit codes {codes})"
            ) from e

    def _collect(self) -> None:
        """Reads the results that are ready (waiting for one) and feeds the workers."""
        ready = self._selector.select(_STALL_SECONDS)
        if not ready:
            raise OSError(f"no result for {_STALL_SECONDS:.0f} s")
        for key, _ in ready:
            worker = key.data
            task, size, status = RESULT_HEADER.unpack(
                _recv_exact(worker.results, RESULT_HEADER.size)
            )
            payload = _recv_exact(worker.results, size)
            handle, job, piece = self._running.pop(task)
            worker.in_flight -= 1
            batch = self._batches.get(handle)
            if batch is not None:  # else discarded
                batch.left -= 1
                if status == FAILED:
                    if batch.error is None:
                        batch.error = (job, payload.decode("utf-8", "replace"))
                else:
                    batch.out[job][piece] = payload
            self._feed(worker)

    def _feed_all(self) -> None:
        for worker in self._pool:
            self._feed(worker)

    def _feed(self, worker: _Worker) -> None:
        while self._pending and worker.in_flight < _IN_FLIGHT:
            task, handle, job, piece, codec, quality, frames = self._pending.popleft()
            worker.send(task, codec, quality, np.ascontiguousarray(frames))
            self._running[task] = (handle, job, piece)


# --------------------------------------------------------------------------- reuse

_idle: list[tuple[ImageProcessPool, threading.Timer]] = []
_idle_lock = threading.Lock()


def take_started(workers: int) -> ImageProcessPool | None:
    """An idle, started pool of `workers` processes left by an earlier recording, or None."""
    with _idle_lock:
        for i, (pool, timer) in enumerate(_idle):
            if pool.workers == max(1, workers):
                del _idle[i]
                timer.cancel()
                break
        else:
            return None
    if pool.reusable():
        return pool
    pool.close()  # a worker died while it was idle
    return None


def give_back(pool: ImageProcessPool) -> None:
    """Keeps a pool its user is done with for the next recording, or closes it.

    Only a started pool with nothing outstanding is kept; it is closed after
    `IDLE_SECONDS` unless taken again.
    """
    if not pool.reusable():
        pool.close()
        return
    timer = threading.Timer(IDLE_SECONDS, _close_idle, (pool,))
    timer.daemon = True
    with _idle_lock:
        _idle.append((pool, timer))
        surplus = _idle[:-_MAX_IDLE]
        del _idle[:-_MAX_IDLE]
    timer.start()
    for old, old_timer in surplus:
        old_timer.cancel()
        old.close()


def _close_idle(pool: ImageProcessPool) -> None:
    with _idle_lock:
        kept = [entry for entry in _idle if entry[0] is pool]
        _idle[:] = [entry for entry in _idle if entry[0] is not pool]
    if kept:
        pool.close()


def shutdown() -> None:
    """Closes every idle pool now (they also close after `IDLE_SECONDS` and at exit)."""
    with _idle_lock:
        idle = list(_idle)
        _idle.clear()
    for pool, timer in idle:
        timer.cancel()
        pool.close()


def _forget_after_fork() -> None:
    # A forked child shares the parent's sockets but not its processes: never
    # reuse them (and the lock may have been held by a thread that is not here).
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
