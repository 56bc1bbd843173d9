"""The batch lane: a batch recorder's ended episodes, handed over without waking the writer.

A batch recorder (`record.batch`) ends dozens of episodes on every vector
step, their rows still in its ring (`ring_records.RingCut`). Handing each
step's batch to the writer's queue woke the writer thread once per vector
step or so, and every time the writer thread takes the GIL the env thread,
which lets it go inside numpy's calls, waits for it back and then for the
OS to wake it (50-100 us on a VM): that tail of stalls, not the writer's
CPU, was the recording's overhead (benchmarks/REPORT.md, session 17).

So the hand-over (`put`) is an append to a deque under the GIL: no lock, no
queue, no wake-up. The writer thread wakes on its own clock (`INTERVAL`)
while batches come, or when asked (`wake`: the first batch after it went
idle, more than `wake_bytes` pending, or the recorder's ring about to
overwrite rows a pending batch holds), takes every pending batch at once and
writes them (`write_batches`): their records encoded from the ring in one
call without the GIL, appended to each shard they go to with one write, the
rotations at `max_episodes_per_file` planned before, and the bookkeeping in
one Python segment after. No numpy call on large arrays and no syscall from
Python in between where avoidable: each would let the GIL go and take it back.

Order is the hand-over order: whatever the caller puts on the writer's queue
(an episode, `flush`, `close`) first moves the pending batches there ahead of
it (`move_to`), and the writer thread takes batches from the lane only while
its queue is empty (`take`, under the same lock).
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import time
from typing import Any

from rlds_writer.store.writing.batch_records import BatchRecordEncoder, EpisodeBatch
from rlds_writer.store.writing.exit_close import process_id
from rlds_writer.store.writing.ring_records import encode_batches
from rlds_writer.store.writing.split_shards import SplitShards

# Seconds between the writer thread's wake-ups while batches come: each costs
# the env thread a stall or two; the records are handed to the OS at most
# this late (`flush()` at once).
INTERVAL = 0.02
# The writer's queue item holding batches moved off the lane: `(LANE, [(split, batch)...])`.
LANE = object()
WAKE = object()  # a queue item that only wakes the writer thread


class BatchLane:
    """Ring-held batches waiting for the writer thread, in hand-over order.

    Args:
      wake_queue: the writer thread's queue (`wake` puts `WAKE` on it, `move_to`
        the batches).
      wake_bytes: pending bytes (`EpisodeBatch.nbytes`) past which `put` wakes the
        writer thread before its clock does.
    """

    def __init__(self, wake_queue: queue.Queue, wake_bytes: int):
        self._items: collections.deque[tuple[str, EpisodeBatch]] = collections.deque()
        self._queue = wake_queue
        self.wake_bytes = wake_bytes
        self._lock = threading.Lock()  # held to take batches off (`take`, `move_to`)
        # Counted by one thread each (`x += 1` is not atomic across threads).
        self.handed = 0  # batches put (the caller)
        self.done = 0  # batches written or dropped after a failure (the writer thread)
        self.bytes_in = 0
        self.bytes_out = 0
        self.sleeping = False  # the writer thread sleeps off the lane's clock (it sets it)
        self._nudged = False  # a `WAKE` is on the queue, not yet seen by the writer thread
        self.wakes = 0  # `WAKE`s put (tests count them)

    # ----------------------------------------------------------- the caller

    def put(self, split: str, batch: EpisodeBatch) -> bool:
        """Appends a batch (the recorder's thread); True: more than `wake_bytes` wait."""
        self._items.append((split, batch))
        self.handed += 1
        self.bytes_in += batch.nbytes
        over = self.bytes_in - self.bytes_out > self.wake_bytes
        if self.sleeping or over:
            self.wake()
        return over

    def wake(self) -> None:
        """Wakes the writer thread now, unless a wake-up it has not seen is queued."""
        if not self._nudged:
            self._nudged = True
            self.wakes += 1
            self._queue.put((WAKE, None))

    def move_to(self) -> None:
        """Moves the pending batches onto the writer's queue, ahead of what the caller
        puts there next (an episode, `flush`, `close`): the hand-over order is kept."""
        if not self._items:
            return
        with self._lock:
            items = self._pop_all()
            if items:
                self._queue.put((LANE, items))

    @property
    def lock(self) -> threading.Lock:
        """Held to take batches off. Taken after the writer's I/O lock and before its
        budget and queue's mutex, by every thread (`move_to` puts on the queue holding it)."""
        return self._lock

    def take_all(self) -> list[tuple[str, EpisodeBatch]]:
        """Every pending batch, whatever is queued (`close()`, holding `lock`)."""
        return self._pop_all()

    @property
    def waiting(self) -> int:
        """Pending batches (not yet taken)."""
        return len(self._items)

    @property
    def pending(self) -> bool:
        """Batches wait in the lane (not yet taken)."""
        return bool(self._items)

    @property
    def idle(self) -> bool:
        """Every batch handed over is written (none pending, none being written)."""
        return self.handed == self.done

    @property
    def pending_bytes(self) -> int:
        return self.bytes_in - self.bytes_out

    # ----------------------------------------------------- the writer thread

    def take(self) -> list[tuple[str, EpisodeBatch]]:
        """Every pending batch, if nothing waits on the writer's queue (it goes first)."""
        self._nudged = False  # a `put` from now on may wake the thread again
        if not self._items:
            return []
        with self._lock:
            return [] if self._queue.queue else self._pop_all()

    def _pop_all(self) -> list[tuple[str, EpisodeBatch]]:
        items, popleft = [], self._items.popleft
        for _ in range(len(self._items)):  # each popleft is whole under the GIL
            items.append(popleft())
        return items

    def finished(self, items: list[tuple[str, EpisodeBatch]]) -> None:
        """Counts `items` as written (or dropped): `idle` and the byte budget see them."""
        self.bytes_out += sum(batch.nbytes for _, batch in items)
        self.done += len(items)


class LaneWriting:
    """`DatasetWriter`'s side of the batch lane: the hand-over and the writer thread's
    writes of batches (its attributes: `lane`, `_queue`, `_budget`, `_shards`, ...)."""

    lane: BatchLane
    _queue: queue.Queue
    _budget: threading.Condition
    _lane_waits: bool
    batch_encoder: Any

    def write_deferred(self, batch: EpisodeBatch, split: str | None = None) -> None:
        """Hands over a batch whose rows a batch recorder's ring holds (`RingCut`):
        appended to the batch lane, without waking the writer thread (`batch_lane`).
        Blocks only while more than `max_queue_bytes` of batches wait.

        Raises:
          WriterFailedError: if the writer thread failed earlier.
          WriterClosedError: if the writer is closed.
        """
        if self._error is not None or self._closed or self._pid != process_id():
            self._check()
        lane, most = self.lane, self.max_queue_bytes
        if lane.put(split or self.default_split, batch) and lane.pending_bytes > most:
            with self._budget:
                self._lane_waits = True
                try:
                    while lane.pending_bytes > most:
                        lane.wake()
                        self._budget.wait(0.2)
                        self._check()
                finally:
                    self._lane_waits = False

    def _write_lane(self, items: list[tuple[str, EpisodeBatch]]) -> None:
        """Writes batches taken off the lane (holding the I/O lock), or keeps them after a
        failure as queued episodes are (`_keep_episode`)."""
        try:
            for split, batches in by_split(items):
                if self._error is None:
                    self._guarded(functools.partial(self._write_batches, split, batches, True))
                else:
                    self._keep_episode(split, batches)
        finally:
            self.lane.finished(items)
            if self._lane_waits:
                with self._budget:
                    self._budget.notify_all()

    def _batches(self, split: str, batch: EpisodeBatch) -> list[EpisodeBatch]:
        """`batch` and the batches of `split` queued right after it: encoded in
        one call, appended with one write (this thread alone takes from the queue)."""
        batches, queued = [batch], self._queue.queue
        while queued and queued[0][0] == split and type(queued[0][1]) is EpisodeBatch:
            batches.append(self._queue.get_nowait()[1])
        return batches

    def _write_batches(self, split: str, batches: list[EpisodeBatch], commit: bool) -> None:
        """Writes batches' episodes, their records encoded together, into shards as usual."""
        written = write_batches(self.batch_encoder, self._shards, split, batches)
        self.episodes_written += written.episodes
        self.steps_written += written.steps
        self.bytes_written += written.nbytes
        self._dirty = True
        if commit and time.monotonic() - self._last_commit >= self.commit_interval:
            self._commit()


def by_split(items: list[tuple[str, EpisodeBatch]]) -> list[tuple[str, list[EpisodeBatch]]]:
    """`items` as runs of consecutive batches of one split, in order."""
    runs: list[tuple[str, list[EpisodeBatch]]] = []
    for split, batch in items:
        if runs and runs[-1][0] == split:
            runs[-1][1].append(batch)
        else:
            runs.append((split, [batch]))
    return runs


class Written:
    """What `write_batches` wrote: episodes, steps, record bytes."""

    __slots__ = ("episodes", "steps", "nbytes")

    def __init__(self, episodes: int, steps: int, nbytes: int):
        self.episodes, self.steps, self.nbytes = episodes, steps, nbytes


def write_batches(
    encoder: BatchRecordEncoder, shards: SplitShards, split: str, batches: list[EpisodeBatch]
) -> Written:
    """Writes batches' episodes into `split`'s shards: records encoded together (one
    call without the GIL for those still in the ring), one write per shard they fill.

    Raises:
      OSError, UploadFailedError: as `SplitShards.append_records`.
    """
    buffer, starts, lengths = encode_batches(encoder, batches)
    for batch in batches:  # the records are made: the ring's rows are the recorder's again
        batch.release()
    count = len(starts)
    done = 0
    while done < count:
        # Locally: every shard they go to in one call (the open one, whole ones, the next).
        took = shards.write_run(split, buffer, starts[done:], lengths[done:])
        if took:
            done += took
            continue
        take = min(count - done, shards.room(split))  # one shard per append
        part = slice(done, done + take)
        shards.append_records(split, buffer, starts[part], lengths[part])
        done += take
        shards.rotate_if_full(split)
    # The record bytes from the buffer's length (a sum over the lengths is a numpy
    # call that lets the GIL go for thousands of episodes).
    steps = sum(batch.num_steps for batch in batches)
    return Written(count, steps, len(buffer) - 16 * count)


def keep_batches(
    encoder: BatchRecordEncoder, shards: SplitShards, split: str, batches: list[EpisodeBatch]
) -> int:
    """Batches handed over before a failure, written to the open shard of an object
    store's dataset (kept as a local file at close): see `DatasetWriter._keep_episode`.
    Returns their episodes."""
    buffer, starts, lengths = encode_batches(encoder, batches)
    shards.append_records(split, buffer, starts, lengths)
    for batch in batches:
        batch.release()
    return len(starts)
