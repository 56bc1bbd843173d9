"""A `writev` that writes less than asked (signals, pipes, full quotas) loses no byte of a record.

The kernel decides how much one `writev` writes; this cannot be provoked on a
local file on demand, so `os.writev` is replaced by one that writes at most a
few hundred bytes per call. Both write paths are covered: small records
(joined into one part) and large ones (written as many parts).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import load_episodes

import rlds_writer


def _config(shape: tuple[int, ...]) -> rlds_writer.DatasetConfig:
    return rlds_writer.DatasetConfig(
        name="short",
        observation_info=tfds.features.Tensor(shape=shape, dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
    )


@pytest.fixture(autouse=True)
def _writes_through_os_writev(monkeypatch):
    """Records through `os.writev` (not the extension's writes), replaced below."""
    from rlds_writer.store.formats.tfrecord import write_ahead

    monkeypatch.setattr(write_ahead, "WRITE_IN_C", False)


def test_records_written_a_few_hundred_bytes_per_writev_load_whole(tmp_path, monkeypatch):
    real_writev = os.writev
    calls = {"n": 0}

    def short_writev(fd, buffers):
        calls["n"] += 1
        data = b"".join(bytes(b) for b in buffers)
        return real_writev(fd, [data[:300]])

    monkeypatch.setattr(os, "writev", short_writev)
    rng = np.random.default_rng(0)
    expected = {}
    # (4,) rows: ~1 KB records, one joined part; (400, 200) rows: ~1.9 MB
    # records, written as separate parts.
    for name, shape, steps in (("small", (4,), 5), ("large", (400, 200), 6)):
        frames = [rng.standard_normal(shape).astype(np.float32) for _ in range(steps)]
        with rlds_writer.TFDSBackendWriter(str(tmp_path / name), _config(shape)) as backend:
            for _ in range(2):
                backend.begin_episode(frames[0])
                for t in range(1, steps):
                    backend.add_step(t, 0.5, 1.0, frames[t])
                backend.end_episode(terminated=True)
        expected[name] = frames
    monkeypatch.setattr(os, "writev", real_writev)
    assert calls["n"] > 100  # the records did go out in pieces
    for name, frames in expected.items():
        episodes = load_episodes(tmp_path / name)
        assert len(episodes) == 2
        for episode in episodes:
            observations = [step["observation"] for step in episode["steps"]]
            np.testing.assert_array_equal(np.stack(observations), np.stack(frames))
            assert [int(step["action"]) for step in episode["steps"]] == [
                *range(1, len(frames)),
                0,
            ]


def test_a_record_over_1_mib_reaches_the_os_in_1_mib_writevs_in_order(tmp_path, monkeypatch):
    # One multi-MB writev was 6x slower than the same bytes in 1 MiB calls on a
    # VM that returns free memory to its host; a big record is cut in order.
    from rlds_writer.store.storage import storage

    real_writev = os.writev
    sizes: list[int] = []

    def noting_writev(fd, buffers):
        sizes.append(sum(memoryview(b).nbytes for b in buffers))
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", noting_writev)
    rng = np.random.default_rng(1)
    shape = (700, 1000)  # 2.8 MB per frame, about 8.4 MB per 3-frame episode
    frames = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    with rlds_writer.TFDSBackendWriter(str(tmp_path / "big"), _config(shape)) as backend:
        backend.begin_episode(frames[0])
        for t in range(1, 3):
            backend.add_step(t, 0.5, 1.0, frames[t])
        backend.end_episode(terminated=True)
    monkeypatch.setattr(os, "writev", real_writev)
    assert max(sizes) <= storage.WRITE_CALL_BYTES
    assert sizes.count(storage.WRITE_CALL_BYTES) >= 8
    (episode,) = load_episodes(tmp_path / "big")
    observations = np.stack([step["observation"] for step in episode["steps"]])
    np.testing.assert_array_equal(observations, np.stack(frames))
