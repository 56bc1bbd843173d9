"""Image worker processes are reused across recordings in one process.

A recording that closes leaves its started processes idle for the next one,
which then encodes there without starting any (same worker pids); `close()`
never waits for a start under way; idle processes end after
`image_processes.IDLE_SECONDS`, with `shutdown()` or at exit. The bytes are
those of the single-threaded encoder either way.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from helpers_core import load_episodes
from test_image_processes import _Cameras, _run_episodes, _shard_bytes, _worker_pids

from rlds_writer import RecordRLDS
from rlds_writer.store.episodes import episode_data
from rlds_writer.store.images import image_processes
from rlds_writer.store.writing import encoding

pytestmark = pytest.mark.skipif(
    not image_processes.supported(), reason="image processes need Linux (memfd)"
)


@pytest.fixture(autouse=True)
def _no_idle_pool(monkeypatch):
    image_processes.shutdown()
    # These tests hold the writer so that episodes queue behind it; an env
    # that outruns it then waits for chunks (at most `_WAIT_MAX`, 5 s a chunk:
    # the bound itself is tested in test_chunk_recycling). Not here.
    monkeypatch.setattr(episode_data, "_WAIT_MAX", 0.05)
    yield
    image_processes.shutdown()


def _recorder(path, image_workers: int = 2) -> RecordRLDS:
    return RecordRLDS(_Cameras(), str(path), image_encoding="png", image_workers=image_workers)


def _submissions(encoder) -> list:
    """Records every batch the encoder hands its processes from now on."""
    submitted: list = []
    pool = encoder._processes
    submit = pool.submit
    pool.submit = lambda jobs: submitted.append(jobs) or submit(jobs)
    return submitted


def test_a_second_recording_encodes_in_the_processes_of_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    first = _recorder(tmp_path / "first")
    _run_episodes(first, 1, seed=0)
    first.flush()
    workers = _worker_pids(os.getpid())
    assert len(workers) == 2
    first.close()
    second = _recorder(tmp_path / "second")
    encoder = second._recording.recorder.writer.encoder
    assert encoder._processes.started  # taken, running, before any episode
    submitted = _submissions(encoder)
    _run_episodes(second, 2, seed=0)
    second.flush()
    assert len(submitted) == 2
    assert _worker_pids(os.getpid()) == workers  # no process started
    second.close()
    reference = _recorder(tmp_path / "alone", image_workers=0)
    _run_episodes(reference, 2, seed=0)
    reference.close()
    assert _shard_bytes(tmp_path / "second") == _shard_bytes(tmp_path / "alone")


def test_a_recording_behind_takes_idle_processes_at_once_instead_of_starting_its_own(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    first = _recorder(tmp_path / "first")
    _run_episodes(first, 1, seed=0)
    first.close()
    workers = _worker_pids(os.getpid())
    assert len(workers) == 2
    # Starting processes would now need far more backlog than one episode:
    # processes already running cost nothing to start, so they are used at once.
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 1e9)
    monkeypatch.setattr(encoding, "START_WORKERS_FRAME_SECONDS", 0.0)
    second = _recorder(tmp_path / "second")
    encoder = second._recording.recorder.writer.encoder
    _run_episodes(second, 1, seed=0)
    second.flush()
    writer = second._recording.recorder.writer
    with writer._io_lock:  # the writer waits: the next episodes queue up behind it
        _run_episodes(second, 3)
    second.flush()
    assert encoder._starter is None and encoder._workers_up.is_set()
    assert _worker_pids(os.getpid()) == workers
    second.close()
    assert len(load_episodes(tmp_path / "second")) == 4


def test_close_does_not_wait_for_processes_still_starting(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 1e-9)
    monkeypatch.setattr(encoding, "START_WORKERS_FRAME_SECONDS", 0.0)
    release = threading.Event()
    encode = image_processes.ImageProcessPool.encode

    def held_start(pool, jobs):
        out = encode(pool, jobs)  # the processes answered...
        assert release.wait(timeout=120)  # ...and the start is held until the test says
        return out

    monkeypatch.setattr(image_processes.ImageProcessPool, "encode", held_start)
    env = _recorder(tmp_path / "ds")
    encoder = env._recording.recorder.writer.encoder
    _run_episodes(env, 1, seed=0)
    env.flush()
    with env._recording.recorder.writer._io_lock:
        _run_episodes(env, 4)
    env.flush()
    starter = encoder._starter
    assert starter is not None and starter.is_alive()
    closing = threading.Thread(target=env.close)
    closing.start()
    closing.join(timeout=120)
    assert not closing.is_alive()  # closed while the start is still held
    assert not encoder._workers_up.is_set()
    assert len(load_episodes(tmp_path / "ds")) == 5
    release.set()
    starter.join(timeout=120)
    # The processes it started are left for the next recording.
    workers = _worker_pids(os.getpid())
    assert len(workers) == 2
    pool = image_processes.take_started(2)
    assert pool is not None
    pool.close()


def test_a_recording_that_needs_no_processes_starts_none_and_close_waits_for_none(tmp_path):
    env = _recorder(tmp_path / "ds")
    encoder = env._recording.recorder.writer.encoder
    _run_episodes(env, 2, seed=0)
    env.close()
    assert encoder._starter is None and not encoder._workers_up.is_set()
    assert _worker_pids(os.getpid()) == []
    assert image_processes.take_started(2) is None


def test_idle_processes_end_after_the_idle_time(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    monkeypatch.setattr(image_processes, "IDLE_SECONDS", 0.01)
    env = _recorder(tmp_path / "ds")
    _run_episodes(env, 1, seed=0)
    env.close()
    # The idle pools' own timers (other modules keep timers of their own: chunk spares).
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer) and thread.function == image_processes._close_idle:
            thread.join(timeout=60)
    assert _worker_pids(os.getpid()) == []
    assert image_processes.take_started(2) is None


def _wait_dead(pids, timeout=30.0):
    import psutil

    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)


def test_processes_that_died_while_idle_are_not_reused(tmp_path, monkeypatch):
    import signal

    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    first = _recorder(tmp_path / "first")
    _run_episodes(first, 1, seed=0)
    first.close()
    dead = _worker_pids(os.getpid())
    for pid in dead:
        os.kill(pid, signal.SIGKILL)
    _wait_dead(dead)  # died while idle: gone before the next recording starts
    second = _recorder(tmp_path / "second")
    _run_episodes(second, 2, seed=0)
    second.flush()
    fresh = _worker_pids(os.getpid())
    assert len(fresh) == 2 and not set(fresh) & set(dead)
    second.close()
    assert len(load_episodes(tmp_path / "second")) == 2


def test_a_forked_child_never_takes_its_parents_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    env = _recorder(tmp_path / "ds")
    _run_episodes(env, 1, seed=0)
    env.close()
    workers = _worker_pids(os.getpid())
    assert len(workers) == 2
    pid = os.fork()
    if pid == 0:  # the child: its parent's idle pool is not its own, not even listed
        os._exit(0 if not image_processes._idle and image_processes.take_started(2) is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _worker_pids(os.getpid()) == workers  # the parent's are still there, idle
    pool = image_processes.take_started(2)
    assert pool is not None
    pool.close()
