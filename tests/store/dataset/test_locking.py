"""One writer per directory: a second writer is refused, a dead writer's lock is taken over."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import crash_child
import pytest

import rlds_writer
from rlds_writer.errors import LockedError
from rlds_writer.store.dataset import layout, locking
from rlds_writer.store.dataset.locking import DirectoryLock

_HOLD_LOCK = """
import sys, time
from rlds_writer.store.dataset.locking import DirectoryLock
DirectoryLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def _open_writer(directory, mode="append"):
    return rlds_writer.TFDSBackendWriter(directory, crash_child.dataset_config(), mode=mode)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_second_writer_on_a_directory_is_refused_and_told_to_use_a_subdirectory(tmp_path):
    first = _open_writer(tmp_path / "ds")
    try:
        with pytest.raises(LockedError) as caught:
            _open_writer(tmp_path / "ds")
        message = str(caught.value)
        assert f"pid {os.getpid()}" in message
        assert "own subdirectory" in message and "writer_directory" in message
        assert "merge" in message
    finally:
        first.close()


def test_writer_in_another_process_is_refused_until_it_dies_then_taken_over(tmp_path, caplog):
    directory = tmp_path / "ds"
    directory.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(directory)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError, match=f"pid {holder.pid}"):
            _open_writer(directory)
        assert locking.is_locked(directory)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the dead holder's flock; its lock file is still there.
    assert (directory / layout.LOCK).exists()
    assert not locking.is_locked(directory)
    with caplog.at_level(logging.WARNING, logger="rlds_writer.store.dataset.locking"):
        writer = _open_writer(directory)
    try:
        assert f"pid {holder.pid}" in caplog.text and "stale lock" in caplog.text
        assert json.loads((directory / layout.LOCK).read_text())["pid"] == os.getpid()
    finally:
        writer.close()


def test_stale_lock_file_naming_a_dead_pid_is_taken_over_with_a_warning(tmp_path, caplog):
    directory = tmp_path / "ds"
    directory.mkdir()
    pid = _dead_pid()
    (directory / layout.LOCK).write_text(
        json.dumps({"host": socket.gethostname(), "pid": pid, "time": time.time()})
    )
    with caplog.at_level(logging.WARNING, logger="rlds_writer.store.dataset.locking"):
        writer = _open_writer(directory)
    writer.close()
    assert f"pid {pid}" in caplog.text
    assert not (directory / layout.LOCK).exists()  # released on close


def test_lock_is_released_on_close_so_the_next_writer_appends(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(2))
    assert not (directory / layout.LOCK).exists()
    crash_child.write_dataset(directory, range(2, 4), mode="append")
    assert crash_child.check_records(directory) == [0, 1, 2, 3]


@pytest.fixture
def remote_style(monkeypatch):
    """Locks as on gs:// or s3://: no flock, only the lock file's content."""
    monkeypatch.setattr(locking.file_io, "is_local", lambda path: False)


def _write_lock(directory, **content):
    directory.mkdir(exist_ok=True)
    base = {"host": socket.gethostname(), "time": time.time()}
    (directory / layout.LOCK).write_text(json.dumps({**base, **content}))


def test_remote_lock_of_a_dead_local_pid_is_taken_over(tmp_path, remote_style, caplog):
    _write_lock(tmp_path / "ds", pid=_dead_pid())
    with caplog.at_level(logging.WARNING, logger="rlds_writer.store.dataset.locking"):
        lock = DirectoryLock(tmp_path / "ds")
        lock.acquire()
    assert "stale lock" in caplog.text
    assert json.loads((tmp_path / "ds" / layout.LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "ds" / layout.LOCK).exists()


def test_remote_lock_of_a_live_process_is_refused(tmp_path, remote_style):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _write_lock(
            tmp_path / "ds", pid=sleeper.pid, start_time=locking.process_start_time(sleeper.pid)
        )
        with pytest.raises(LockedError, match=f"pid {sleeper.pid}"):
            DirectoryLock(tmp_path / "ds").acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_remote_lock_whose_pid_was_reused_is_stale(tmp_path, remote_style):
    # The lock names a live pid (ours) but another process start time: the pid
    # was reused (common in containers) and the writer that took it is gone.
    start = locking.process_start_time(os.getpid())
    _write_lock(tmp_path / "ds", pid=os.getpid(), start_time=start - 1)
    lock = DirectoryLock(tmp_path / "ds")
    lock.acquire()
    lock.release()


def test_remote_lock_from_another_host_is_never_taken_over(tmp_path, remote_style):
    _write_lock(tmp_path / "ds", host="some-other-host", pid=_dead_pid())
    with pytest.raises(LockedError, match="some-other-host"):
        DirectoryLock(tmp_path / "ds").acquire()


def test_writer_directory_gives_each_writer_its_own_subdirectory(tmp_path):
    assert rlds_writer.store.writer_directory(tmp_path, 3) == tmp_path / "writer-00003"
    assert (
        rlds_writer.store.writer_directory(tmp_path, "actor/7 b") == tmp_path / "writer-actor_7_b"
    )
    with pytest.raises(ValueError):
        rlds_writer.store.writer_directory(tmp_path, "..")


def test_a_released_lock_leaves_no_holder_where_its_file_survives(tmp_path):
    # A read-only directory keeps the lock file; a second name of the file
    # (a hard link) sees what such a survivor would hold after the release.
    lock = DirectoryLock(tmp_path)
    lock.acquire()
    survivor = tmp_path / "survivor"
    os.link(lock.path, survivor)
    assert json.loads(survivor.read_text())["pid"] == os.getpid()
    lock.release()
    assert not lock.path.exists()
    assert survivor.read_bytes() == b""  # the next taker finds no stale holder to report
