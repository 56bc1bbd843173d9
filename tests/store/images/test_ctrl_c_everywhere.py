"""Ctrl-C at any point of a recording stops the loop, `close()` finishes, and nothing ended is lost.

Once, a child of `test_image_processes`'s Ctrl-C test had not exited 120 s
after its SIGINT: a `KeyboardInterrupt` raised inside
`threading.Condition.__exit__` (entered by the env thread in the chunk pool,
in `DatasetWriter.write`'s queue) left the lock held, and the writer thread
then waited for it forever, with `close()` joining it. Other places lost an
episode (a Ctrl-C between an episode's `finish` and its hand-over to the
writer, or between a step's last append and its count), or poisoned the
writer (a Ctrl-C inside an inline write).

One child process records PNG camera frames encoded by the image worker
processes (as that test does) and, in turn, lets a SIGINT arrive:

* before each of many lines the env thread runs (every `STRIDE`-th of them,
  through a trace function that raises the signal, as the kernel would
  deliver it there): in steps, at an episode's end and hand-over to the
  writer and the workers, at the next reset;
* before each of many lines of `close()`;
* from another thread after delays swept across an episode (real SIGINTs,
  landing in C waits too).

Each time the loop must stop with `KeyboardInterrupt`, `close()` must return
(a watchdog kills the child otherwise), and the dataset must hold every
episode the env ended (and the open one, cut short), with nothing for
`recover` to repair.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rlds_writer.store.images import image_processes

pytestmark = pytest.mark.skipif(
    not image_processes.supported(), reason="image processes need Linux (memfd)"
)

_HERE = os.path.dirname(os.path.abspath(__file__))
_TESTS = os.path.dirname(os.path.dirname(_HERE))

_CHILD = """
import faulthandler, os, shutil, signal, sys, threading, time
import numpy as np
sys.path[:0] = [{store!r}, {tests!r}]
from test_image_processes import _Cameras
import rlds_writer
from rlds_writer import RecordRLDS
from rlds_writer.store.writing import encoding
from rlds_writer.store.images import image_processes
from rlds_writer.store.dataset.dataset import open_handle
encoding.START_WORKERS_BEHIND_SECONDS = 0.0  # the processes from the first episode
# Python's KeyboardInterrupt even where this runs with SIGINT ignored (a
# background job of a script): the signals below are the test.
signal.signal(signal.SIGINT, signal.default_int_handler)
ROOT = {root!r}
WATCHDOG = 60  # seconds per trial: a hang fails the test with every thread's stack

class Trial:
    def __init__(self, name):
        self.dir = os.path.join(ROOT, name)
        self.env = RecordRLDS(_Cameras(), self.dir, image_encoding="png")
        self.env.reset(seed=0)
        self.ended = 0
        self.interrupted = False

    def steps(self, n):
        for _ in range(n):
            _, _, _, truncated, _ = self.env.step(np.zeros(2, np.float32))
            if truncated:
                self.ended += 1
                self.env.reset()

    def check(self, what):
        recovered = rlds_writer.recover(self.dir)
        found = open_handle(self.dir).splits["train"].num_episodes
        ok = self.interrupted and not recovered.changed and self.ended <= found <= self.ended + 1
        print("ok" if ok else "FAILED", what, self.interrupted, self.ended, found,
              recovered.changed, flush=True)
        shutil.rmtree(self.dir)

def at_line(n):
    # A SIGINT arriving just before the n-th line this thread runs from now on.
    count = [0]
    def trace(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] == n:
                sys.settrace(None)
                signal.raise_signal(signal.SIGINT)
        return trace
    sys.settrace(trace)

def in_steps(n):
    t = Trial(f"steps{{n}}")
    t.steps(20)  # the workers are up, an episode is under way
    try:
        at_line(n)
        t.steps(40)  # an episode's end, its hand-over, the next reset
        sys.settrace(None)
    except KeyboardInterrupt:
        t.interrupted = True
    sys.settrace(None)
    t.env.close()
    t.check(f"steps line {{n}}")

def in_close(n):
    t = Trial(f"close{{n}}")
    t.steps(45)
    try:
        at_line(n)
        t.env.close()
    except KeyboardInterrupt:
        t.interrupted = True
    sys.settrace(None)
    t.env.close()  # idempotent, or finishes what the Ctrl-C stopped
    t.check(f"close line {{n}}")

def after(delay):
    t = Trial(f"delay{{delay}}")
    t.steps(10)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        while True:
            t.steps(1)
    except KeyboardInterrupt:
        t.interrupted = True
    timer.join()
    t.env.close()
    t.check(f"delay {{delay:.3f}}")

for kind, points in {points!r}:
    for point in points:
        faulthandler.dump_traceback_later(WATCHDOG, exit=True)
        {{"steps": in_steps, "close": in_close, "delay": after}}[kind](point)
faulthandler.cancel_dump_traceback_later()
image_processes.shutdown()
print("done", flush=True)
"""


def _run(tmp_path, points) -> list[str]:
    code = textwrap.dedent(_CHILD).format(
        store=_HERE, tests=_TESTS, root=str(tmp_path), points=points
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines[-1:] == ["done"], result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    failed = [line for line in lines if line.startswith("FAILED")]
    assert not failed, "\n".join(failed)
    return lines


# Every STRIDE-th line: the env thread runs about 2,400 lines over those 40
# steps (C step) and `close()` 800 to 900 (it waits in loops); a stride prime
# to the loops' lengths lands on a different line of each repeat.
STRIDE = 23


def test_ctrl_c_before_any_line_of_the_env_loop_stops_it_and_close_loses_nothing(tmp_path):
    lines = _run(tmp_path, [("steps", list(range(1, 2400, STRIDE)))])
    assert len(lines) > 100


def test_ctrl_c_before_any_line_of_close_leaves_a_whole_dataset(tmp_path):
    lines = _run(tmp_path, [("close", list(range(1, 800, STRIDE // 2)))])
    assert len(lines) > 60


def test_ctrl_c_after_delays_swept_across_episodes_stops_the_loop_and_close_loses_nothing(
    tmp_path,
):
    delays = [i * 0.007 for i in range(40)]  # 0 to 0.27 s: about one episode and its end
    lines = _run(tmp_path, [("delay", delays)])
    assert len(lines) == len(delays) + 1
