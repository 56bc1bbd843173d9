"""Large rows (images, big tensors) are kept in chunks: long episodes, rollbacks, recycling."""

from __future__ import annotations

import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds
from gymnasium import spaces
from helpers_core import load_episodes

import rlds_writer
from rlds_writer import RecordRLDS
from rlds_writer.errors import StepValueError
from rlds_writer.record import chunk_columns
from rlds_writer.store.episodes.episode_data import BufferPool
from rlds_writer.store.formats.tfrecord import tfrecord

# Three 16x16x3 frames per chunk: every episode below spans several chunks.
_SMALL_CHUNK = 3 * 16 * 16 * 3


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunk_columns, "_CHUNK_BYTES", _SMALL_CHUNK)
    monkeypatch.setattr(chunk_columns, "_IMAGE_CHUNK_BYTES", _SMALL_CHUNK)


class _FramesEnv(gym.Env):
    """A camera frame and a 2,048-float lidar scan per step, numbered by step."""

    observation_space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (16, 16, 3), np.uint8),
            "scan": spaces.Box(-1e9, 1e9, (2048,), np.float32),
        }
    )
    action_space = spaces.Discrete(2)

    def __init__(self, steps: int):
        self.steps = steps
        self.frame = np.zeros((16, 16, 3), np.uint8)

    def _obs(self):
        self.frame[:] = (7 * self.t + 3 * self.episode) % 256  # one array, drawn in place
        return {"image": self.frame, "scan": np.full(2048, self.t + 0.5, np.float32)}

    def reset(self, *, seed=None, options=None):
        self.episode = seed or 0
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= self.steps, {}


def _play(env, seed=None) -> None:
    """One episode, reset to its end."""
    env.reset(seed=seed)
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(0)
        done = terminated or truncated


@pytest.mark.parametrize("image_encoding", ["png", "jpeg", "bytes", "none"])
def test_episodes_spanning_many_chunks_are_recorded_exactly(tmp_path, small_chunks, image_encoding):
    lengths = [10, 1, 7, 25]
    env = RecordRLDS(_FramesEnv(0), tmp_path / "ds", image_encoding=image_encoding)
    for episode, steps in enumerate(lengths):
        env.unwrapped.steps = steps
        _play(env, seed=episode)
    env.close()
    episodes = load_episodes(tmp_path / "ds")
    assert [len(e["steps"]) for e in episodes] == [n + 1 for n in lengths]
    for episode, recorded in enumerate(episodes):
        for t, step in enumerate(recorded["steps"]):
            want = (7 * t + 3 * episode) % 256
            image = step["observation"]["image"].astype(int)
            # JPEG is lossy; a flat frame decodes within a level of its value.
            assert np.abs(image - want).max() <= (1 if image_encoding == "jpeg" else 0)
            np.testing.assert_array_equal(step["observation"]["scan"], t + 0.5)
    # The TF-free reader sees the same rows.
    ours = rlds_writer.open_dataset(tmp_path / "ds").episodes()[3]
    np.testing.assert_array_equal(ours["steps"]["observation"]["scan"][:, 0], np.arange(26) + 0.5)


@pytest.mark.parametrize(
    "image_feature",
    [
        tfds.features.Image(shape=(16, 16, 3)),
        # Raw frames kept behind their entry heads (`FramedRowsColumn`): with
        # the small chunks, one row per chunk.
        tfds.features.Tensor(shape=(64, 64, 3), dtype=np.uint8, encoding="bytes"),
    ],
    ids=["png", "raw-bytes"],
)
def test_a_refused_step_at_a_chunk_boundary_rolls_back_and_recording_goes_on(
    tmp_path, small_chunks, image_feature
):
    config = rlds_writer.DatasetConfig(
        name="rollback",
        observation_info={
            "image": image_feature,
            "scan": tfds.features.Tensor(shape=(2048,), dtype=np.float32),
        },
        action_info=np.int64,
        reward_info=np.float32,
    )

    def obs(t):
        return {
            "image": np.full(image_feature.shape, t, np.uint8),
            "scan": np.full(2048, t, np.float32),
        }

    with rlds_writer.TFDSBackendWriter(tmp_path / "ds", config) as writer:
        writer.begin_episode(obs(0))
        for t in range(1, 9):
            if t in (3, 6):  # the image takes a new chunk, then the scan is refused
                bad = {"image": obs(t)["image"], "scan": np.zeros(3, np.float32)}
                with pytest.raises(StepValueError, match="scan"):
                    writer.add_step(0, 0.0, None, bad)
            writer.add_step(t, float(t), None, obs(t))
        writer.end_episode(terminated=True)
    (episode,) = load_episodes(tmp_path / "ds")
    assert [int(s["observation"]["image"][0, 0, 0]) for s in episode["steps"]] == list(range(9))
    assert [float(s["observation"]["scan"][0]) for s in episode["steps"]] == list(range(9))
    assert [int(s["action"]) for s in episode["steps"][:-1]] == list(range(1, 9))


def test_chunks_of_written_episodes_are_recycled_for_the_next(tmp_path, small_chunks):
    env = RecordRLDS(_FramesEnv(12), tmp_path / "ds", image_encoding="png")
    chunks = []
    for episode in range(4):
        env.reset(seed=episode)
        done = False
        while not done:
            # The episode's buffer as it stands before the last step ends it.
            column = env.recorder._buffers[0].columns["steps/observation/image"]
            # Held, not just their ids: a freed array's id can be reused.
            held = list(column.chunks)
            _, _, term, trunc, _ = env.step(0)
            done = term or trunc
        chunks.append(held)
        env.flush()  # written: its chunks are back in the pool
    env.close()
    assert len(load_episodes(tmp_path / "ds")) == 4
    # 12 of 13 rows in chunks of 3: 4 chunks; later episodes reuse earlier ones.
    ids = [{id(c) for c in held} for held in chunks]
    assert all(len(i) == 4 for i in ids)
    assert ids[2] & (ids[0] | ids[1])
    assert ids[3] & (ids[0] | ids[1] | ids[2])


class _CameraEnv(gym.Env):
    """84x84x3 frames, `steps` per episode."""

    observation_space = spaces.Box(0, 255, (84, 84, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, steps: int):
        self.steps = steps

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros((84, 84, 3), np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.full((84, 84, 3), self.t % 256, np.uint8), 0.0, False, self.t >= self.steps, {}


class _BigFrameEnv(gym.Env):
    """One 256x256x3 frame: a copy long enough for a waiting thread to wake in."""

    shape = (256, 256, 3)
    observation_space = spaces.Box(0, 255, shape, np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(self.shape, np.uint8), {}

    def step(self, action):
        return np.zeros(self.shape, np.uint8), 0.0, False, False, {}


def test_raw_frames_take_chunks_of_at_most_2_mib(tmp_path):
    # Chunks are recycled whole: an 8.5 MB episode in 8 MB chunks held 16 MB,
    # and a recording kept four such chunks warm. In 2 MiB chunks an episode
    # holds less than its frames plus one chunk.
    env = RecordRLDS(_CameraEnv(399), tmp_path / "ds", image_encoding="bytes")
    env.reset()
    (buffer,) = env._recording.recorder._buffers.values()
    column = buffer.columns["steps/observation"]
    for _ in range(398):
        env.step(0)
    held = sum(chunk.nbytes for chunk in column.chunks)
    frames = 399 * 84 * 84 * 3
    assert frames <= held < frames + (2 << 20)
    env.step(0)
    env.close()
    (episode,) = load_episodes(tmp_path / "ds")
    assert len(episode["steps"]) == 400


def _other_thread_turns(column, frame: np.ndarray, rows: int) -> int:
    """Turns a thread waiting for the GIL got while `column` copied `rows` frames.

    The switch interval is lifted out of reach, so that thread runs only when
    the copying thread lets the GIL go of its own accord.
    """
    kept = column.n
    turns = 0
    started = threading.Event()
    stop = threading.Event()

    def other() -> None:
        nonlocal turns
        started.set()
        while not stop.is_set():
            turns += 1
            time.sleep(0)  # lets the GIL go, then waits for it back

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    thread = threading.Thread(target=other, daemon=True)
    try:
        thread.start()
        started.wait()
        before = turns
        for _ in range(rows):
            column.append(frame)
        during = turns - before
    finally:
        stop.set()
        sys.setswitchinterval(interval)
    thread.join()
    column.truncate(kept)
    return during


@pytest.mark.parametrize("image_encoding, lets_go", [("bytes", True), ("png", False)])
def test_raw_frame_copies_let_the_writer_thread_run_and_image_frame_copies_keep_the_gil(
    tmp_path, monkeypatch, image_encoding, lets_go
):
    # Raw frames: the writer thread needs the GIL between its episode writes;
    # an env thread that never lets go made it wait out the switch interval
    # each time, and episodes queued (20 -> 16 us/step, benchmarks/REPORT.md).
    # Image frames: the env thread would queue behind the encoders instead.
    # Ordinary chunks even if an earlier test left image processes running:
    # making a shared one lets the GIL go (system calls, a prefill thread),
    # which is not the copy this test is about.
    monkeypatch.setattr(chunk_columns.shared_frames, "wanted", lambda: False)
    env = RecordRLDS(_BigFrameEnv(), tmp_path / "ds", image_encoding=image_encoding)
    env.reset()
    (buffer,) = env._recording.recorder._buffers.values()
    column = buffer.columns["steps/observation"]
    frame = np.full(_BigFrameEnv.shape, 9, np.uint8)
    turns = _other_thread_turns(column, frame, 200)
    env.close()
    assert (turns > 0) is lets_go, turns


def test_raw_frames_reach_the_writer_as_one_stretch_of_the_record_per_chunk(tmp_path, monkeypatch):
    # Rows are kept behind their BytesList entry heads, so the frames of an
    # episode are handed to the shard (hashed, written) as one part per chunk,
    # not as two per row. Chunks come dirty here, as a buffer recycled from
    # another recording may: the heads are written whenever a chunk is taken.
    monkeypatch.setattr(chunk_columns, "_CHUNK_BYTES", 3 * (84 * 84 * 3 + 3))
    take = BufferPool.take

    def dirty_take(self, *args, **kwargs):
        buffer = take(self, *args, **kwargs)
        buffer[...] = 0xAB
        return buffer

    monkeypatch.setattr(BufferPool, "take", dirty_take)
    parts_per_record = []
    frame_parts_of = tfrecord.frame_parts_of

    def counting(parts, length):
        parts_per_record.append(len(parts))
        return frame_parts_of(parts, length)

    monkeypatch.setattr(tfrecord, "frame_parts_of", counting)
    # 21 frames (445 KB): a record large enough to be written as parts.
    env = RecordRLDS(_CameraEnv(20), tmp_path / "ds", image_encoding="bytes")
    for _ in range(2):
        _play(env)
    env.close()
    episodes = load_episodes(tmp_path / "ds")
    assert len(episodes) == 2
    for episode in episodes:
        frames = np.stack([step["observation"] for step in episode["steps"]])
        expected = np.arange(21, dtype=np.uint8)[:, None, None, None]
        np.testing.assert_array_equal(frames, np.broadcast_to(expected, (21, 84, 84, 3)))
    # 21 frames in 7 chunks of 3: two parts per frame would make 42 and more.
    assert len(parts_per_record) == 2
    assert max(parts_per_record) < 42, parts_per_record
