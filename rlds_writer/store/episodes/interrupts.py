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

It costs two `sigaction` calls (about 0.2 µs each) and about as much
Python per span, paid once per episode, never per step, and only in the
main thread (the only one Python interrupts); a span inside another costs a
look at the handler in place. Where the program ignores SIGINT or left it to
the system, nothing is done.
"""

from __future__ import annotations

import _signal
import _thread
import atexit
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)

_SIGINT = _signal.SIGINT
_getsignal = _signal.getsignal
_setsignal = _signal.signal
_get_ident = _thread.get_ident

# The thread Python runs signal handlers in: the main thread, or in a forked
# child the thread that forked. An int compared per span, not
# `threading.current_thread() is threading.main_thread()` (two calls and a
# dict lookup).
_main = threading.main_thread().ident
# The same, in a box that `held`'s spans keep a reference to; None once the
# interpreter exits (atexit): what runs after that (a `__del__`'s close())
# holds nothing back, and no longer needs this module's names.
_main_thread = [_main]


def _after_fork() -> None:
    global _main
    _main = _main_thread[0] = _get_ident()


def _at_exit() -> None:
    _main_thread[0] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
atexit.register(_at_exit)


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
        _setsignal(_SIGINT, self.previous)
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
        if _get_ident() != _main:
            return  # Python interrupts only the main thread
        previous = _getsignal(_SIGINT)
        if type(previous) is _Held:  # nested in a span already: it says what is finished
            previous.message = previous.message or self._message
            return
        if not callable(previous):
            return  # SIGINT is ignored, or the system's
        self._held = held = _Held(previous, self._message)
        _setsignal(_SIGINT, held)

    def __exit__(self, *exc: Any) -> None:
        held = self._held
        if held is None:
            return
        self._held = None
        _release(held)


def _release(held: _Held) -> None:
    """Ends a span: the program's handler back, and a Ctrl-C held meanwhile raised."""
    if _getsignal(_SIGINT) is held:
        _setsignal(_SIGINT, held.previous)
    if held.count == 1:
        held.previous(_SIGINT, sys._getframe(1))


def held(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` with a Ctrl-C held back until it returns (`deferred`).

    The span written out rather than a `deferred` entered: an episode's end
    takes one, and an object with two method calls cost as much again.
    """

    # Bound here, not looked up at the call: a `close()` that a `__del__` runs at
    # interpreter exit finds this module's names set to None (gymnasium's
    # VectorEnv.__del__ printed "'NoneType' object is not callable").
    get_ident, getsignal, setsignal, sigint = _get_ident, _getsignal, _setsignal, _SIGINT
    held_type, release, main = _Held, _release, _main_thread

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if get_ident() != main[0]:  # another thread, or after exit began (None)
            return method(*args, **kwargs)
        previous = getsignal(sigint)
        if type(previous) is held_type or not callable(previous):
            return method(*args, **kwargs)  # nested in a span, or SIGINT not Python's
        held = held_type(previous, None)
        setsignal(sigint, held)
        try:
            return method(*args, **kwargs)
        finally:
            release(held)

    return call
