"""Camera frames in batches: each sub-env's episode is the record `RecordRLDS` writes alone.

PNG and JPEG frames are encoded by the writer's encoders (threads, or worker
processes once it falls behind); raw `bytes` frames are copied as they are.
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_envs import Camera, play_alone, records
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N = 3
SEED = 4


@pytest.mark.parametrize("image_encoding", ["png", "jpeg", "bytes"])
def test_batched_camera_frames_are_the_records_of_each_sub_env_alone(tmp_path, image_encoding):
    actions = np.random.default_rng(1).uniform(-1, 1, (40, N, 2)).astype(np.float32)
    venv = SyncVectorEnv([Camera] * N, autoreset_mode=AutoresetMode.SAME_STEP)
    env = RecordRLDSVector(venv, tmp_path / "batched", image_encoding=image_encoding)
    env.reset(seed=[SEED + i for i in range(N)])
    for step_actions in actions:
        env.step(step_actions)
    env.close()
    want = records(tmp_path / "batched").__class__()
    for i in range(N):
        path = tmp_path / f"alone{i}"
        play_alone(
            Camera,
            path,
            SEED + i,
            [a[i] for a in actions],
            "SameStep",
            image_encoding=image_encoding,
        )
        want.update(records(path))
    got = records(tmp_path / "batched")
    assert sum(want.values()) >= 10 and got == want
