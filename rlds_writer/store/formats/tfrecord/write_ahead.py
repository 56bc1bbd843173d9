"""Zeros written ahead of an open shard's records, so small records cost less.

Linux sizes a write's new page-cache folios to the write: a 20 KB record
appended to fresh space of an ext4 file cost 11.5-13.3 µs, and 2.4-3.6 µs
written into zeros written ahead in large pieces (benchmarks/REPORT.md). The
zeros cost about 4 µs per 20 KB themselves: where the `_zero_ahead` extension
is built they are written on a thread of its own, without the GIL, so the
recording thread does not wait for them; without it, on the recording thread
(`_ZerosHere`). Either writes zeros up to where it is told and decides
nothing: when and how far ahead is decided here only (`WriteAhead.before`,
`zeros_wanted`), on the recording thread, once per half `WRITE_AHEAD` of records.

What it changes on disk: while a shard is open, up to `WRITE_AHEAD` + 64 KiB
of zeros follow its last record; `WriteAhead.cut` removes them before the
shard is closed, so a listed shard holds its records only. A process killed
meanwhile leaves them (or a record torn into them), which
`store.formats.tfrecord.tfrecord.scan` reports as the crash's tail and `recover` cuts.

On a nearly full disk the zeros can take the last free pages while a record
that claimed the bytes before them is not written yet (its pages are still a
hole: the zeros start at its end). Its write then fails for room it would
have had without the zeros, so the shard calls `give_back` and writes it once
more: zeros never cost a record that fits without them.
"""

from __future__ import annotations

import os
from typing import Any

from rlds_writer import _native

_NOT_LOADED: Any = object()
# The thread without the GIL (rlds_writer/store/formats/tfrecord/_zero_ahead.c), loaded by the
# first shard that writes ahead (a short recording never imports it); None
# where it is not built: zeros written on the recording thread (`_ZerosHere`).
ZeroAhead: Any = _NOT_LOADED


# Records written by the extension (`ZeroAhead.write`, `write_all`): False
# makes every record go through `os.writev` (`storage.writev_all`), as tests
# that replace `os.writev` to tear or shorten writes need.
WRITE_IN_C = True
# Only writes of at least this many bytes (a batch's records) go through the
# extension: a single-env recording's small records, written on the env
# thread, waited there for the zeros thread's mutex (Catch: 1.01 -> 1.28 us
# of wall overhead per step, benchmarks/catch_overhead_ab.py).
C_WRITE_FROM = 64 << 10
_write_all: Any = _NOT_LOADED


def zero_ahead_type() -> Any:
    """`_zero_ahead.ZeroAhead`, or None where the extension is not built."""
    global ZeroAhead, _write_all
    if ZeroAhead is _NOT_LOADED:
        module = _native.load("rlds_writer.store.formats.tfrecord._zero_ahead")
        if module is None:
            ZeroAhead = _write_all = None
        else:
            ZeroAhead, _write_all = module.ZeroAhead, module.write_all
    return ZeroAhead


def parts_writer() -> Any:
    """`_zero_ahead.write_all(fd, parts)` (`storage.writev_all` in C, without
    Python per part), or None where it is not built or `WRITE_IN_C` is off."""
    if _write_all is _NOT_LOADED:
        zero_ahead_type()
    return _write_all if WRITE_IN_C else None


# The rule, here only: the two writers of zeros below (the C thread and
# `_ZerosHere`) write up to where `WriteAhead.before` tells them, and decide
# nothing. A shard holding less than this writes nothing ahead (a short
# recording pays nothing), nor for a record this large (it makes its large
# folios itself), nor a shard that will take fewer records than this more:
# starting the thread and cutting the zeros cost about what 10 small records
# gain (a shard of 5 Catch episodes was 22% slower to record when it wrote ahead).
WRITE_AHEAD_FROM = 64 << 10
WRITE_AHEAD_RECORD = 64 << 10
WRITE_AHEAD_MIN_RECORDS = 16
# How far the zeros reach past the records: as far as the shard holds, up to
# this; more is asked for when half of it is left.
WRITE_AHEAD = 256 << 10
_ALIGN = 64 << 10  # zeros end on this boundary: whole large folios
NEVER = 1 << 62  # a check point no shard reaches


def zeros_wanted(end: int) -> tuple[int, int]:
    """Where zeros should reach past records ending at `end`, and half their reach.

    Returns:
      `(to, half)`: zeros are written up to `to` (as far past `end` as the
      shard holds, at most `WRITE_AHEAD`, then to the next `_ALIGN` boundary);
      more are asked for once fewer than `half` bytes of them are left.
    """
    reach = min(WRITE_AHEAD, max(end, _ALIGN))
    return (end + reach) // _ALIGN * _ALIGN + _ALIGN, reach // 2


_MAX_WRITE = 1 << 20  # the most one `pwrite` of `_ZerosHere` writes (as the thread's)


class _ZerosHere:
    """`ZeroAhead`'s interface, writing the zeros on the calling thread."""

    _buffer: memoryview | None = None

    def __init__(self, fd: int, floor: int):
        self._fd = fd
        self._done = floor  # zeros (or records about to be written) reach here

    def advance(self, end: int, to: int) -> int:
        """A record is about to be written up to `end`; zeros up to `to` are
        written now (never below `end`). Returns where they reach."""
        if _ZerosHere._buffer is None:
            _ZerosHere._buffer = memoryview(bytes(_MAX_WRITE))
        at = max(self._done, end)
        while at < to:
            at += os.pwrite(self._fd, _ZerosHere._buffer[: min(to - at, _MAX_WRITE)], at)
        self._done = at
        return at

    def write(self, parts: Any, end: int) -> bool:
        """The thread's `write`: here the shard writes its records itself."""
        return False

    def close(self) -> None:
        pass


class WriteAhead:
    """Keeps zeros ahead of one open local shard's records (never with fsync).

    The shard calls `before(start, end)` for a record about to be written at
    `start` whose `end` passes the check point the last call returned, and
    `cut(end)` before it closes.

    Args:
      fd: the shard's file descriptor, open for writing.
    """

    def __init__(self, fd: int):
        self._fd = fd
        self._zeros = None
        self._past_records = False  # zeros may lie past the records

    def before(self, start: int, end: int, records_left: int | None = None) -> int:
        """Readies zeros for the record at [start, end); returns the next check point.

        Args:
          start: where the record starts (the records so far end there).
          end: where it ends.
          records_left: how many more records the shard takes at most, this
            one included, where known.
        """
        zeros = self._zeros
        try:
            if zeros is None:
                if records_left is not None and records_left < WRITE_AHEAD_MIN_RECORDS:
                    return NEVER  # too few records left to pay for it
                if start < WRITE_AHEAD_FROM or end - start >= WRITE_AHEAD_RECORD:
                    return 0  # asked again at the next record
                self._past_records = True
                # The records so far end at `start`: no zero goes below it.
                zeros = self._zeros = (zero_ahead_type() or _ZerosHere)(self._fd, start)
            to, half = zeros_wanted(end)
            # Asked again when half the reach is left. Every record's `write`
            # claims its bytes from the thread, so a record may end past the
            # zeros written by now (the thread's may still be under way): it
            # is then written into fresh space, as without zeros, and the
            # zeros go on past it. Asking again at the end of the zeros
            # written by now instead made a thread short of CPU (two busy
            # threads on two cores) be asked at nearly every record.
            zeros.advance(end, to)
            return to - half
        except OSError:
            # A full disk (or any refusal) ends writing ahead; the records are
            # written as without it and report their own errors.
            self._stop(start)
            return NEVER
        except ValueError:
            # A forked child writing its parent's shard: the zeros are the parent's.
            self._zeros = None
            self._past_records = False
            return NEVER

    @property
    def quiet(self) -> bool:
        """No zeros are being written, nor lie past the records: the file's bytes are
        the records only, and a write from elsewhere races nothing."""
        return self._zeros is None and not self._past_records

    def write(self, parts: list[Any], end: int, total: int) -> bool:
        """Writes a record's parts (`total` bytes, ending at `end`) at the
        shard's position where the thread's extension takes them (writes of
        `C_WRITE_FROM` bytes and more): with its mutex held, so that no zeros
        are written meanwhile (a record's `writev` waiting on the
        file's lock behind a `pwrite` of zeros cost it 3x), and keeping the GIL
        for up to 256 KiB (each hand-over of the GIL to the env thread and back
        cost the writer thread a wake-up). Returns False, writing nothing, where
        the shard writes them itself (`storage.writev_all`); either way the
        record's bytes are claimed first: no zero is written below `end`.

        Raises:
          OSError: the write failed (part of it may have been written).
        """
        zeros = self._zeros
        if zeros is None:
            return False
        try:
            if WRITE_IN_C and total >= C_WRITE_FROM and zeros.write(parts, end):
                return True
            zeros.advance(end, 0)  # claims its bytes; the shard writes them
        except ValueError:  # a forked child writing its parent's shard (see `before`)
            self._zeros = None
            self._past_records = False
        return False

    def cut(self, end: int) -> None:
        """Stops writing ahead and cuts the zeros past `end`, where the records end.

        Raises:
          OSError: if the file could not be cut (it must not be listed then).
        """
        if self._zeros is not None:
            self._zeros.close()  # no zero is written after this
        if self._past_records:
            os.ftruncate(self._fd, end)
            self._past_records = False

    def give_back(self, end: int) -> bool:
        """Stops writing ahead for good and cuts the zeros past `end`, where the
        records end, after a write failed for room (ENOSPC, EDQUOT).

        Returns:
          True if zeros may have held the room and were cut (the file ends at
          `end` now): the write may succeed once more. False if none were
          written, or the cut failed.
        """
        if self._zeros is None and not self._past_records:
            return False
        self._stop(end)
        return not self._past_records

    def _stop(self, start: int) -> None:
        zeros, self._zeros = self._zeros, None
        if zeros is not None:
            zeros.close()
        try:
            os.ftruncate(self._fd, start)
        except OSError:
            return  # `cut` tries again
        self._past_records = False
