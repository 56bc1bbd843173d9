"""The writer thread's queue items, and what a closing caller takes off the queue.

Items are `(split, episode)` (an `Episode` or an `EpisodeBatch`), `(LANE,
batches)` moved off the batch lane (`batch_lane.py`), or a marker in place of
the split. `close()` writes what is queued itself when the writer thread
holds nothing it took (`take_unheld`): waking the thread to do it would cost
the closing caller the thread's wake-up and the GIL's hand-overs
(milliseconds on a busy machine), for a batched recording's last batches,
its open episodes cut short among them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlds_writer.store.writing.batch_lane import LANE, WAKE
from rlds_writer.store.writing.batch_records import EpisodeBatch

# Markers, objects so that no split name is one.
FLUSH = object()
CLOSE = object()
STOP = object()  # ends the thread; the closing caller finishes the shards


def take_unheld(queued: Any, episodes: int, lane: Any) -> list[tuple[Any, Any]] | None:
    """Takes every item off `queued` (the queue's deque, its mutex held), then the
    batch `lane`'s pending batches (handed over after them; its `lock` held), if
    the `episodes` handed over and the lane's batches not yet written are all
    there; else None, nothing taken: the writer thread holds some, which go first."""
    on_queue = sum(1 for kind, _ in queued if type(kind) is str)
    batches = sum(len(payload) for kind, payload in queued if kind is LANE)
    if on_queue != episodes or batches + lane.waiting != lane.handed - lane.done:
        return None
    taken = list(queued)
    queued.clear()
    pending = lane.take_all()
    if pending:
        taken.append((LANE, pending))
    return taken


def in_runs(taken: list[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """The items to write in order (not `WAKE`s), batches of a split queued in a
    row as one list, as the writer thread takes them (one encode, one append)."""
    at = 0
    while at < len(taken):
        kind, payload = taken[at]
        at += 1
        if kind is WAKE:
            continue
        if type(payload) is EpisodeBatch:
            payload = [payload]
            while at < len(taken) and taken[at][0] == kind and type(taken[at][1]) is EpisodeBatch:
                payload.append(taken[at][1])
                at += 1
        yield kind, payload
