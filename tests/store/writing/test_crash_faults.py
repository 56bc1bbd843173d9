"""Write errors (ENOSPC, EIO) injected at the file layer reach the caller, and the
episodes written before them stay loadable after `recover`.

Faults are injected through the writer's seam, `rlds_writer.store.writing.split_shards.open_shard`:
it is replaced with a factory wrapping a real shard writer that fails at a
chosen point (a torn partial write then ENOSPC, EIO on flush, EIO on open, an
error on close), and through `file_io.atomic_write_text` for dataset_info.json
commits. Also here: `fsync=True` really syncs shards, dataset_info.json and the
directory.
"""

from __future__ import annotations

import errno
import os

import crash_child
import pytest

import rlds_writer
from rlds_writer.errors import WriterFailedError
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats import shards
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.storage import file_io
from rlds_writer.store.writing import split_shards


class _Faults:
    """Counts shard operations across shards and fails the chosen one."""

    def __init__(self, op: str, at: int, code: int, torn: bool = False):
        self.op, self.at, self.code, self.torn = op, at, code, torn
        self.counts = {"open": 0, "write": 0, "flush": 0, "close": 0}

    def hit(self, op: str) -> bool:
        self.counts[op] += 1
        return op == self.op and self.counts[op] == self.at

    def error(self, path) -> OSError:
        return OSError(self.code, os.strerror(self.code), os.fspath(path))


def _install(monkeypatch, faults: _Faults) -> None:
    class FaultyShard:
        """A real shard writer that fails where `faults` says."""

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def write(self, record, length=None):
            if faults.hit("write"):
                if faults.torn and self.file_format == "tfrecord":
                    parts = [record] if isinstance(record, bytes) else record
                    framed = tfrecord.frame(b"".join(bytes(p) for p in parts))
                    with open(self.path, "ab") as f:  # the part the disk took
                        f.write(framed[: len(framed) // 2])
                raise faults.error(self.path)
            self._inner.write(record, length)

        def flush(self):
            if faults.hit("flush"):
                raise faults.error(self.path)
            self._inner.flush()

        def close(self):
            if faults.hit("close"):
                self._inner.close()
                raise faults.error(self.path)
            self._inner.close()

    def open_shard(path, file_format, fsync, max_records=None):
        if faults.hit("open"):
            raise faults.error(path)
        return FaultyShard(shards.open_writer(path, file_format, fsync, max_records))

    monkeypatch.setattr(split_shards, "open_shard", open_shard)


def _record_until_failure(directory, file_format="tfrecord", episodes=12, flush_every=None):
    """Records episodes 0, 1, ... until the writer reports a failure; returns it."""
    backend = rlds_writer.TFDSBackendWriter(
        directory,
        crash_child.dataset_config(),
        max_episodes_per_file=3,
        file_format=file_format,
    )
    error = None
    try:
        for episode_id in range(episodes):
            crash_child.record_episode(backend, episode_id)
            if flush_every and episode_id % flush_every == flush_every - 1:
                backend.flush()
        backend.flush()
    except WriterFailedError as e:
        error = e
    try:
        backend.close()
    except WriterFailedError as e:
        error = error or e
    return error


@pytest.mark.parametrize(
    ("faults", "file_format", "survivors"),
    [
        # ENOSPC in the middle of writing episode 5's record: half of it is on disk.
        (_Faults("write", 6, errno.ENOSPC, torn=True), "tfrecord", 5),
        (_Faults("write", 6, errno.EIO), "tfrecord", 5),
        # EIO when handing episode 4 to the OS: its bytes may or may not be there.
        (_Faults("flush", 5, errno.EIO), "tfrecord", None),
        # EIO opening the third shard (episodes 0-5 are in two closed shards).
        (_Faults("open", 3, errno.EIO), "tfrecord", 6),
        # An error closing the first shard at rotation (its data is complete).
        (_Faults("close", 1, errno.EIO), "tfrecord", 3),
        # array_record: the open shard (episode 3) is still closed after the failure.
        (_Faults("write", 5, errno.ENOSPC), "array_record", 4),
    ],
    ids=["enospc-torn-write", "eio-write", "eio-flush", "eio-open", "eio-close", "array-record"],
)
def test_write_error_reaches_the_caller_and_earlier_episodes_survive(
    monkeypatch, tmp_path, faults, file_format, survivors
):
    _install(monkeypatch, faults)
    directory = tmp_path / "ds"
    error = _record_until_failure(directory, file_format)
    assert isinstance(error, WriterFailedError), "the failure was swallowed"
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == faults.code
    monkeypatch.undo()
    # The dataset as left behind always loads (dataset_info.json never lists a
    # torn record) and `recover` makes it list every complete record.
    listed = sum(
        sum(v[0])
        for v in layout.read_splits(file_io.read_json(directory / layout.DATASET_INFO)).values()
    )
    rlds_writer.recover(directory)
    ids = crash_child.check_records(directory)
    assert ids == list(range(len(ids)))
    assert len(ids) >= listed
    if survivors is not None:
        assert len(ids) == survivors
    else:
        assert len(ids) >= 4
    assert crash_child.check_loaded(directory) == ids
    assert rlds_writer.maintain.validate(directory)["ok"]


def test_failed_writer_keeps_raising_and_refuses_new_episodes(monkeypatch, tmp_path):
    _install(monkeypatch, _Faults("write", 2, errno.ENOSPC))
    backend = rlds_writer.TFDSBackendWriter(tmp_path / "ds", crash_child.dataset_config())
    crash_child.record_episode(backend, 0)
    try:
        # A short episode may be written by the caller when the writer thread
        # is idle: then the failure is reported at once...
        crash_child.record_episode(backend, 1)
    except WriterFailedError:
        pass
    # ...and in any case by the next call.
    with pytest.raises(WriterFailedError, match="No space left on device"):
        backend.flush()
    with pytest.raises(WriterFailedError):
        crash_child.record_episode(backend, 2)
    with pytest.raises(WriterFailedError, match="recover"):
        backend.close()


def test_dataset_info_commit_failure_reaches_the_caller_and_keeps_the_old_file(
    monkeypatch, tmp_path
):
    directory = tmp_path / "ds"
    real = file_io.atomic_write_text
    calls = {"n": 0}

    def failing_atomic_write_text(path, text, fsync=False):
        if os.fspath(path).endswith(layout.DATASET_INFO):
            calls["n"] += 1
            if calls["n"] == 4:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        real(path, text, fsync=fsync)

    monkeypatch.setattr(file_io, "atomic_write_text", failing_atomic_write_text)
    error = _record_until_failure(directory, flush_every=1)
    assert isinstance(error, WriterFailedError)
    assert error.__cause__.errno == errno.ENOSPC
    monkeypatch.undo()
    before = file_io.read_json(directory / layout.DATASET_INFO)  # still whole JSON
    assert sum(layout.read_splits(before)["train"][0]) >= 1
    rlds_writer.recover(directory)
    ids = crash_child.check_loaded(directory)
    assert ids == list(range(len(ids))) and len(ids) >= 3


def test_fsync_true_syncs_shards_dataset_info_and_the_directory(monkeypatch, tmp_path):
    directory = tmp_path / "ds"
    directory.mkdir()
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    crash_child.write_dataset(directory, range(4), max_episodes_per_file=3, fsync=True)
    shard0 = os.fspath(directory / layout.shard_name(crash_child.NAME, "train", "tfrecord", 0))
    assert synced.count(shard0) >= 3, synced  # once per episode
    assert any(f"{layout.DATASET_INFO}.tmp-" in p for p in synced), synced
    assert os.fspath(directory) in synced  # renames and new files made durable
    synced.clear()
    crash_child.write_dataset(tmp_path / "nosync", range(4), max_episodes_per_file=3)
    assert not any("tfrecord" in p for p in synced), synced
