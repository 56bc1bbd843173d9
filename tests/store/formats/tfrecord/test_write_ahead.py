"""Small records go into zeros written ahead of them; nothing else changes.

A tfrecord shard holding `WRITE_AHEAD_FROM` bytes writes zeros past its next
record, so the record lands in page-cache pages that exist already. While the
shard is open the zeros sit after its last record; `close` cuts them, so a
closed (listed) shard is byte for byte what it would be without them. A
process killed meanwhile leaves them, or a record torn into them, as its
crash tail: the scan names it and `recover` cuts it, keeping every record.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from etils import epath
from helpers_core import load_episodes

import rlds_writer
from rlds_writer.envs import Catch
from rlds_writer.store.formats import shards
from rlds_writer.store.formats import tfrecord as tfrecord_package
from rlds_writer.store.formats.tfrecord import tfrecord, tfrecord_shards, write_ahead

PAGE = 4096


@pytest.fixture(params=["thread", "here"])
def zeros_on(request, monkeypatch):
    """Zeros written by the C extension's thread, or on the recording thread as
    in an install without a compiler (the extension cannot be imported)."""
    if request.param == "thread" and write_ahead.zero_ahead_type() is None:
        pytest.skip("the _zero_ahead extension is not built")
    if request.param == "here":
        monkeypatch.setitem(sys.modules, "rlds_writer.store.formats.tfrecord._zero_ahead", None)
        monkeypatch.delattr(tfrecord_package, "_zero_ahead", raising=False)
        monkeypatch.setattr(write_ahead, "ZeroAhead", write_ahead._NOT_LOADED)
        monkeypatch.setattr(write_ahead, "_write_all", write_ahead._NOT_LOADED)
        assert write_ahead.zero_ahead_type() is None
    return request.param


@pytest.fixture
def zeros_asked(monkeypatch) -> list[int]:
    """Where `WriteAhead` asked the zeros to reach, call after call (the rule's output)."""
    asked: list[int] = []
    real = write_ahead.zeros_wanted

    def zeros_wanted(end):
        to, half = real(end)
        asked.append(to)
        return to, half

    monkeypatch.setattr(write_ahead, "zeros_wanted", zeros_wanted)
    return asked


def _child_exits_cleanly(pid: int, timeout: float = 30.0) -> None:
    """Waits for a forked child (killing it past `timeout`); it must exit with 0."""
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("the forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _record(directory, episodes: int, **kwargs) -> None:
    with rlds_writer.EnvLogger(
        Catch(rows=40, seed=0), data_directory=os.fspath(directory), **kwargs
    ) as env:
        for _ in range(episodes):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(1)


def _shards(directory) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in epath.Path(directory).iterdir() if ".tfrecord-" in p.name
    }


def _zeros_at_each_cut(monkeypatch) -> list[int]:
    """The bytes of zeros each shard held past its records when it was closed."""
    zeros_cut: list[int] = []
    real_cut = write_ahead.WriteAhead.cut

    def cut(self, end):
        zeros_cut.append(os.fstat(self._fd).st_size - end)
        real_cut(self, end)

    monkeypatch.setattr(write_ahead.WriteAhead, "cut", cut)
    return zeros_cut


def _records_end(path) -> int:
    return tfrecord.scan(path).kept_end


def test_an_open_shard_has_zeros_after_its_records_and_close_cuts_them(
    tmp_path, zeros_on, zeros_asked
):
    path = tmp_path / "shard.tfrecord"
    writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path))
    record = b"\x0a" + bytes(range(256)) * 40  # 10 KB
    frame = len(record) + tfrecord.FRAMING
    sizes = []
    for _ in range(20):
        writer.write(record)
        sizes.append(os.path.getsize(path))
    written = 20 * frame
    # Nothing ahead before the shard held WRITE_AHEAD_FROM bytes.
    first = write_ahead.WRITE_AHEAD_FROM // frame + 1
    assert sizes[:first] == [(i + 1) * frame for i in range(first)]
    # The zeros reach where the rule asked last, on either path, and no further.
    assert zeros_asked and zeros_asked[-1] > written
    _wait_for(lambda: os.path.getsize(path) == zeros_asked[-1])
    with open(path, "rb") as f:
        f.seek(written)
        ahead = f.read()
    assert len(ahead) == zeros_asked[-1] - written and ahead.count(0) == len(ahead)
    writer.close()
    assert os.path.getsize(path) == written
    assert list(tfrecord_shards.tfrecord_records(path, strict=True)) == [record] * 20


def test_a_recording_with_zeros_written_ahead_is_byte_identical_and_loads(
    tmp_path, monkeypatch, zeros_on
):
    zeros_cut = _zeros_at_each_cut(monkeypatch)
    _record(tmp_path / "ahead", 120)
    assert max(zeros_cut) > 0
    monkeypatch.setattr(write_ahead, "WRITE_AHEAD_FROM", 1 << 62)
    _record(tmp_path / "plain", 120)
    ahead, plain = _shards(tmp_path / "ahead"), _shards(tmp_path / "plain")
    assert ahead == plain
    assert len(load_episodes(tmp_path / "ahead", "train")) == 120


def test_nothing_is_written_ahead_with_fsync_or_for_large_records(tmp_path):
    for name, record, fsync in (
        ("fsync", b"\x0a" + bytes(2000), True),
        ("large", b"\x0a" + bytes(write_ahead.WRITE_AHEAD_RECORD), False),
    ):
        path = tmp_path / name
        writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path), fsync=fsync)
        for i in range(60):
            writer.write(record)
            assert os.path.getsize(path) == (i + 1) * (len(record) + tfrecord.FRAMING), name
        writer.close()


def _frames(n: int, size: int = 3000) -> bytes:
    return b"".join(tfrecord.frame(b"\x0a" + bytes([i]) * size) for i in range(n))


def test_the_scan_reads_zeros_after_the_last_record_as_the_tail_a_kill_leaves(tmp_path):
    path = tmp_path / "shard"
    path.write_bytes(_frames(3) + bytes(70_000))
    scan = tfrecord.scan(path, resync=True)
    assert len(scan.spans) == 3 and not scan.dropped
    assert (scan.tail_problem, scan.tail_offset) == (tfrecord.ZEROS_AHEAD, len(_frames(3)))


def test_the_scan_reads_a_record_torn_into_zeros_as_the_tail_a_kill_leaves(tmp_path):
    path = tmp_path / "shard"
    torn = tfrecord.frame(b"\x0a" + b"\x07" * 9000)
    path.write_bytes(_frames(3) + torn[:PAGE] + bytes(70_000))
    scan = tfrecord.scan(path, resync=True)
    assert len(scan.spans) == 3 and not scan.dropped
    assert (scan.tail_problem, scan.tail_offset) == (tfrecord.TORN_INTO_ZEROS, len(_frames(3)))


def test_damage_followed_by_anything_but_zeros_is_still_damage(tmp_path):
    # A bad record in the middle, and a bad last record with no zeros after it.
    good = _frames(2)
    bad = bytearray(tfrecord.frame(b"\x0a" + b"\x05" * 3000))
    bad[100] ^= 1
    for data, dropped_at in (
        (good + bytes(bad) + good, len(good)),
        (good + bytes(bad), len(good)),
        (good + bytes(bad) + bytes(5) + b"\x01", len(good)),
    ):
        path = tmp_path / "shard"
        path.write_bytes(data)
        scan = tfrecord.scan(path, resync=True)
        assert [offset for offset, _, _ in scan.dropped] == [dropped_at]
        assert scan.tail_problem not in tfrecord.CRASH_TAILS


def _kill_after(directory, episodes: int) -> None:
    """Records `episodes` episodes in a child process, then kills it with SIGKILL."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        import rlds_writer
        from rlds_writer.envs import Catch
        env = rlds_writer.EnvLogger(
            Catch(rows=40, seed=0), data_directory={os.fspath(directory)!r},
            commit_interval=3600,
        )
        for _ in range({episodes}):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(1)
        print("recorded", flush=True)
        time.sleep(120)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "recorded"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()


def test_a_writer_killed_with_zeros_ahead_loses_no_episode_and_recover_cuts_the_zeros(tmp_path):
    directory = tmp_path / "ds"
    _kill_after(directory, 60)
    (shard,) = [p for p in directory.iterdir() if ".tfrecord-" in p.name]
    end = _records_end(shard)
    assert os.path.getsize(shard) > end  # the kill left the zeros
    report = rlds_writer.recover(directory)
    (shard_report,) = report.shards
    assert "truncated" in shard_report.actions
    assert any(tfrecord.ZEROS_AHEAD in line for line in shard_report.detail)
    assert os.path.getsize(shard) == end
    assert not [p for p in directory.iterdir() if p.name.startswith(".corrupt-")]
    assert len(load_episodes(directory, "train")) == 60
    assert not rlds_writer.recover(directory).changed


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("2m")


def test_a_disk_too_full_for_the_zeros_stops_writing_ahead_and_loses_nothing(small_disk, zeros_on):
    filler = small_disk / "filler"
    with open(filler, "wb") as f:
        f.write(bytes(2 * 1024 * 1024 - 40 * PAGE))
    path = small_disk / "shard"
    writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path))
    record = b"\x0a" + bytes(range(256)) * 40
    frame = len(record) + tfrecord.FRAMING
    for _ in range(10):  # past WRITE_AHEAD_FROM: the zeros fill the disk
        writer.write(record)
    if zeros_on == "thread":
        # The zeros fill the disk; or, when the thread took the last pages
        # before a record that claimed them was written, that record was
        # refused, the zeros were cut and writing ahead stopped already (the
        # next test makes that order certain).
        _wait_for(
            lambda: os.statvfs(small_disk).f_bavail == 0 or writer._check_at == write_ahead.NEVER
        )
        for _ in range(4):  # records into the zeros: the thread wants more, and fails
            writer.write(record)
        time.sleep(0.1)
    os.truncate(filler, 0)  # room for the records, which go past the zeros
    while writer.num_records < 30:
        writer.write(record)
    assert writer._check_at == write_ahead.NEVER  # writing ahead stopped at the failure
    writer.close()
    assert os.path.getsize(path) == 30 * frame
    assert list(tfrecord_shards.tfrecord_records(path, strict=True)) == [record] * 30


def test_a_record_that_fits_without_the_zeros_is_written_when_they_took_the_last_pages(
    tmp_path, small_disk, zeros_on, monkeypatch
):
    # The first record that writes ahead claims its bytes, and the zeros start
    # at its end: until the record is written its pages are a hole. Here the
    # zeros take exactly the disk's last free pages first (the thread is waited
    # for; the zeros of the recording thread come first anyway), so the record
    # is refused room it has without them: the shard cuts the zeros and writes
    # it once more. Before, it failed with ENOSPC (about 1 run in 5 under load).
    record = b"\x0a" + bytes(range(256)) * 40
    frame = len(record) + tfrecord.FRAMING
    first = -(-write_ahead.WRITE_AHEAD_FROM // frame)  # the first record writing ahead
    assert first * frame % PAGE and frame > 2 * PAGE  # it leaves a hole of whole pages

    # Where its zeros end: the same writes on a roomy disk.
    roomy = tfrecord_shards.TFRecordShardWriter(epath.Path(tmp_path / "roomy"))
    with monkeypatch.context() as patch:
        patch.setattr(write_ahead, "ZeroAhead", None)
        for _ in range(first + 1):
            roomy.write(record)
        zeros_end = os.path.getsize(tmp_path / "roomy")
        roomy.close()
    assert zeros_end > (first + 1) * frame

    path = small_disk / "shard"
    writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path))
    for _ in range(first):
        writer.write(record)
    # Free pages: exactly those the zeros take, from the page holding the record's end.
    zeros_pages = -(-zeros_end // PAGE) - (first + 1) * frame // PAGE
    free = os.statvfs(small_disk).f_bavail
    assert free > zeros_pages + 8
    with open(small_disk / "filler", "wb") as f:
        f.write(bytes((free - zeros_pages) * PAGE))
    assert os.statvfs(small_disk).f_bavail == zeros_pages

    refused = []

    def refusing(real):  # the record's write, whichever writes it (the thread's or the shard's)
        def write(*args):
            if writer._ahead._zeros is not None and not refused:
                _wait_for(lambda: os.statvfs(small_disk).f_bavail == 0)  # the zeros took it all
                try:
                    return real(*args)
                except OSError as error:
                    refused.append(error.errno)
                    raise
            return real(*args)

        return write

    monkeypatch.setattr(tfrecord_shards, "write_parts", refusing(tfrecord_shards.write_parts))
    monkeypatch.setattr(write_ahead.WriteAhead, "write", refusing(write_ahead.WriteAhead.write))
    writer.write(record)
    assert refused == [errno.ENOSPC]  # the zeros did take the record's room
    assert writer._check_at == write_ahead.NEVER  # and writing ahead stopped for good
    assert os.path.getsize(path) == (first + 1) * frame  # the zeros are cut
    for _ in range(4):  # the room they held is the records' again
        writer.write(record)
    writer.close()
    assert os.path.getsize(path) == (first + 5) * frame
    assert list(tfrecord_shards.tfrecord_records(path, strict=True)) == [record] * (first + 5)


def _writer_of_zeros(zeros_on):
    return write_ahead.zero_ahead_type() if zeros_on == "thread" else write_ahead._ZerosHere


def test_a_writer_of_zeros_writes_zeros_up_to_where_it_is_told_and_no_further(tmp_path, zeros_on):
    # Neither the thread nor the recording thread's writer decides anything:
    # no alignment, no reach of its own, no cap (the rule is `write_ahead`'s).
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    zeros = _writer_of_zeros(zeros_on)(fd, 0)
    try:
        for end, to in ((0, 12_345), (20_000, 20_001), (20_001, (3 << 20) + 7)):
            done = zeros.advance(end, to)
            assert end <= done <= to
            _wait_for(lambda to=to: os.path.getsize(path) == to)
        time.sleep(0.05)
        assert zeros.advance(0, 0) == os.path.getsize(path) == (3 << 20) + 7
    finally:
        zeros.close()
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read().count(0) == (3 << 20) + 7


def test_zeros_are_never_written_over_a_record_that_outran_them(tmp_path, zeros_on):
    # Records of up to 600 KB written as fast as possible, zeros asked for 1 MiB
    # past each: on the thread they often end past the zeros written so far,
    # so each claims its bytes from the thread (fails with the claim removed).
    rng = random.Random(0)
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    expected = bytearray()
    zeros = _writer_of_zeros(zeros_on)(fd, 0)
    check_at = 0
    for i in range(400):
        record = bytes([i % 251 + 1]) * rng.randint(1, 600_000)
        end = len(expected) + len(record)
        if end > check_at:
            check_at = zeros.advance(end, end + (1 << 20))
            assert check_at >= end
        assert os.write(fd, record) == len(record)
        expected += record
    zeros.close()
    size = os.path.getsize(path)
    os.close(fd)
    with open(path, "rb") as f:
        data = f.read()
    assert data[: len(expected)] == expected  # no record byte became a zero
    assert data[len(expected) :].count(0) == size - len(expected)
    time.sleep(0.1)  # and nothing is written once close() returned
    assert os.path.getsize(path) == size


def test_zeros_never_go_below_the_records_written_before_their_writer_started(tmp_path, zeros_on):
    # The thread may see a request for zeros before anything claims bytes
    # (it had not gone to sleep yet): it wrote them from offset 0, over the
    # shard's first records (seen in CI). Here nothing claims any: the zeros
    # must still start at the floor given when the writer started.
    path = tmp_path / "file"
    records = os.urandom(300_001)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    assert os.write(fd, records) == len(records)
    zeros = _writer_of_zeros(zeros_on)(fd, len(records))
    to = len(records) + (3 << 20)
    try:
        zeros.advance(0, to)  # end 0: claims nothing
        _wait_for(lambda: os.path.getsize(path) == to)
    finally:
        zeros.close()
    data = os.pread(fd, to, 0)
    os.close(fd)
    assert data[: len(records)] == records
    assert data[len(records) :].count(0) == to - len(records)


class _SeesTheRequestFirst:
    """A writer of zeros whose first request is acted on before its record
    claims its bytes: the thread's order when it has not gone to sleep yet."""

    real: type

    def __init__(self, fd, floor):
        self._zeros = _SeesTheRequestFirst.real(fd, floor)
        self._fd = fd
        self.write = getattr(self._zeros, "write", None)
        self.close = self._zeros.close

    def advance(self, end, to):
        self._zeros.advance(0, to)
        _wait_for(lambda: os.fstat(self._fd).st_size >= to)
        return self._zeros.advance(end, to)


def test_a_shard_that_starts_writing_ahead_midway_keeps_the_records_before(
    tmp_path, monkeypatch, zeros_on
):
    # Records of 70 KB write nothing ahead; the small ones after them start
    # the zeros at about 280 KB into the shard: none may land on the first.
    _SeesTheRequestFirst.real = write_ahead.zero_ahead_type() or write_ahead._ZerosHere
    monkeypatch.setattr(write_ahead, "ZeroAhead", _SeesTheRequestFirst)
    records = [b"\x0a" + os.urandom(70_000) for _ in range(4)]
    records += [b"\x0a" + os.urandom(2_000) for _ in range(100)]
    path = tmp_path / "shard"
    writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path))
    for record in records:
        writer.write(record)
    assert isinstance(writer._ahead._zeros, _SeesTheRequestFirst)
    writer.close()
    assert list(tfrecord_shards.tfrecord_records(path, strict=True)) == records


@pytest.mark.skipif(
    write_ahead.zero_ahead_type() is None, reason="the _zero_ahead extension is not built"
)
def test_a_record_written_through_the_thread_claims_its_bytes_without_asking_first(tmp_path):
    # The shard's records go through `ZeroAhead.write`, which claims their
    # bytes itself: zeros are asked for only every 1 MiB here (never when a
    # record passes the zeros written so far), and records of up to 300 KB
    # often end past them; no record byte may become a zero (fails with the
    # claim in `write` removed), and the parts are written whole, in order.
    rng = random.Random(1)
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    zeros = write_ahead.zero_ahead_type()(fd, 0)
    expected = bytearray()
    ask_at = 0
    taken = 0
    for i in range(150):
        size = rng.randint(1, 300_000)
        parts = [bytes([i % 251 + 1]) * (size // 2), memoryview(bytes([i % 13 + 1]) * (size // 2))]
        end = len(expected) + sum(len(p) for p in parts)
        if end > ask_at:
            zeros.advance(len(expected), end + (2 << 20))
            ask_at = end + (1 << 20)
        if zeros.write(parts, end):
            taken += 1
        else:  # only a part list over 1 MiB or 64 parts is left to the caller
            raise AssertionError("write refused parts it takes")
        for p in parts:
            expected += p
    with pytest.raises(TypeError):
        zeros.write(b"not a list of parts", 1)
    zeros.close()
    assert zeros.write([b"x"], len(expected) + 1) is False  # closed: the caller writes
    size = os.path.getsize(path)
    os.close(fd)
    with open(path, "rb") as f:
        data = f.read()
    assert taken == 150
    assert data[: len(expected)] == expected
    assert data[len(expected) :].count(0) == size - len(expected)


class _Lagging:
    """The thread's ZeroAhead, reporting zeros never ahead of the record just claimed:
    a thread that gets no CPU (two busy threads on two cores)."""

    calls = 0
    real: type

    def __init__(self, fd, floor):
        self._zeros = _Lagging.real(fd, floor)
        self.write = getattr(self._zeros, "write", None)  # (none before the claim in write)
        self.close = self._zeros.close

    def advance(self, end, to):
        _Lagging.calls += 1
        return min(self._zeros.advance(end, to), end)


@pytest.mark.skipif(
    write_ahead.zero_ahead_type() is None, reason="the _zero_ahead extension is not built"
)
def test_a_thread_short_of_cpu_is_asked_for_zeros_once_per_half_reach_not_per_record(
    tmp_path, monkeypatch
):
    # Asked again "at the end of the zeros written by now", a lagging thread
    # was asked (and its mutex taken, the GIL let go) at nearly every record.
    _Lagging.real = write_ahead.zero_ahead_type()
    monkeypatch.setattr(write_ahead, "ZeroAhead", _Lagging)
    monkeypatch.setattr(write_ahead, "C_WRITE_FROM", 0)  # these records through the thread too
    _Lagging.calls = 0
    record = b"\x0a" + os.urandom(20_700)
    path = tmp_path / "shard"
    writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path))
    for _ in range(300):
        writer.write(record)
    assert isinstance(writer._ahead._zeros, _Lagging)
    frame = len(record) + tfrecord.FRAMING
    asked_every = write_ahead.WRITE_AHEAD // 2 // frame  # records per half reach
    assert 0 < _Lagging.calls <= 300 // asked_every + 4  # not ~300
    writer.close()
    assert os.path.getsize(path) == 300 * frame
    assert list(tfrecord_shards.tfrecord_records(path, strict=True)) == [record] * 300


@pytest.mark.skipif(
    write_ahead.zero_ahead_type() is None, reason="the _zero_ahead extension is not built"
)
def test_a_forked_child_gets_an_error_from_the_thread_it_does_not_have(tmp_path):
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o644)
    zeros = write_ahead.zero_ahead_type()(fd, 0)
    pid = os.fork()
    if pid == 0:  # the child: no thread; neither call may wait for its mutex
        try:
            zeros.advance(10, 20)
        except ValueError:
            zeros.close()
            os._exit(0)
        os._exit(1)
    _child_exits_cleanly(pid)
    zeros.close()
    os.close(fd)


def test_a_listed_shard_with_a_record_followed_by_zeros_is_kept_aside_not_cut(tmp_path):
    # The writer cuts its zeros before it lists a shard: in a listed one they
    # are damage, kept as a .corrupt- copy while the good records are kept.
    directory = tmp_path / "ds"
    _record(directory, 3)
    (shard,) = [p for p in directory.iterdir() if ".tfrecord-" in p.name]
    torn = tfrecord.frame(b"\x0a" + b"\x07" * 9000)
    with open(shard, "ab") as f:
        f.write(torn[:PAGE] + bytes(20_000))
    report = rlds_writer.recover(directory)
    (shard_report,) = report.shards
    assert "rewritten" in shard_report.actions, shard_report
    assert [p for p in directory.iterdir() if p.name.startswith(".corrupt-")]
    assert len(load_episodes(directory, "train")) == 3


@pytest.mark.skipif(
    write_ahead.zero_ahead_type() is None, reason="the _zero_ahead extension is not built"
)
def test_a_forked_child_leaves_its_parents_zeros_to_the_parent(tmp_path):
    path = tmp_path / "shard.tfrecord"
    writer = tfrecord_shards.TFRecordShardWriter(epath.Path(path))
    record = b"\x0a" + bytes(range(256)) * 40
    for _ in range(10):
        writer.write(record)
    written = 10 * (len(record) + tfrecord.FRAMING)
    _wait_for(lambda: os.path.getsize(path) > written)
    pid = os.fork()
    if pid == 0:  # the child: neither the thread nor the zeros are its own
        ahead = writer._ahead
        status = 0 if ahead.before(written, written + 100) == write_ahead.NEVER else 1
        ahead.cut(written)
        os._exit(status)
    _child_exits_cleanly(pid)
    assert os.path.getsize(path) > written  # the parent's zeros are still there
    writer.write(record)
    writer.close()
    assert list(tfrecord_shards.tfrecord_records(path, strict=True)) == [record] * 11


def test_a_shard_that_will_take_few_more_records_writes_nothing_ahead(tmp_path, monkeypatch):
    # Starting the thread and cutting the zeros cost what about 10 small
    # records gain: a shard of a few episodes never writes ahead.
    record = b"\x0a" + bytes(range(256)) * 40
    frame = len(record) + tfrecord.FRAMING
    path = tmp_path / "shard"
    # What the dataset writer says (`max_episodes_per_file`), through the format.
    writer = shards.open_writer(epath.Path(path), "tfrecord", max_records=15)
    for i in range(15):
        writer.write(record)
        assert os.path.getsize(path) == (i + 1) * frame
    writer.close()
    # Through the dataset writer: shards of 12 episodes of about 32 KB.
    zeros_cut = _zeros_at_each_cut(monkeypatch)
    _record(tmp_path / "ds", 36, max_episodes_per_file=12)
    assert zeros_cut == [0, 0, 0]
    assert len(load_episodes(tmp_path / "ds", "train")) == 36


# The object misused from Python threads: advance() while another thread closes
# it (advance lets the GIL go), and two close() calls at once. Before issue 46
# the first read the state after the zeros thread had freed it and the second
# released it twice (AddressSanitizer: heap-use-after-free; .ci/sanitizers runs
# this test against a build with it). Run in a child: a crash must fail the test,
# not end the run.
_MISUSE = textwrap.dedent(
    """
    import os, sys, threading, time
    from rlds_writer.store.formats.tfrecord import write_ahead

    zero_ahead = write_ahead.zero_ahead_type()
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
    rounds, deadline = 0, time.monotonic() + float(sys.argv[2])
    while rounds < 300 or time.monotonic() < deadline and rounds < 3000:
        rounds += 1
        zeros = zero_ahead(fd, 0)
        start = threading.Barrier(len(sys.argv) - 3)
        reached = []

        def advance():
            start.wait()
            end = 1 << 17
            try:
                while True:  # each end past the zeros: claimed without the GIL
                    reached.append(zeros.advance(end, end + (1 << 16)) >= end)
                    end += 1 << 17
            except ValueError:  # closed meanwhile: refused, as after close()
                pass

        def close():
            start.wait()
            zeros.close()

        calls = {"advance": advance, "close": close}
        threads = [threading.Thread(target=calls[name]) for name in sys.argv[3:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(reached), reached
        zeros.close()
    os.close(fd)
    print("rounds", rounds)
    """
)


@pytest.mark.skipif(
    write_ahead.zero_ahead_type() is None, reason="the _zero_ahead extension is not built"
)
@pytest.mark.parametrize(
    "calls",
    [("advance", "close"), ("close", "close"), ("advance", "close", "close")],
    ids="-".join,
)
def test_advance_and_close_on_threads_at_once_neither_use_nor_free_the_state_twice(tmp_path, calls):
    # MALLOC_PERTURB_: memory the old code freed too early is overwritten, so its
    # late use shows (a wrong reach, a hang, a crash) without the sanitizers too.
    env = {**os.environ, "MALLOC_PERTURB_": "165"}
    child = subprocess.run(
        [sys.executable, "-c", _MISUSE, str(tmp_path / "file"), "1", *calls],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.startswith("rounds ")
