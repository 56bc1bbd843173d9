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
    calls = {"encode": 0, "whole": 0, "append": 0}
    native = ring_records.native

    def counting(name, fn):
        def counted(*args):
            calls[name] += 1
            return fn(*args)

        return counted

    monkeypatch.setattr(native, "encode_ring", counting("encode", native.encode_ring))
    for name, method in (("whole", "write_whole"), ("append", "append_records")):
        counted = counting(name, getattr(split_shards.SplitShards, method))
        monkeypatch.setattr(split_shards.SplitShards, method, counted)
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
    # The flush's wake-up: one encode for all of them, one call for the whole shards of 5,
    # at most two appends (filling the open shard, starting the next); twice that if
    # the thread was taking the first of them off the lane as the flush moved the rest.
    done = {k: seen["flushed"][k] - seen["calls"][k] for k in calls}
    assert done["encode"] in (1, 2) and done["whole"] in (1, 2) and done["append"] <= 4
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


def test_whole_shard_files_stop_at_the_first_that_cannot_be_made(tmp_path):
    native = split_shards.batch_records.native
    buffer = bytes(range(90))
    paths = [tmp_path / name for name in ("a", "b", "c")]
    paths[1].write_bytes(b"already here")  # O_EXCL: never written through
    bounds = np.array([0, 30, 30, 60, 60, 90], np.int64)
    written, error = native.write_files(tuple(bytes(p) for p in paths), buffer, bounds)
    assert (written, error) == (1, errno.EEXIST)
    assert paths[0].read_bytes() == buffer[:30] and paths[1].read_bytes() == b"already here"
    assert not paths[2].exists()


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
