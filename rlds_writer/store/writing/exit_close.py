"""What is still open at interpreter exit is closed: recorders first, then bare writers.

A recorder (an adapter's open episode) holds an episode its writer knows
nothing of; closing it first writes that episode, cut short, before the
writers close and commit. Both are held weakly: registering keeps nothing alive.
A forked child forgets its parent's: they are the parent's to close (closing
them in the child wrote into the parent's open shard through the shared file
offset and removed the parent's lock); a recorder or writer a child uses
refuses (`errors.ForkedRecorderError`).
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import Any

_log = logging.getLogger(__name__)

# Recorders (adapters' open episodes) closed at exit before the bare writers.
_OPEN_RECORDERS: weakref.WeakSet = weakref.WeakSet()
_OPEN_WRITERS: weakref.WeakSet = weakref.WeakSet()


def close_at_exit(recorder: Any) -> None:
    """Closes `recorder` (anything with `close()`) at interpreter exit, held weakly.

    A recorder holds an open episode its writer knows nothing of; closing it
    first writes that episode, cut short, before the writers close.
    """
    _OPEN_RECORDERS.add(recorder)


def close_writer_at_exit(writer: Any) -> None:
    """Closes a `DatasetWriter` at interpreter exit (after the recorders), held weakly."""
    _OPEN_WRITERS.add(writer)


def closed(writer: Any) -> None:
    """Forgets a writer closed by its owner."""
    _OPEN_WRITERS.discard(writer)


@atexit.register
def _close_open_writers() -> None:
    for recorder in list(_OPEN_RECORDERS):
        try:
            recorder.close()
        except Exception as e:  # noqa: BLE001
            _log.error("closing a recorder at exit failed: %s", e)
    for writer in list(_OPEN_WRITERS):
        try:
            writer.close()
        except Exception as e:  # noqa: BLE001
            _log.error("closing %s at exit failed: %s", writer.path, e)


# This process's id, kept here and set again in a forked child (below): the
# fork checks of every episode's begin, end and hand-over compare with it
# instead of asking the system (`os.getpid()` is a system call, 0.1-0.5 µs).
_pid = os.getpid()


def process_id() -> int:
    """`os.getpid()`, without the system call: what a recorder or writer compares its own with."""
    return _pid


def forked_message(path: Any, pid: int) -> str:
    """The error of a forked child that used its parent's recorder or writer of `path`."""
    return (
        f"{path}: this recorder belongs to process {pid}, and process {os.getpid()} is a "
        "forked child of it, which must not write into its parent's open files: make the "
        "recorder (the env wrapper) in the child, with a data_directory of its own"
    )


def _forget_the_parents() -> None:
    global _pid
    _pid = os.getpid()
    for recorder in list(_OPEN_RECORDERS):
        inherited = getattr(recorder, "inherited", None)
        if inherited is not None:
            inherited()  # so that the child's use of it is refused, never silent
    _OPEN_RECORDERS.clear()
    _OPEN_WRITERS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_parents)
