"""Camera frames in batches: each sub-env's episode is the record `RecordRLDS` writes alone.

PNG and JPEG frames are encoded as they come, N per step, on the encoding
threads (`record/batch/frames.py`): the ring keeps no raw frame, and episodes
longer than the ring (spilled) keep their frames' handles. Raw `bytes` frames
of at least `ring.LARGE_ROWS` bytes are copied at the step into their sub-env's
framed chunk (`record/batch/frame_chunks.py`), whose reference and place the
ring keeps; smaller ones stay raw in the ring.
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_envs import Camera, WideCamera, play_alone, records
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N = 3
SEED = 4


@pytest.mark.parametrize(
    "image_encoding, mode, ring_bytes, camera",
    [
        ("png", AutoresetMode.SAME_STEP, None, Camera),
        ("jpeg", AutoresetMode.NEXT_STEP, 1, Camera),  # a 32-row ring: 80-step episodes spill
        ("bytes", AutoresetMode.SAME_STEP, 1, Camera),  # spilled raw frames: in parts
        ("bytes", AutoresetMode.SAME_STEP, 1, WideCamera),  # a bytes per frame, spilled
        ("bytes", AutoresetMode.NEXT_STEP, None, WideCamera),
    ],
)
def test_batched_camera_frames_are_the_records_of_each_sub_env_alone(
    tmp_path, image_encoding, mode, ring_bytes, camera
):
    actions = np.random.default_rng(1).uniform(-1, 1, (90, N, 2)).astype(np.float32)
    venv = SyncVectorEnv([camera] * N, autoreset_mode=mode)
    env = RecordRLDSVector(
        venv, tmp_path / "batched", image_encoding=image_encoding, ring_bytes=ring_bytes
    )
    env.reset(seed=[SEED + i for i in range(N)])
    ring = env.recorder._ring
    # PNG/JPEG frames are encoded at the step: the ring holds where their bytes
    # are; large raw frames are copied into their sub-env's chunk, which it holds.
    streamed = ring.ring["steps/observation"].dtype == object
    assert streamed == (image_encoding != "bytes" or camera is WideCamera)
    steps = 0
    for step_actions in actions:
        obs, _, terminated, truncated, _ = env.step(step_actions)
        if camera is WideCamera and steps < 3:  # the handles: each sub-env's framed chunk
            row = (ring.t - 1) % ring.size
            chunks = ring.ring["steps/observation"][row]
            places = ring.ring["steps/observation\x00position"][row] & 0xFFFFF
            assert len({id(c) for c in chunks}) == N
            for chunk, place, frame, done in zip(chunks, places, obs, terminated | truncated):
                if not done:  # else the frame is the next episode's first
                    assert chunk[place].tobytes() == b"\x0a\x80\x48" + frame.tobytes()
            steps += 1
    spilled = bool(ring.spilled)
    env.close()
    assert spilled or ring_bytes is None
    want = records(tmp_path / "batched").__class__()
    for i in range(N):
        path = tmp_path / f"alone{i}"
        play_alone(
            camera,
            path,
            SEED + i,
            [a[i] for a in actions],
            mode.value,
            image_encoding=image_encoding,
        )
        want.update(records(path))
    got = records(tmp_path / "batched")
    assert sum(want.values()) >= 10 and got == want


@pytest.mark.parametrize("image_encoding, camera", [("png", Camera), ("bytes", WideCamera)])
def test_frames_of_sub_envs_stepped_apart_are_the_records_of_each_alone(
    tmp_path, image_encoding, camera
):
    # EnvPool's async shape: each call steps or resets some sub-envs
    # (`per_env`, `env_ids`); a sub-env that ended is reset by its next turn.
    from rlds_writer.record import spaces
    from rlds_writer.record.batch import BatchRecorder

    n, rng = 4, np.random.default_rng(2)
    config = spaces.spaces_config(
        camera.observation_space, camera.action_space, "apart", image_encoding=image_encoding
    )
    rec = BatchRecorder(tmp_path / "batched", config, n, per_env=True, ring_bytes=1)
    assert rec._ring.ring["steps/observation"].dtype == object  # encoded or copied at the step
    envs = [camera() for _ in range(n)]
    given: list[list[np.ndarray]] = [[] for _ in range(n)]
    pending = np.zeros(n, bool)
    obs = np.stack([env.reset(seed=SEED + i)[0] for i, env in enumerate(envs)])
    rec.begin(obs, env_ids=np.arange(n))
    for _ in range(120):
        ids = np.flatnonzero(rng.random(n) < 0.6)
        actions = rng.uniform(-1, 1, (len(ids), 2)).astype(np.float32)
        for i, action in zip(ids.tolist(), actions):
            given[i].append(action)
        stepping = ~pending[ids]
        resets, steps = ids[~stepping], ids[stepping]
        if len(resets):
            rec.begin(np.stack([envs[i].reset()[0] for i in resets]), env_ids=resets)
            pending[resets] = False
        if len(steps):
            results = [envs[i].step(a) for i, a in zip(steps, actions[stepping])]
            rec.add(
                actions[stepping],
                np.array([r[1] for r in results], np.float32),
                None,
                np.stack([r[0] for r in results]),
                env_ids=steps,
            )
            done = np.array([r[2] or r[3] for r in results])
            rec.end(done, np.array([r[2] for r in results]), env_ids=steps)
            pending[steps[done]] = True
    rec.close()
    want = records(tmp_path / "batched").__class__()
    for i in range(n):
        play_alone(
            camera,
            tmp_path / f"alone{i}",
            SEED + i,
            given[i],
            "NextStep",
            image_encoding=image_encoding,
        )
        want.update(records(tmp_path / f"alone{i}"))
    assert sum(want.values()) >= 8 and records(tmp_path / "batched") == want
