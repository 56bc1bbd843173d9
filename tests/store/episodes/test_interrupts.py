"""A Ctrl-C in a held span (`interrupts.held`) is raised where the span ends; a second at once.

The end-to-end proof is tests/store/images/test_ctrl_c_everywhere.py (every
line of a recording); these pin the span's own rules, in a few milliseconds:
the program's handler is back after each span, nested spans hold until the
outermost ends, other threads' spans leave the handler alone, and a child
forked from another thread than the main one still holds (its main thread is
the one that forked).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rlds_writer.store.episodes import interrupts


@pytest.fixture(autouse=True)
def _python_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_in_a_held_method_is_raised_when_it_returns_with_its_work_done():
    done = []

    @interrupts.held
    def hand_over(x):
        signal.raise_signal(signal.SIGINT)
        done.append(x)
        return x

    with pytest.raises(KeyboardInterrupt):
        hand_over(1)
    assert done == [1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert hand_over.__name__ == "hand_over"


def test_a_second_ctrl_c_in_a_span_is_raised_at_once():
    done = []

    @interrupts.held
    def hand_over():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        done.append(1)

    with pytest.raises(KeyboardInterrupt):
        hand_over()
    assert done == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nested_spans_hold_a_ctrl_c_until_the_outermost_ends():
    order = []

    @interrupts.held
    def inner():
        signal.raise_signal(signal.SIGINT)
        order.append("inner")

    @interrupts.held
    def outer():
        inner()
        with interrupts.deferred("closing"):
            order.append("deferred")
        order.append("outer")

    with pytest.raises(KeyboardInterrupt):
        outer()
    assert order == ["inner", "deferred", "outer"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_span_in_another_thread_leaves_the_handler_alone():
    seen = []

    @interrupts.held
    def in_thread():
        seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_child_forked_from_another_thread_holds_ctrl_c_in_its_spans():
    pids = []

    def fork():
        pid = os.fork()
        if pid == 0:  # the child: this thread is its main thread now
            code = 3
            try:
                done = []

                @interrupts.held
                def hand_over():
                    signal.raise_signal(signal.SIGINT)
                    done.append(1)

                try:
                    hand_over()
                    code = 1  # never raised
                except KeyboardInterrupt:
                    code = 0 if done == [1] else 2  # 2: raised inside the span
            finally:
                os._exit(code)
        pids.append(pid)

    thread = threading.Thread(target=fork)
    thread.start()
    thread.join()
    _, status = os.waitpid(pids[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
