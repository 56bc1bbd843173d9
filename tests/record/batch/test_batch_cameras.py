"""Camera frames in batches: each sub-env's episode is the record `RecordRLDS` writes alone.

PNG and JPEG frames are encoded as they come, N per step, on the encoding
threads (`record/batch/frames.py`): the ring keeps no raw frame, and episodes
longer than the ring (spilled) keep their frames' handles. Raw `bytes` frames
are copied as they are.
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_envs import Camera, play_alone, records
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N = 3
SEED = 4


@pytest.mark.parametrize(
    "image_encoding, mode, ring_bytes",
    [
        ("png", AutoresetMode.SAME_STEP, None),
        ("jpeg", AutoresetMode.NEXT_STEP, 1),  # a 32-row ring: 80-step episodes spill
        ("bytes", AutoresetMode.SAME_STEP, 1),  # spilled raw frames: in parts
    ],
)
def test_batched_camera_frames_are_the_records_of_each_sub_env_alone(
    tmp_path, image_encoding, mode, ring_bytes
):
    actions = np.random.default_rng(1).uniform(-1, 1, (90, N, 2)).astype(np.float32)
    venv = SyncVectorEnv([Camera] * N, autoreset_mode=mode)
    env = RecordRLDSVector(
        venv, tmp_path / "batched", image_encoding=image_encoding, ring_bytes=ring_bytes
    )
    env.reset(seed=[SEED + i for i in range(N)])
    ring = env.recorder._ring
    # PNG/JPEG frames are encoded at the step: the ring holds where their bytes are.
    streamed = ring.ring["steps/observation"].dtype == object
    assert streamed == (image_encoding != "bytes")
    for step_actions in actions:
        env.step(step_actions)
    spilled = bool(ring.spilled)
    env.close()
    assert spilled or ring_bytes is None
    want = records(tmp_path / "batched").__class__()
    for i in range(N):
        path = tmp_path / f"alone{i}"
        play_alone(
            Camera,
            path,
            SEED + i,
            [a[i] for a in actions],
            mode.value,
            image_encoding=image_encoding,
        )
        want.update(records(path))
    got = records(tmp_path / "batched")
    assert sum(want.values()) >= 10 and got == want
