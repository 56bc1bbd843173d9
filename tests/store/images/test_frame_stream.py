"""Camera frames are encoded while their episode runs, and the dataset is the same.

JPEG frames large enough for the encoding threads are copied into a small
ring at the step and encoded on background threads as batches fill, so an
episode's raw frames are never all in memory and its encoding is mostly done
when it ends. The shards are byte for byte those of the single-threaded
encoder; a refused step drops its frame; a frame that cannot be encoded fails
the write naming the field.
"""

from __future__ import annotations

import os
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from test_image_processes import _shard_bytes

import rlds_writer
from rlds_writer import RecordRLDS
from rlds_writer.errors import StepValueError, WriterFailedError
from rlds_writer.record.chunk_columns import _StreamedImageColumn
from rlds_writer.store.images import frame_stream, image_codecs
from rlds_writer.store.writing import encoding

_SIDE = 48
_KEY = "steps/observation/image"


@pytest.fixture(autouse=True)
def stream_these_small_frames(monkeypatch):
    """The 48x48 frames here stream as 256x256 camera frames do."""
    monkeypatch.setattr(encoding, "THREADS_MIN_FRAME_BYTES", _SIDE * _SIDE * 3)


class _Camera(gym.Env):
    """A camera drawn in place into one array, and a state; `bad_at` steps give a bad state."""

    observation_space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (_SIDE, _SIDE, 3), np.uint8),
            "state": spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = spaces.Discrete(2)

    def __init__(self, steps: int = 30, bad_at: tuple[int, ...] = ()):
        self.steps, self.bad_at = steps, bad_at
        self.frame = np.zeros((_SIDE, _SIDE, 3), np.uint8)
        self.episode = 0

    def _obs(self):
        ramp = np.add.outer(np.arange(_SIDE), np.arange(_SIDE)) * 3 + self.t * 11 + self.episode
        self.frame[..., 0] = ramp % 256
        self.frame[..., 1] = (ramp // 2) % 256
        self.frame[..., 2] = 255 - ramp % 256
        state = np.full((3,) if self.t in self.bad_at else (2,), self.t / 100, np.float32)
        return {"image": self.frame, "state": state}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode += 1
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= self.steps, {}


def _record(env, episodes: int, refused: list | None = None) -> None:
    for _ in range(episodes):
        env.reset()
        done = False
        while not done:
            try:
                _, _, terminated, truncated, _ = env.step(0)
            except StepValueError as e:
                if refused is None:
                    raise
                refused.append(e)
                continue
            done = terminated or truncated


def _reference(tmp_path, env: gym.Env, episodes: int, name: str = "alone") -> bytes:
    """The same recording with every frame encoded on the writer thread (no stream)."""
    recorder = RecordRLDS(env, str(tmp_path / name), image_encoding="jpeg", image_workers=0)
    _record(recorder, episodes, refused=[])
    recorder.close()
    return _shard_bytes(tmp_path / name)


def test_frames_are_encoded_on_background_threads_while_the_episode_runs(tmp_path, monkeypatch):
    encoded: list[tuple[str, int]] = []  # (thread, the env's step when encoded)
    real = image_codecs.JpegFrames.encode
    camera = _Camera(steps=30)

    def encode_and_note(codec, frame):
        encoded.append((threading.current_thread().name, camera.t))
        return real(codec, frame)

    monkeypatch.setattr(image_codecs.JpegFrames, "encode", encode_and_note)
    env = RecordRLDS(camera, str(tmp_path / "ds"), image_encoding="jpeg")
    env.reset()
    recorder = env._recording.recorder
    (buffer,) = recorder._buffers.values()
    column = buffer.columns[_KEY]
    assert isinstance(column, _StreamedImageColumn)
    ring = column.stream._ring
    for _ in range(12):  # 13 frames: three batches of 4 handed over
        env.step(0)
    deadline = time.monotonic() + 30
    while len(encoded) < 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(encoded) >= 12, "no frame was encoded while the episode ran"
    assert all(t <= 12 for _, t in encoded)
    done = False
    while not done:  # the rest of this episode
        _, _, terminated, truncated, _ = env.step(0)
        done = terminated or truncated
    _record(env, 2)
    env.close()
    assert {name for name, _ in encoded} == {"rlds_writer_frames"}
    assert len(encoded) == 3 * 31
    # One small ring for the whole recording; no chunk of raw frames was taken.
    assert column.stream._ring is ring
    assert len(ring) == frame_stream.BATCH_FRAMES * frame_stream.RING_BATCHES
    pool = recorder._fields.pool
    assert _KEY not in pool._free and _KEY not in pool._lent
    assert _shard_bytes(tmp_path / "ds") == _reference(tmp_path, _Camera(steps=30), 3)
    frames = rlds_writer.open_dataset(tmp_path / "ds").episodes()[0]["steps"]["observation"]
    assert frames["image"].shape == (31, _SIDE, _SIDE, 3)


@pytest.mark.parametrize("bad_at", [1, 3, 4, 5])
def test_a_refused_step_drops_its_frame_whether_or_not_its_batch_was_handed_over(
    tmp_path, monkeypatch, bad_at
):
    # The camera is put before the state is refused: its frame must go, from
    # the batch being filled, unencoded (1, 4, 5), or, once handed over with
    # its batch (3), from the episode's entries.
    real = image_codecs.JpegFrames.encode
    encodes = []
    monkeypatch.setattr(image_codecs.JpegFrames, "encode", lambda *a: encodes.append(1) or real(*a))
    env = RecordRLDS(
        _Camera(steps=20, bad_at=(bad_at,)), str(tmp_path / "ds"), image_encoding="jpeg"
    )
    refused: list[StepValueError] = []
    _record(env, 2, refused)
    env.close()
    assert len(refused) == 2 and "state" in str(refused[0])
    assert len(encodes) == 2 * (bad_at + (bad_at == 3))
    reference = _reference(tmp_path, _Camera(steps=20, bad_at=(bad_at,)), 2)
    assert _shard_bytes(tmp_path / "ds") == reference
    episodes = rlds_writer.open_dataset(tmp_path / "ds").episodes()
    assert [len(e["steps"]["observation"]["image"]) for e in episodes] == [bad_at] * 2


def test_a_frame_that_cannot_be_encoded_fails_the_write_naming_the_field(tmp_path, monkeypatch):
    calls = []

    def encode_or_fail(codec, frame):
        calls.append(1)
        if len(calls) == 7:
            raise OSError("encoder out of memory")
        return b"\xff\xd8 not really a jpeg"

    monkeypatch.setattr(image_codecs.JpegFrames, "encode", encode_or_fail)
    env = RecordRLDS(_Camera(steps=10), str(tmp_path / "ds"), image_encoding="jpeg")
    expected = f"{_KEY}: could not encode \\(encoder out of memory\\)"
    with pytest.raises(WriterFailedError, match=expected):
        _record(env, 1)
        env.flush()
    with pytest.raises(WriterFailedError, match=expected):
        env.close()


def test_frames_are_encoded_in_place_when_no_thread_can_start(tmp_path, monkeypatch):
    # At interpreter exit (Python 3.12+) no new thread may start: an episode
    # closed then is encoded on the calling thread, and nothing is lost.
    def no_new_threads(wanted):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(frame_stream, "_threads", no_new_threads)
    env = RecordRLDS(_Camera(steps=9), str(tmp_path / "ds"), image_encoding="jpeg")
    _record(env, 2)
    env.close()
    assert _shard_bytes(tmp_path / "ds") == _reference(tmp_path, _Camera(steps=9), 2)


def test_a_forked_child_streams_on_threads_of_its_own(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    parent = RecordRLDS(_Camera(steps=8), str(tmp_path / "parent"), image_encoding="jpeg")
    _record(parent, 1)  # the parent's threads run
    parent.close()
    pid = os.fork()
    if pid == 0:  # the child: record with threads it must make itself
        code = 1
        try:
            child = RecordRLDS(_Camera(steps=8), str(tmp_path / "child"), image_encoding="jpeg")
            _record(child, 2)
            child.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _shard_bytes(tmp_path / "child") == _reference(tmp_path, _Camera(steps=8), 2)
