"""What a writer promises on S3 (moto) and GCS (emulator): one writer, complete shards only,
headers read by range requests."""

from __future__ import annotations

import os

import pytest

import rlds_writer
from rlds_writer.errors import LockedError, StorageNotSupportedError
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.storage import storage_remote
from rlds_writer.store.storage.storage import storage_for


def _episode(env) -> None:
    timestep = env.reset()
    while not timestep.last():
        timestep = env.step(1)


def test_second_writer_is_refused_until_the_first_closes(object_store):
    path = object_store.path("run")
    first = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=path)
    try:
        _episode(first)
        with pytest.raises(LockedError, match="locked by another process"):
            rlds_writer.EnvLogger(rlds_writer.Catch(seed=1), data_directory=path, mode="append")
    finally:
        first.close()
    second = rlds_writer.EnvLogger(rlds_writer.Catch(seed=1), data_directory=path, mode="append")
    _episode(second)
    second.close()
    fs = storage_for(path)
    assert not fs.exists(fs.join(path, ".rlds_writer.lock"))
    assert rlds_writer.recover(path, dry_run=True).splits == {"train": [1, 1]}


def test_a_shard_is_listed_only_complete(object_store):
    path = object_store.path("run")
    fs = storage_for(path)
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=path, commit_interval=3600
    )
    try:
        _episode(env)
        _episode(env)
        # Ended episodes wait in the open shard, which is no object yet.
        assert not [n for n in fs.listdir(path) if ".tfrecord-" in n]
        env.flush()
        shards = [n for n in fs.listdir(path) if ".tfrecord-" in n]
        assert shards == ["rlds_dataset-train.tfrecord-00000"]
        scan = tfrecord.scan(fs.join(path, shards[0]))
        assert len(scan.spans) == 2 and scan.tail_problem is None
    finally:
        env.close()


def test_a_store_without_conditional_create_refuses_to_record(tmp_path):
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class PlainFileSystem(MemoryFileSystem):
        protocol = "rldsplainrec"

    fsspec.register_implementation("rldsplainrec", PlainFileSystem, clobber=True)
    with pytest.raises(StorageNotSupportedError, match="cannot take the one-writer lock"):
        rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory="rldsplainrec://b/run")


def test_scan_without_data_check_reads_headers_only(s3_bucket, monkeypatch):
    # 16 records of 256 KB: a header-only scan makes a small range request or
    # two per record, far from the whole object.
    fs = storage_for(s3_bucket.url)
    path = s3_bucket.path("shard.tfrecord-00000")
    records = [os.urandom(1 << 18) for _ in range(16)]
    sink = fs.open_shard_sink(path)
    for record in records:
        header, footer = tfrecord.frame_parts_of([record], len(record))
        sink.write_parts([header, record, footer])
    sink.close()
    opened = []
    real_open = type(fs).open_random

    def open_random(self, p):
        opened.append(real_open(self, p))
        return opened[-1]

    monkeypatch.setattr(type(fs), "open_random", open_random)
    scan = tfrecord.scan(path, verify_data=False)
    assert [length for _, length in scan.spans] == [1 << 18] * 16
    fetched = sum(f.bytes_fetched for f in opened)
    assert 0 < fetched <= 2 * 16 * storage_remote.REMOTE_MIN_FETCH < fs.size(path) // 2
    full = tfrecord.scan(path, verify_data=True)
    assert full.spans == scan.spans


def test_gymnasium_recorder_writes_to_a_bucket(object_store):
    gym = pytest.importorskip("gymnasium")
    path = object_store.path("cartpole")
    env = rlds_writer.RecordRLDS(gym.make("CartPole-v1"), path)
    env.reset(seed=0)
    for t in range(60):
        _, _, terminated, truncated, _ = env.step(t % 2)
        if terminated or truncated:
            env.reset()
    env.close()
    fs = storage_for(path)
    assert [n for n in fs.listdir(path) if ".tfrecord-" in n] == [
        "rlds_dataset-train.tfrecord-00000"
    ]
    report = rlds_writer.recover(path, dry_run=True)
    assert not report.changed and sum(report.splits["train"]) >= 2
