"""`StepGuard`: `close()` on another thread than the stepping one waits for the step.

A batched recorder's step writes its rows into the ring, begins and ends
episodes; `close()` reads the same ring to write the open episodes cut short.
Closed from another thread (a shutdown hook, a watchdog) in the middle of a
step, it read rows the step had not written yet (a frame chunk's handle
still None: `TypeError`, the open episodes lost). The step marks itself with
its thread while it runs; `close()` marks the recorder closing, then waits
out a step in progress on another thread; a step that begins after that
refuses (`WriterClosedError`), as every step after `close()` does. Two
attribute writes per step (`enter`, `leave`), no lock.
"""

from __future__ import annotations

import _thread
import time

from rlds_writer.errors import WriterClosedError

_get_ident = _thread.get_ident


class StepGuard:
    """The thread in a step (0: none) and whether `close()` began.

    Args:
      what: the recorder and its dataset, for the message of a step refused.
    """

    __slots__ = ("stepping", "closing", "what")

    def __init__(self, what: str):
        self.stepping = 0
        self.closing = False
        self.what = what

    def enter(self) -> None:
        """Marks a step begun on this thread; refuses it if `close()` began."""
        self.stepping = _get_ident()
        if self.closing:
            self.stepping = 0
            raise WriterClosedError(f"{self.what} is closed (close() was called)")

    def leave(self) -> None:
        """Marks the step ended (in a `finally`: a step that raised ends too)."""
        self.stepping = 0

    def close(self, _get_ident=_get_ident, _sleep=time.sleep) -> None:  # noqa: ANN001
        """Marks the recorder closing and waits for a step another thread is in.

        The names are bound as defaults: a `__del__` may close at interpreter
        exit, after this module's globals were set to None.
        """
        self.closing = True
        me = _get_ident()
        while self.stepping not in (0, me):
            _sleep(0.0005)
