"""A vector env recorded a batch at a time: each sub-env's records are those of `RecordRLDS`.

Each sub-env is replayed alone with `RecordRLDS` (same seed, the actions it
received, its resets where the vector env made them); the batched dataset
must hold exactly the union of those records, byte for byte, in every
autoreset mode, with episodes of one step, long ones spilled out of a small
ring, and episodes still open at close (cut short).
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_envs import Hops, Words, play_alone, records, waiting_batches
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N = 5
SEED = 11
STEPS = 150


def _actions(steps: int = STEPS) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (steps, N, 2)).astype(np.float32)


def _record_batched(
    path, mode: AutoresetMode, actions, make_env=Hops, hold_writer: bool = False, **options
) -> list[list[bool]]:
    """Records the vector env; returns, per step, which sub-envs were reset after it (disabled).

    `hold_writer`: the writer thread is kept from writing until the last step,
    so the env thread itself cuts the ended episodes out of the ring before
    it overwrites their rows.
    """
    venv = SyncVectorEnv([make_env] * N, autoreset_mode=mode)
    if hold_writer:
        options = {**options, "queue_size": 10_000, "max_queue_bytes": 1 << 30}
    env = RecordRLDSVector(venv, path, **options)
    assert env._batch is not None  # the batch recording, not a sub-env at a time
    env.reset(seed=[SEED + i for i in range(N)])
    writer = env._batch.core.writer
    if hold_writer:
        writer._io_lock.acquire()
    resets = []
    try:
        for step_actions in actions:
            _, _, te, tr, _ = env.step(step_actions)
            done = np.logical_or(te, tr)
            resets.append(done.tolist())
            if mode == AutoresetMode.DISABLED and done.any():
                env.reset(options={"reset_mask": done})
        if hold_writer:
            made = [not p.pending for p in waiting_batches(writer)]
            # The oldest were cut here (their rows were to be overwritten), the newest not.
            assert any(made) and not all(made)
    finally:
        if hold_writer:
            writer._io_lock.release()
    env.close()
    return resets


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
@pytest.mark.parametrize(
    "options",
    [{}, {"info_keys": ["t", "x"], "discount": True}, {"hold_writer": True}],
    ids=["plain", "info-keys-discount", "writer-behind"],
)
def test_batched_episodes_are_byte_identical_to_each_sub_env_recorded_alone(
    tmp_path, mode, options
):
    actions = _actions()
    # A small ring: the 80-step episodes are spilled out of it while they run.
    resets = _record_batched(tmp_path / "batched", mode, actions, ring_bytes=4096, **options)
    want = records(tmp_path / "batched").__class__()
    for i in range(N):
        play_alone(
            Hops,
            tmp_path / f"alone{i}",
            SEED + i,
            [a[i] for a in actions],
            mode.value,
            [r[i] for r in resets],
            **{k: v for k, v in options.items() if k != "hold_writer"},
        )
        want.update(records(tmp_path / f"alone{i}"))
    got = records(tmp_path / "batched")
    assert sum(want.values()) >= 30
    assert got == want


def test_text_observations_are_kept_per_sub_env_and_byte_identical(tmp_path):
    # A dict observation of a Box and a Text, and a str info key (its Text
    # feature inferred from the first reset's batch): the texts are a Python
    # value per sub-env (same_step: the final observation and info replace the
    # row; a small ring spills the long episodes), the Box a numeric column.
    actions = _actions(100)
    mode = AutoresetMode.SAME_STEP
    _record_batched(tmp_path / "batched", mode, actions, Words, ring_bytes=2048, info_keys=["said"])
    want = records(tmp_path / "batched").__class__()
    for i in range(N):
        path = tmp_path / f"alone{i}"
        play_alone(Words, path, SEED + i, [a[i] for a in actions], mode.value, info_keys=["said"])
        want.update(records(path))
    assert sum(want.values()) >= 20
    assert records(tmp_path / "batched") == want


def test_episodes_of_one_step_long_ones_and_cut_short_ones_are_all_there(tmp_path):
    import tensorflow_datasets as tfds

    _record_batched(tmp_path / "ds", AutoresetMode.SAME_STEP, _actions(), ring_bytes=4096)
    builder = tfds.builder_from_directory(str(tmp_path / "ds"))
    episodes = list(tfds.as_numpy(builder.as_dataset(split="train")))
    lengths = [len(list(e["steps"])) for e in episodes]
    reasons = {e["end_reason"] for e in episodes}
    assert 2 in lengths  # a one-step episode: reset, one step
    assert max(lengths) == 81  # spilled out of the 32-row ring while it ran
    assert reasons == {b"terminated", b"truncated", b"cut_short"}
