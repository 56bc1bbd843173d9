"""Camera frames encoded while their episode runs, on background threads.

A 256x256 camera frame is 196 KB raw and about 14 KB as a JPEG. Kept raw
until its episode ends, two such cameras hold 40 MB per 100 steps, in memory
faulted in afresh for every episode in flight, and the encoding starts only
when the episode is over. A `FrameStream` copies each frame into a small ring
of the codec's own frames (`FrameCodec.new`, reused, so their memory stays
warm and the copy is the only one), hands them to encoding threads in small
batches as they fill, and gives the finished episode its frames already
encoded (`EncodedFrames`). The env thread waits only when the ring is full,
that is when the encoders are a whole ring behind.

The threads are the process's own (`_threads`), as many as the recording's
`image_workers`, made at the first batch and again in a forked child; the
codecs release the GIL for their pixel work. (One thread costs a little less
CPU per frame, but two record a camera episode in about two thirds of the
time: REPORT.md, "Where the time goes".)
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from rlds_writer import errors
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.images.image_codecs import yield_cpu_to_caller

# Frames per batch handed to a thread: each hand-over wakes a thread, a cost
# a few frames share, while the episode's last batch stays short.
BATCH_FRAMES = 4
# The ring holds this many batches: while one fills, the others encode (each
# ring slot of a 256x256 camera is 256 KB of memory to fault in per recording).
RING_BATCHES = 3


class FrameCodec(Protocol):
    """What a stream needs of a codec: frames to fill, and their encoding."""

    def new(self) -> Any:
        """A frame holder, reused for frame after frame."""

    def fill(self, holder: Any, frame: np.ndarray) -> None:
        """Copies a checked frame into `holder` (on the env thread)."""

    def encode(self, holder: Any) -> bytes:
        """The frame in `holder`, encoded (on an encoding thread)."""


class _Batch:
    """Ring slots handed to a thread together, and what became of them."""

    __slots__ = ("ring", "slots", "results", "error", "done")

    def __init__(self, ring: list[Any]):
        self.ring = ring
        self.slots: list[int] = []
        self.results: list[bytes] = []
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Other:
    """A value TFDS also takes for an image (encoded bytes, a path), kept as it is."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class EncodedFrames:
    """A finished episode's frames of one field: encoded or being encoded, in order.

    Args:
      key: the field's key (named in errors).
      entries: per step, (batch, index in batch) or an `_Other`.
      row_nbytes: one raw frame's size, for the memory estimate.
    """

    __slots__ = ("key", "_entries", "nbytes")

    def __init__(self, key: str, entries: list[Any], row_nbytes: int):
        self.key = key
        self._entries = entries
        # The writer's budget counts what the episode holds once encoded: JPEG
        # frames take about a tenth of their raw size (a guess until encoded).
        self.nbytes = len(entries) * max(row_nbytes // 10, 1)

    def __len__(self) -> int:
        return len(self._entries)

    def result(self, encode_other: Callable[[Any], bytes]) -> list[bytes]:
        """The frames' encoded bytes, waiting for the threads still on them.

        Args:
          encode_other: encodes an `_Other` value as TFDS would.

        Raises:
          EncodingError: naming the field, if a frame could not be encoded.
        """
        out = []
        for entry in self._entries:
            if type(entry) is _Other:
                out.append(encode_other(entry.value))
                continue
            batch, i = entry
            batch.done.wait()
            if batch.error is not None:
                raise errors.EncodingError(
                    f"{self.key}: could not encode ({batch.error})"
                ) from batch.error
            out.append(batch.results[i])
        return out


class FrameStream:
    """The ring of one image field and its hand-over to the encoding threads.

    Args:
      codec: fills and encodes the field's frames.
      threads: how many encoding threads the process keeps at least.
    """

    def __init__(self, codec: FrameCodec, threads: int):
        self.codec = codec
        self.threads = max(1, threads)
        size = BATCH_FRAMES * RING_BATCHES
        self._ring = [codec.new() for _ in range(size)]
        self._owner: list[_Batch | None] = [None] * size  # the batch using each slot
        self._pos = 0
        self._filling = _Batch(self._ring)

    def put(self, frame: np.ndarray) -> tuple[_Batch, int]:
        """Copies a checked frame into the ring; returns its (batch, index) entry."""
        slot = self._pos
        owner = self._owner[slot]
        if owner is not None and owner is not self._filling:
            # The encoders are a whole ring behind. Held from Ctrl-C: the event's
            # lock, left held, would stop the encoding thread that sets it.
            with interrupts.deferred():
                owner.done.wait()
        self.codec.fill(self._ring[slot], frame)
        self._owner[slot] = batch = self._filling
        batch.slots.append(slot)
        self._pos = (slot + 1) % len(self._owner)
        if len(batch.slots) == BATCH_FRAMES:
            self.submit()
        return batch, len(batch.slots) - 1

    def submit(self) -> None:
        """Hands the batch being filled to the threads (the episode's end calls it too)."""
        batch = self._filling
        if not batch.slots:
            return
        self._filling = _Batch(self._ring)
        try:
            _threads(self.threads).put((self.codec, batch))
        except RuntimeError:  # no new thread at interpreter exit: encode here
            _encode(self.codec, batch)

    def drop_last(self, k: int) -> None:
        """Forgets the last `k` frames put, those still in the batch being filled
        (frames already handed over are encoded anyway; the caller drops their entries)."""
        batch = self._filling
        for _ in range(min(k, len(batch.slots))):
            slot = batch.slots.pop()
            self._owner[slot] = None
            self._pos = slot


def submit_frames(codec: FrameCodec, frames: Any, threads: int) -> _Batch:
    """Hands frames (a sequence: `frames[i]` is what `codec.encode` takes) to the threads.

    For frames already copied out of the caller's buffers (a batched env's
    frames of one step): no ring slot, no copy here. Returns the batch; its
    frame `i` is the entry `(batch, i)` of an `EncodedFrames`.
    """
    batch = _Batch(frames)
    batch.slots = range(len(frames))  # type: ignore[assignment]
    try:
        _threads(threads).put((codec, batch))
    except RuntimeError:  # no new thread at interpreter exit: encode here
        _encode(codec, batch)
    return batch


def other(value: Any) -> _Other:
    """The entry of a value TFDS also takes for an image, encoded when written."""
    return _Other(value)


def _encode(codec: FrameCodec, batch: _Batch) -> None:
    try:
        batch.results = [codec.encode(batch.ring[slot]) for slot in batch.slots]
    except BaseException as e:  # noqa: BLE001 -- raised where the episode is written
        batch.error = e
    finally:
        batch.ring = None  # the raw frames are not needed once encoded
        batch.done.set()


def _work(jobs: queue.SimpleQueue) -> None:
    yield_cpu_to_caller()
    while True:
        codec, batch = jobs.get()
        _encode(codec, batch)


_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None, "jobs": None, "count": 0}


def _threads(n: int) -> queue.SimpleQueue:
    """The process's queue of encoding jobs, with at least `n` daemon threads on it."""
    with _lock:
        if _state["pid"] != os.getpid():  # first use, or a forked child: no threads yet
            _state.update(pid=os.getpid(), jobs=queue.SimpleQueue(), count=0)
        jobs = _state["jobs"]
        while _state["count"] < n:
            thread = threading.Thread(
                target=_work, args=(jobs,), name="rlds_writer_frames", daemon=True
            )
            thread.start()
            _state["count"] += 1
        return jobs
