"""The batch lane: a vector step's ended episodes handed over without waking the writer.

The writer thread is held on a clock far longer than the test (`INTERVAL`), so
what wakes it is counted, not timed: the hand-overs do not (one wake-up for
the first batch after it went idle); `flush()` and `close()` do, at once; one
wake-up writes every pending batch with one encode call and one call for all
the whole shards they fill, however many batches and shards; the order is the
hand-over order, spilled episodes (handed over apart) included.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from batch_envs import waiting_batches

from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.writing import batch_lane, ring_records, split_shards

N = 16


def _records_in_order(path: Path) -> list[bytes]:
    out = []
    for shard in sorted(Path(path).glob("*.tfrecord-*"), key=lambda p: p.name):
        with open(shard, "rb") as f:
            out.extend(data for _, data in tfrecord.iter_records(f))
    return out


def _record(path: Path, steps: int, between=None, **options) -> RecordRLDSVector:
    venv = gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="vector_entry_point")
    env = RecordRLDSVector(venv, path, max_episodes_per_file=5, **options)
    actions = np.random.default_rng(3).integers(0, 2, (steps, N))
    env.reset(seed=3)
    for t, action in enumerate(actions):
        env.step(action)
        if between is not None and t == steps // 2:
            between(env)
    return env


def _bounded(call, seconds: float = 60) -> None:
    """Runs `call` on a thread; it must return well before the lane's clock would."""
    thread = threading.Thread(target=call)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} waited for the lane's clock"


def test_one_wake_up_writes_every_pending_batch_in_one_encode_and_flush_close_wake_it(
    tmp_path, monkeypatch
):
    reference = _record(tmp_path / "reference", 200)
    reference.close()
    calls = {"encode": 0, "shards": 0, "append": 0}
    native = ring_records.native

    def counting(name, fn):
        def counted(*args):
            calls[name] += 1
            return fn(*args)

        return counted

    monkeypatch.setattr(native, "encode_ring", counting("encode", native.encode_ring))
    monkeypatch.setattr(native, "write_shards", counting("shards", native.write_shards))
    counted = counting("append", split_shards.SplitShards.append_records)
    monkeypatch.setattr(split_shards.SplitShards, "append_records", counted)
    monkeypatch.setattr(batch_lane, "INTERVAL", 600.0)  # no wake-up on the clock here
    seen = {}

    def flush_halfway(env):
        lane = env._batch.core.writer.lane
        seen["held"] = len(waiting_batches(env._batch.core.writer))
        seen["handed"] = lane.handed
        seen["wakes"], seen["calls"] = lane.wakes, dict(calls)
        _bounded(env.flush)  # wakes the sleeping lane at once
        seen["flushed"] = dict(calls)
        assert lane.idle and env.recorder.episodes_written > 40

    env = _record(tmp_path / "held", 200, between=flush_halfway)
    writer = env._batch.core.writer
    # Dozens of batches handed over, the writer woken at most once (the first, from idle:
    # it takes what is pending then, as many as a busy machine let pile up) and at most
    # one encode before the flush; the rest wait in the lane.
    assert seen["handed"] > 30 and seen["held"] > 0
    assert seen["wakes"] <= 1 and seen["calls"]["encode"] <= 1
    # The flush's wake-up: one encode for all of them, one call without the GIL for every
    # shard they go to (the open one filled and closed, the whole shards of 5, the next one
    # opened), nothing written from Python; twice that if the thread was taking the first
    # of them off the lane as the flush moved the rest.
    done = {k: seen["flushed"][k] - seen["calls"][k] for k in calls}
    assert done["encode"] in (1, 2) and done["shards"] in (1, 2) and calls["append"] == 0
    # The hand-overs after it woke the thread at most once (if the flush left it idle).
    assert writer.lane.wakes <= seen["wakes"] + 1
    _bounded(env.close)
    assert writer.lane.idle
    got, want = _records_in_order(tmp_path / "held"), _records_in_order(tmp_path / "reference")
    assert got == want and len(got) > 100


def test_spilled_episodes_keep_their_place_among_the_lanes_batches(tmp_path, monkeypatch):
    # A small ring: long episodes are spilled and handed over one by one on the
    # writer's queue, between batches waiting on the lane; the ring, about to cut out
    # rows of pending batches, wakes the writer itself.
    reference = _record(tmp_path / "reference", 150, ring_bytes=4096)
    reference.close()
    monkeypatch.setattr(batch_lane, "INTERVAL", 600.0)
    env = _record(tmp_path / "held", 150, ring_bytes=4096)
    lane = env._batch.core.writer.lane
    assert lane.wakes >= 2  # the first hand-over, and the ring's
    _bounded(env.close)
    got, want = _records_in_order(tmp_path / "held"), _records_in_order(tmp_path / "reference")
    assert got == want and len(got) > 50


def test_one_call_writes_the_open_shard_whole_shards_and_the_next_and_stops_at_a_failure(
    tmp_path,
):
    native = split_shards.batch_records.native
    buffer = bytes(range(100))
    head = tmp_path / "head"
    fd = os.open(head, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"HEAD")
    os.lseek(fd, 0, os.SEEK_SET)  # written at where its records end, wherever it stands
    paths = [tmp_path / name for name in ("a", "b", "c")]
    bounds = np.array([0, 10, 10, 40, 40, 70, 70, 100], np.int64)
    got = native.write_shards(fd, 4, True, tuple(bytes(p) for p in paths), buffer, bounds, True)
    head_state, files, error, tail = got
    assert (head_state, files, error) == (1, 3, 0) and tail >= 0
    os.write(tail, b"more")  # the next shard, left open at its records' end
    os.close(tail)
    assert head.read_bytes() == b"HEAD" + buffer[:10]
    assert [p.read_bytes() for p in paths] == [buffer[10:40], buffer[40:70], buffer[70:] + b"more"]
    # A failure stops it: the file there is never written through, none after it is made.
    paths = [tmp_path / name for name in ("d", "e", "f")]
    paths[1].write_bytes(b"already here")  # O_EXCL
    bounds = np.array([0, 0, 0, 30, 30, 60, 60, 90], np.int64)
    got = native.write_shards(-1, 0, False, tuple(bytes(p) for p in paths), buffer, bounds, True)
    assert got == (-1, 1, errno.EEXIST, -1)
    assert paths[0].read_bytes() == buffer[:30] and paths[1].read_bytes() == b"already here"
    assert not paths[2].exists()
    # The open shard's write failing: nothing else made, its descriptor left open.
    fd = os.open(head, os.O_RDONLY)
    try:
        bounds = np.array([0, 10, 10, 40], np.int64)
        got = native.write_shards(fd, 0, True, (bytes(tmp_path / "g"),), buffer, bounds, True)
        assert got == (0, 0, errno.EBADF, -1) and not (tmp_path / "g").exists()
        os.fstat(fd)  # still open
    finally:
        os.close(fd)


def test_an_open_shard_writing_zeros_ahead_is_filled_from_python_then_the_rest_in_one_call(
    tmp_path, monkeypatch
):
    # Where the open shard has zeros written ahead (its records went in from Python), a
    # write from C would race them: it is filled through the shard, the rest in one call.
    reference = _record(tmp_path / "reference", 200)
    reference.close()
    from rlds_writer.store.formats.tfrecord import tfrecord_shards

    monkeypatch.setattr(tfrecord_shards.TFRecordShardWriter, "plain_fd", lambda self: None)
    heads = []
    append = split_shards.SplitShards.append_records

    def noted(self, split, buffer, starts, lengths):
        heads.append(self._splits[split].shard.num_records + len(starts))
        return append(self, split, buffer, starts, lengths)

    monkeypatch.setattr(split_shards.SplitShards, "append_records", noted)
    env = _record(tmp_path / "held", 200)
    env.close()
    assert heads and all(n == 5 for n in heads[:-1])  # each fills the open shard
    got, want = _records_in_order(tmp_path / "held"), _records_in_order(tmp_path / "reference")
    assert got == want and len(got) > 100


def test_object_store_shards_from_the_lane_are_the_local_whole_shards(tmp_path, monkeypatch):
    # Locally the lane writes whole shards in one C call; on an object store (fsspec's
    # memory filesystem here) each shard is appended and uploaded at rotation: the
    # same files, byte for byte.
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.setattr(batch_lane, "INTERVAL", 600.0)  # everything written at flush()
    remote = f"memory://lane-{tmp_path.name}/ds"
    for path in (tmp_path / "local", remote):
        env = _record(path, 200)
        env.flush()
        env.close()
    fs = fsspec.filesystem("memory")
    names = sorted(name.rsplit("/", 1)[1] for name in fs.ls(remote, detail=False))
    assert names == sorted(os.listdir(tmp_path / "local"))
    shards = [name for name in names if ".tfrecord-" in name]
    assert len(shards) > 20
    for name in shards:
        assert fs.cat(f"{remote}/{name}") == (tmp_path / "local" / name).read_bytes(), name
    fs.rm(remote, recursive=True)


def test_a_vector_steps_batch_is_handed_over_without_a_numpy_sum_on_the_env_thread(
    tmp_path, monkeypatch
):
    # The steps in all are known from the plan (`offsets[-1] + steps[-1]`): a numpy sum
    # per vector step on the env thread cost ~3% of a recorded CartPole loop.
    from rlds_writer.record.batch import core

    made = []
    real = core.EpisodeBatch

    def noted(*args, **kwargs):
        batch = real(*args, **kwargs)
        made.append((args, kwargs, batch))
        return batch

    monkeypatch.setattr(core, "EpisodeBatch", noted)
    env = _record(tmp_path / "ds", 60)
    env.close()
    deferred = [(a, k, b) for a, k, b in made if b.cut is not None or a[0] is None]
    assert len(deferred) > 10
    for args, kwargs, batch in deferred:
        assert len(args) + len(kwargs) == 8  # num_steps given
        assert batch.num_steps == int(batch.steps.sum())
