"""Chunks of large rows are recycled, within a recording and across recordings, and bounded.

A fresh chunk costs a page fault per page, about as much as writing its
bytes to a file: a recording whose env outruns its writer must reuse the
chunks of written episodes instead of making new ones for every queued
episode; a closed recording leaves a few for the next one of the process;
a reused chunk never shows its old bytes; a forked child never takes its
parent's chunks.
"""

from __future__ import annotations

import os
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from helpers_core import load_episodes

import rlds_writer
from rlds_writer import RecordRLDS
from rlds_writer.record import chunk_columns
from rlds_writer.store.episodes import chunk_spares, episode_data

_SHAPE = (64, 64, 3)  # 12,288-byte rows: a chunked (large-row) column
_ROWS_PER_CHUNK = 4
# A raw row in its chunk: behind its 3-byte BytesList entry head
# (`chunk_columns.FramedRowsColumn`), so a chunk is (rows, _ROW) bytes.
_ROW = int(np.prod(_SHAPE)) + 3
_FRAMED = (_ROW,)
_KEY = "steps/observation"


@pytest.fixture(autouse=True)
def small_chunks_no_spares(monkeypatch):
    monkeypatch.setattr(chunk_columns, "_CHUNK_BYTES", _ROWS_PER_CHUNK * _ROW)
    monkeypatch.setattr(chunk_columns, "_IMAGE_CHUNK_BYTES", _ROWS_PER_CHUNK * int(np.prod(_SHAPE)))
    chunk_spares.spares.clear()  # none left by another test
    yield
    chunk_spares.spares.clear()


class _FramesEnv(gym.Env):
    """Frames filled with `fill + t` (or `fill` alone with `constant`), numbered by step."""

    observation_space = spaces.Box(0, 255, _SHAPE, np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, steps: int, fill: int, constant: bool = False):
        self.steps, self.fill, self.constant = steps, fill, constant
        self.frame = np.zeros(_SHAPE, np.uint8)

    def _obs(self):
        self.frame[:] = self.fill if self.constant else (self.fill + self.t) % 256
        return self.frame

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= self.steps, {}


def _record(env, episodes: int, seen: list | None = None) -> None:
    for episode in range(episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            if seen is not None:
                seen.extend(env.recorder._buffers[0].columns[_KEY].chunks)
            _, _, term, trunc, _ = env.step(0)
            done = term or trunc


def _address(chunk: np.ndarray) -> int:
    return chunk.__array_interface__["data"][0]


@pytest.mark.parametrize("encoding", ["bytes", "png"])
def test_an_env_outrunning_its_writer_reuses_two_episodes_of_chunks(tmp_path, encoding):
    # 10 steps: 11 rows, 3 chunks an episode. The writer is held (its I/O lock)
    # until two finished episodes wait: the env then waits for their chunks
    # instead of making new ones for every queued episode. Frames to encode
    # too, while no encoding process runs (64x64 PNG frames never start them).
    env = RecordRLDS(_FramesEnv(10, fill=0), tmp_path / "ds", image_encoding=encoding)
    seen: list[np.ndarray] = []  # held, not just their ids: a freed array's id can be reused
    writer = env.recorder.writer
    io_lock = writer._io_lock
    io_lock.acquire()
    recording = threading.Thread(target=_record, args=(env, 8, seen))
    recording.start()
    try:
        deadline = time.monotonic() + 60
        while writer._queued_count < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer._queued_count >= 2  # finished episodes wait for the writer
    finally:
        io_lock.release()
        recording.join()
    env.close()
    episodes = rlds_writer.open_dataset(tmp_path / "ds").episodes()
    frames = [e["steps"]["observation"] for e in episodes]
    assert [len(f) for f in frames] == [11] * 8
    for recorded in frames:
        for t, frame in enumerate(recorded):
            assert (frame == t).all()
    # Three episodes' chunks (two written or queued, one being filled), not eight.
    assert len({id(c) for c in seen}) <= 9


def test_a_closed_recording_leaves_chunks_to_the_next_which_never_shows_their_old_bytes(
    tmp_path,
):
    first = RecordRLDS(
        _FramesEnv(10, fill=0xAB, constant=True), tmp_path / "a", image_encoding="bytes"
    )
    old: list[np.ndarray] = []
    _record(first, 2, old)
    first.close()
    old_addresses = {_address(c) for c in old}

    # Shorter episodes in the second recording: the chunks' unused rows hold 0xAB.
    second = RecordRLDS(_FramesEnv(2, fill=1), tmp_path / "b", image_encoding="bytes")
    new: list[np.ndarray] = []
    _record(second, 3, new)
    second.close()
    assert {_address(c) for c in new} & old_addresses  # the first recording's chunks, reused
    episodes = load_episodes(tmp_path / "b")
    assert [len(e["steps"]) for e in episodes] == [3, 3, 3]
    for recorded in episodes:
        for t, step in enumerate(recorded["steps"]):
            np.testing.assert_array_equal(step["observation"], np.full(_SHAPE, 1 + t, np.uint8))
    shards = [p for p in (tmp_path / "b").iterdir() if "tfrecord" in p.name]
    assert shards and all(b"\xab" * 64 not in p.read_bytes() for p in shards)


def test_spares_are_bounded_and_let_go_when_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(chunk_spares, "_SPARE_BYTES", 5 * _ROWS_PER_CHUNK * _ROW)
    monkeypatch.setattr(chunk_spares, "_SPARE_IDLE", 0.2)
    env = RecordRLDS(_FramesEnv(30, fill=0), tmp_path / "ds", image_encoding="bytes")
    _record(env, 3)  # 31 rows: 8 chunks an episode
    env.close()
    assert 0 < chunk_spares.spares._nbytes <= chunk_spares._SPARE_BYTES
    deadline = time.monotonic() + 60
    while chunk_spares.spares._nbytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chunk_spares.spares._nbytes == 0


def test_a_forked_child_never_takes_its_parents_chunks(tmp_path):
    env = RecordRLDS(_FramesEnv(10, fill=0), tmp_path / "ds", image_encoding="bytes")
    pool = env.recorder._fields.pool
    _record(env, 2)
    env.flush()
    # Held here (so no allocation in either process can take their addresses).
    held = [b for bufs in pool._free.values() for b in bufs]
    env.close()
    held += [flat for *_, flat in chunk_spares.spares._items]
    parents = {_address(b) for b in held}
    assert parents
    rows = _ROWS_PER_CHUNK
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: neither the recording's pool nor the process's spares
        ok = False
        try:
            taken = [pool.take(_KEY, rows, _FRAMED, np.dtype(np.uint8)) for _ in range(4)]
            taken += [
                episode_data.BufferPool().take(_KEY, rows, _FRAMED, np.dtype(np.uint8))
                for _ in range(4)
            ]
            ok = not ({_address(c) for c in taken} & parents)
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    # The parent still takes its own.
    again = episode_data.BufferPool().take(_KEY, rows, _FRAMED, np.dtype(np.uint8))
    assert _address(again) in parents


def test_an_episode_never_written_does_not_leave_the_pool_waiting():
    pool = episode_data.BufferPool()
    chunks = [pool.take(_KEY, 2, _SHAPE, np.dtype(np.uint8), wait=True) for _ in range(2)]
    episode = episode_data.Episode({}, {}, 1, [(_KEY, c) for c in chunks], pool)
    assert pool._lent[_KEY] == 2
    del episode  # dropped unwritten (a failed writer): its chunks are not coming back
    assert pool._lent[_KEY] == 0
    pool.take(_KEY, 2, _SHAPE, np.dtype(np.uint8), wait=True)  # returns at once
