"""Ctrl-C held back while the recording's shared state changes hands.

Python raises `KeyboardInterrupt` in the main thread at almost any
instruction, including inside `threading.Condition.__exit__` before it
releases its lock, inside `queue.Queue.put`, or between the steps of an
episode's hand-over to the writer. A Ctrl-C landing there left a lock held
that the writer thread then waited on forever (`close()` never returned), or
left the image processes' bookkeeping half-done, or dropped the episode being
handed over. `deferred()` holds a SIGINT back for the span of such a
hand-over (an episode's end, `flush`, `close`) and raises it where the span
ends, when everything is consistent again; a second Ctrl-C within the span
is raised at once (the user insists; `rlds_writer.recover` repairs what was
cut).

It costs two `sigaction` calls (about 2 µs) per span, paid once per episode,
never per step, and only in the main thread (the only one Python interrupts).
Where the program ignores SIGINT or left it to the system, nothing is done.
"""

from __future__ import annotations

import _signal
import functools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)

_SIGINT = _signal.SIGINT


class _Held:
    """The handler in place during a span: remembers the first SIGINT, passes on a second."""

    __slots__ = ("previous", "count", "message")

    def __init__(self, previous: Any, message: str | None):
        self.previous = previous
        self.count = 0
        self.message = message

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            if self.message:
                _log.warning("Ctrl-C: %s first (Ctrl-C again stops at once)", self.message)
            return
        # Asked twice: the program's handler (KeyboardInterrupt) runs now.
        _signal.signal(_SIGINT, self.previous)
        self.previous(signum, frame)


class deferred:  # noqa: N801 - used as `with deferred():`, like a function
    """Holds a Ctrl-C (SIGINT) back until the `with` block ends, then raises it there.

    Args:
      message: logged when a Ctrl-C is held back, for spans that may last
        (`close`): what is being finished. None logs nothing.
    """

    __slots__ = ("_held", "_message")

    def __init__(self, message: str | None = None):
        self._message = message
        self._held: _Held | None = None

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python interrupts only the main thread
        previous = _signal.getsignal(_SIGINT)
        if type(previous) is _Held:  # nested in a span already: it says what is finished
            previous.message = previous.message or self._message
            return
        if not callable(previous):
            return  # SIGINT is ignored, or the system's
        self._held = held = _Held(previous, self._message)
        _signal.signal(_SIGINT, held)

    def __exit__(self, *exc: Any) -> None:
        held = self._held
        if held is None:
            return
        self._held = None
        if _signal.getsignal(_SIGINT) is held:
            _signal.signal(_SIGINT, held.previous)
        if held.count == 1:
            held.previous(_SIGINT, sys._getframe())


def held(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` with a Ctrl-C held back until it returns (`deferred`)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with deferred():
            return method(*args, **kwargs)

    return call
