"""Image frames stay in ordinary memory until encoding processes run.

Shared memory (`store/episodes/shared_frames.py`) is where worker processes read the
frames, but it costs several times more to fault in: a recording that never
starts a process keeps its frames in ordinary memory; once processes start,
the next chunks are shared (ordinary ones made before are let go, not
recycled); and the bytes are the same either way.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers_core import load_episodes
from test_image_processes import _Cameras, _run_episodes, _shard_bytes, _worker_pids

from rlds_writer import RecordRLDS
from rlds_writer.record.chunk_columns import LargeArrayColumn
from rlds_writer.store.episodes import shared_frames
from rlds_writer.store.images import image_processes
from rlds_writer.store.writing import encoding

pytestmark = pytest.mark.skipif(
    not image_processes.supported(), reason="image processes need Linux (memfd)"
)


@pytest.fixture(autouse=True)
def _no_idle_pool():
    image_processes.shutdown()
    yield
    image_processes.shutdown()


def _image_chunks(env) -> list[np.ndarray]:
    """The chunks the open episode's image columns hold."""
    (buffer,) = env.recorder._buffers.values()
    return [
        chunk
        for column in buffer.columns.values()
        if isinstance(column, LargeArrayColumn)
        for chunk in column.chunks
    ]


def test_a_recording_without_processes_keeps_its_frames_in_ordinary_memory(tmp_path):
    env = RecordRLDS(_Cameras(), str(tmp_path / "ds"), image_encoding="png", image_workers=2)
    for _ in range(3):
        env.reset(seed=0)
        for _ in range(5):
            env.step(np.zeros(2, np.float32))
        chunks = _image_chunks(env)
        assert len(chunks) == 2  # one per camera
        assert not any(shared_frames.is_shared(c) for c in chunks)
        for _ in range(_Cameras().steps - 5):
            env.step(np.zeros(2, np.float32))
        env.flush()
    env.close()
    assert _worker_pids(os.getpid()) == []
    assert len(load_episodes(tmp_path / "ds")) == 3


def test_once_the_processes_run_frames_go_to_shared_memory_and_the_bytes_stay(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    env = RecordRLDS(_Cameras(), str(tmp_path / "ds"), image_encoding="png", image_workers=2)
    env.reset(seed=0)
    first = _image_chunks(env)
    assert not any(shared_frames.is_shared(c) for c in first)  # nothing runs yet
    for _ in range(_Cameras().steps):
        env.step(np.zeros(2, np.float32))
    env.flush()  # encoded in the processes, from ordinary memory (copied to their slots)
    assert len(_worker_pids(os.getpid())) == 2 and shared_frames.wanted()
    # The second episode's chunks were taken as the first ended, before the
    # processes ran; the third's are taken as the second ends: shared.
    _run_episodes(env, 1)
    env.reset()
    chunks = _image_chunks(env)
    assert chunks and all(shared_frames.is_shared(c) for c in chunks)
    for _ in range(_Cameras().steps):
        env.step(np.zeros(2, np.float32))
    env.close()
    image_processes.shutdown()
    assert not shared_frames.wanted()
    reference = RecordRLDS(
        _Cameras(), str(tmp_path / "alone"), image_encoding="png", image_workers=0
    )
    _run_episodes(reference, 3, seed=0)
    reference.close()
    assert _shard_bytes(tmp_path / "ds") == _shard_bytes(tmp_path / "alone")
