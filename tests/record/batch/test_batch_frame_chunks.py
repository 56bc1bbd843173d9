"""Raw-bytes frames of a batch go into each sub-env's framed chunk, with no Python per frame.

`record/batch/frame_chunks.py`: a step's large raw-bytes frames are copied
into their sub-envs' chunks in one C call per field (numpy, a row at a time,
where it is not built); an episode's frames reach the writer as the chunks'
framed runs. Its records are still those `RecordRLDS` writes for each sub-env
alone, whatever the dtype, the shape or the row's size, across chunks that
fill mid-episode, chunks reused once nothing refers to them, spilled episodes
and same-step final observations.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
from batch_envs import Hops, play_alone, records
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.record import spaces
from rlds_writer.record.batch import BatchRecorder, frame_chunks
from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N = 3
SEED = 11


def _frames_env(shape, dtype):
    class Frames(Hops):
        observation_space = gym.spaces.Box(0, 255, shape, dtype)

        def _obs(self):
            frame = self.np_random.integers(0, 256, shape).astype(dtype)
            frame.reshape(-1)[-3:] = 0  # trailing zero bytes are kept whole
            return frame

    return Frames


@pytest.mark.parametrize(
    "shape, dtype, native",
    [
        ((97, 89), np.uint8, True),  # 8,633 bytes: a bytes-encoded Tensor, odd size
        ((31, 95, 3), np.uint8, True),  # 8,835 bytes: an image stored as bytes
        ((33, 35), np.float64, True),  # 9,240 bytes: float64 boxes are bytes-encoded
        ((97, 89), np.uint8, False),  # the numpy copy where the C one is not built
    ],
)
def test_raw_frames_of_any_dtype_and_size_are_the_records_of_each_sub_env_alone(
    tmp_path, monkeypatch, shape, dtype, native
):
    # Chunks of 3 frames: episodes span several, and chunks are reused.
    row_nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    monkeypatch.setattr(frame_chunks, "CHUNK_BYTES", 3 * (row_nbytes + 3))
    if not native:
        monkeypatch.setattr(frame_chunks, "_native_rows", None)
    elif frame_chunks._native_rows is None:
        pytest.skip("the _frame_rows extension is not built")
    camera = _frames_env(shape, dtype)
    actions = np.random.default_rng(3).uniform(-1, 1, (120, N, 2)).astype(np.float32)
    mode = AutoresetMode.SAME_STEP  # final observations `replace`d: runs break
    venv = SyncVectorEnv([camera] * N, autoreset_mode=mode)
    env = RecordRLDSVector(venv, tmp_path / "batched", image_encoding="bytes", ring_bytes=1)
    env.reset(seed=[SEED + i for i in range(N)])
    spilled = False
    for step_actions in actions:
        env.step(step_actions)
        spilled |= bool(env.recorder._ring.spilled)
    chunks = env.recorder._frames.copied["steps/observation"]
    env.close()
    assert spilled and chunks.capacity == 3
    assert chunks.chunks_made < chunks._serial  # some chunks were filled again
    want = records(tmp_path / "batched").__class__()
    for i in range(N):
        path = tmp_path / f"alone{i}"
        play_alone(
            camera, path, SEED + i, [a[i] for a in actions], mode.value, image_encoding="bytes"
        )
        want.update(records(path))
    assert sum(want.values()) >= 10 and records(tmp_path / "batched") == want


def _calls_per_add(num_envs: int, tmp_path) -> list[int]:
    """Python and C function calls seen by the profiler in each `add` of 6 steps."""
    shape = (64, 128)  # 8,192 bytes: the smallest rows kept in chunks
    config = spaces.spaces_config(
        gym.spaces.Box(0, 255, shape, np.uint8),
        gym.spaces.Box(-1, 1, (2,), np.float32),
        "calls",
        image_encoding="bytes",
    )
    rec = BatchRecorder(tmp_path / f"n{num_envs}", config, num_envs)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (num_envs, *shape), dtype=np.uint8)
    actions = np.zeros((num_envs, 2), np.float32)
    rewards = np.ones(num_envs, np.float32)
    rec.begin(frames)
    counts = []
    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    for _ in range(6):
        calls[0] = 0
        sys.setprofile(count)
        try:
            rec.add(actions, rewards, None, frames)
        finally:
            sys.setprofile(None)
        counts.append(calls[0])
    rec.close()
    assert rec.episodes_written == num_envs
    return counts


def test_raw_frames_are_copied_with_no_python_call_per_frame(tmp_path):
    # The same calls per step for 4 sub-envs as for 64 (chunks of 40 frames: the
    # first step takes them, no other step fills one). Before framed chunks,
    # each frame was a `tobytes` call (60 more calls per step at 64 sub-envs).
    few, many = _calls_per_add(4, tmp_path), _calls_per_add(64, tmp_path)
    assert few[1:] == many[1:], (few, many)
