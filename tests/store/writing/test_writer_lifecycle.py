"""The writer's lifecycle: background thread, flush, commits, exit, buffer reuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import load_episodes, new_buffer

import rlds_writer
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage import file_io
from rlds_writer.store.writing.writer import DatasetWriter


def _config(obs_shape=(3,), obs_dtype=np.float32, **kwargs):
    return rlds_writer.DatasetConfig(
        name="life",
        observation_info=tfds.features.Tensor(shape=obs_shape, dtype=obs_dtype),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        **kwargs,
    )


def _record(writer, episodes, steps=3, obs_shape=(3,), obs_dtype=np.float32, start=0):
    for e in range(start, start + episodes):
        buffer = new_buffer(writer)
        buffer.start(np.full(obs_shape, e, obs_dtype))
        for t in range(steps):
            buffer.add(t, float(e), 1.0, np.full(obs_shape, e * 100 + t, obs_dtype))
        writer.write(buffer.finish(terminated=True))


def _load(path, split="train"):
    builder = tfds.builder_from_directory(os.fspath(path))
    return list(tfds.as_numpy(builder.as_dataset(split=split)))


def _listed_episodes(path):
    info = file_io.read_json(os.path.join(path, layout.DATASET_INFO))
    return sum(sum(lengths) for lengths, _ in layout.read_splits(info).values())


def test_flush_makes_episodes_loadable_while_writer_stays_open(tmp_path):
    writer = rlds_writer.store.DatasetWriter(tmp_path, _config(), commit_interval=3600)
    try:
        _record(writer, 5)
        writer.flush()
        assert _listed_episodes(tmp_path) == 5
        episodes = _load(tmp_path)
        assert [int(ep["steps"]["observation"][0][0]) for ep in _steps_as_dicts(episodes)] == [
            0,
            1,
            2,
            3,
            4,
        ]
    finally:
        writer.close()


def _steps_as_dicts(episodes):
    out = []
    for ep in episodes:
        steps = list(ep["steps"])
        out.append({"steps": {k: np.stack([s[k] for s in steps]) for k in steps[0]}})
    return out


def test_dataset_info_is_committed_on_a_timer_without_flush(tmp_path):
    writer = rlds_writer.store.DatasetWriter(tmp_path, _config(), commit_interval=0.2)
    try:
        _record(writer, 3)
        deadline = time.monotonic() + 30
        while _listed_episodes(tmp_path) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _listed_episodes(tmp_path) == 3
    finally:
        writer.close()


def test_error_in_writer_thread_reaches_caller_and_keeps_earlier_episodes(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="life",
        observation_info=tfds.features.Image(shape=(4, 4, 3), encoding_format="png"),
        action_info=np.int64,
    )
    writer = rlds_writer.store.DatasetWriter(tmp_path, config, commit_interval=3600)
    good = np.zeros((4, 4, 3), np.uint8)
    for _ in range(2):
        buffer = new_buffer(writer)
        buffer.start(good)
        buffer.add(1, None, None, good)
        writer.write(buffer.finish(terminated=True))
    writer.flush()
    # A path that does not exist passes the per-step check (TFDS accepts image
    # paths) and fails when the writer thread encodes it.
    buffer = new_buffer(writer)
    buffer.start(os.fspath(tmp_path / "missing.png"))
    with pytest.raises(rlds_writer.errors.WriterFailedError):
        # Raised by this write (a small episode written inline) or, when the
        # writer thread takes it, by the next call.
        writer.write(buffer.finish(terminated=True))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            writer.flush()
            time.sleep(0.05)
    with pytest.raises(rlds_writer.errors.WriterFailedError):
        writer.flush()
    with pytest.raises(rlds_writer.errors.WriterFailedError):
        writer.close()
    episodes = _load(tmp_path)
    assert len(episodes) == 2


# Slow: a fresh interpreter that exits with an episode open (the recorders:
# tests/record/test_exit_writes_open_episodes.py).
@pytest.mark.slow
def test_interpreter_exit_writes_the_open_episode_cut_short(tmp_path):
    script = textwrap.dedent(
        f"""
        import rlds_writer
        env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory={str(tmp_path)!r},
                                    name="catch")
        for _ in range(2):
            ts = env.reset()
            while not ts.last():
                ts = env.step(1)
        env.reset()
        env.step(0)
        env.step(2)
        # no close(): the exit hook must end and write the open episode
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    episodes = [list(ep["steps"]) for ep in _load(tmp_path)]
    assert [len(ep) for ep in episodes] == [10, 10, 3]
    last = episodes[-1]
    assert [bool(s["is_last"]) for s in last] == [False, False, True]
    assert not any(bool(s["is_terminal"]) for s in last)
    assert bool(episodes[0][-1]["is_terminal"])
    assert not os.path.exists(tmp_path / layout.LOCK)


@pytest.mark.parametrize("obs_shape", [(3,), (64, 64, 3)], ids=["small_rows", "large_rows"])
def test_env_reusing_its_observation_array_records_each_steps_value(tmp_path, obs_shape):
    writer = rlds_writer.store.DatasetWriter(tmp_path, _config(obs_shape, np.uint8))
    shared = np.zeros(obs_shape, np.uint8)  # mutated in place, like vector envs do
    for e in range(4):  # several episodes, so recycled buffers are exercised
        buffer = new_buffer(writer)
        shared[...] = e
        buffer.start(shared)
        for t in range(5):
            shared[...] = 10 * e + t + 1
            buffer.add(t, 0.0, 1.0, shared)
        writer.write(buffer.finish(terminated=False))
    writer.close()
    episodes = _load(tmp_path)
    for e, ep in enumerate(episodes):
        firsts = [int(s["observation"].reshape(-1)[0]) for s in ep["steps"]]
        assert firsts == [e] + [10 * e + t + 1 for t in range(5)]
        for s in ep["steps"]:
            assert (s["observation"] == s["observation"].reshape(-1)[0]).all()


def test_close_is_idempotent_and_releases_the_lock(tmp_path):
    writer = rlds_writer.store.DatasetWriter(tmp_path, _config())
    _record(writer, 1)
    writer.close()
    writer.close()
    assert not os.path.exists(tmp_path / layout.LOCK)
    with pytest.raises(rlds_writer.errors.WriterClosedError):
        _record(writer, 1)
    info = json.loads((tmp_path / layout.DATASET_INFO).read_text())
    assert info["splits"][0]["shardLengths"] == ["1"]


def test_buffer_pool_prefills_a_warm_spare_that_the_next_take_returns():
    import time

    from rlds_writer.store.episodes.episode_data import BufferPool

    pool = BufferPool(max_per_key=2)
    pool.prefill("cam", 128, (8, 8, 3), np.dtype(np.uint8))
    deadline = time.monotonic() + 30
    while not pool._free.get("cam") and time.monotonic() < deadline:
        time.sleep(0.01)
    spare = pool.take("cam", 64, (8, 8, 3), np.dtype(np.uint8))
    assert spare.shape == (128, 8, 8, 3) and not spare.any()
    # Asking again while a large-enough spare is free makes no second one.
    pool.give("cam", spare)
    pool.prefill("cam", 100, (8, 8, 3), np.dtype(np.uint8))
    time.sleep(0.2)
    assert len(pool._free["cam"]) == 1


def test_a_new_writer_imports_only_its_shard_format(tmp_path):
    # Every module a recording imports after the package is a cost of each new
    # writer (the fixed cost of a short recording): dm-tree through TFDS's
    # `feature.shape`, google_crc32c where the CRC-32C extension is built and
    # dataclass-making modules each cost 0.4-1.6 ms. Only the TFRecord format
    # and the C extensions may load here.
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import tensorflow_datasets as tfds
        import rlds_writer
        from rlds_writer.envs import catch

        EnvLogger = rlds_writer.EnvLogger  # the package's modules load on first use
        env = catch.Catch()
        before = set(sys.modules)
        logged = EnvLogger(env, data_directory={str(tmp_path / "d")!r})
        timestep = logged.reset()
        while not timestep.last():
            timestep = logged.step(1)
        logged.close()
        print(" ".join(sorted(set(sys.modules) - before)))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    allowed = {
        "rlds_writer.store.formats.tfrecord.tfrecord",
        "rlds_writer.store.formats.tfrecord.tfrecord_shards",
        "rlds_writer.store.formats.tfrecord._crc32c",
        "rlds_writer.record._step_kernel",
        "rlds_writer._native",  # how they load
    }
    try:
        import rlds_writer.store.formats.tfrecord._crc32c  # noqa: F401
    except ImportError:  # framed with google_crc32c (its package's modules)
        allowed |= {m for m in out if m.startswith("google_crc32c")}
    assert set(out) <= allowed, sorted(set(out) - allowed)
    assert len(load_episodes(tmp_path / "d")) == 1


def test_splits_named_like_the_writers_own_queue_items_are_written(tmp_path):
    # fsync=True: every episode goes through the writer thread's queue, whose
    # flush and close items once were the strings "flush" and "close".
    writer = DatasetWriter(tmp_path / "d", _config(), fsync=True)
    for split in ("flush", "close"):
        buffer = new_buffer(writer)
        buffer.start(np.zeros(3, np.float32))
        buffer.add(1, 1.0, 1.0, np.ones(3, np.float32))
        writer.write(buffer.finish(terminated=True), split=split)
    writer.close()
    builder = tfds.builder_from_directory(str(tmp_path / "d"))
    counts = {name: s.num_examples for name, s in builder.info.splits.items()}
    assert (counts["flush"], counts["close"]) == (1, 1), counts


@pytest.mark.parametrize("queued", [False, True], ids=["written-inline", "queued"])
def test_close_lists_every_episode_whether_written_inline_or_still_queued(tmp_path, queued):
    # Small episodes are written inline and close() finishes the shards itself;
    # large ones (> 256 KiB) go to the writer thread's queue, held here behind
    # the I/O lock until close(), which must let the thread drain it first.
    shape = (300, 300) if queued else (3,)
    writer = DatasetWriter(tmp_path, _config(obs_shape=shape), commit_interval=3600)
    if queued:
        with writer._io_lock:
            _record(writer, 6, steps=2, obs_shape=shape)
            assert writer._queue.qsize() >= 5
    else:
        _record(writer, 6, steps=2, obs_shape=shape)
        assert writer._queue.qsize() == 0
    writer.close()
    assert not writer._thread.is_alive()
    assert _listed_episodes(tmp_path) == 6
    firsts = [int(ep["steps"][0]["observation"].flat[0]) for ep in load_episodes(tmp_path)]
    assert sorted(firsts) == list(range(6))


class _GatedLock:
    """The writer's I/O lock, which its thread acquires only once `gate` is set."""

    def __init__(self, thread, gate):
        self._lock, self._thread, self._gate = threading.Lock(), thread, gate

    def acquire(self, blocking=True, timeout=-1):
        if threading.current_thread() is self._thread:
            self._gate.wait(30)
        return self._lock.acquire(blocking, timeout)

    def release(self):
        self._lock.release()

    def __enter__(self):
        self.acquire()

    def __exit__(self, *exc):
        self.release()


def test_close_lists_an_episode_the_writer_thread_took_but_has_not_written(tmp_path):
    # The writer thread has taken an episode off its queue and not yet the I/O
    # lock: close() sees an empty queue, yet must not finish the shards before
    # that episode is written, or it lands in a shard no dataset_info.json lists.
    writer = DatasetWriter(tmp_path, _config(obs_shape=(300, 300)))
    gate = threading.Event()
    writer._io_lock = _GatedLock(writer._thread, gate)
    _record(writer, 1, steps=2, obs_shape=(300, 300))  # > 256 KiB: queued
    deadline = time.monotonic() + 30
    while writer._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.001)
    threading.Timer(0.3, gate.set).start()  # the thread goes on while close() runs
    writer.close()
    assert not writer._thread.is_alive()
    assert _listed_episodes(tmp_path) == 1
    assert len(load_episodes(tmp_path)) == 1
