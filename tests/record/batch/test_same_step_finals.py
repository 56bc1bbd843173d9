"""Same-step autoreset's final observations and infos replace their rows in one write per field.

Gymnasium gives the observations as an object array of per-sub-env arrays (stacked) and a
vector env may give one numeric `[N, ...]` batch; either way the records are
those of the per-sub-env `replace` (tests/record/batch/test_batch_vector_identity.py
compares that path with `RecordRLDS` sub-env by sub-env).
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_envs import Hops, records
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorWrapper

from rlds_writer.record.batch import core
from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector

N, STEPS = 6, 60


class _NumericFinals(VectorWrapper):
    """`infos["final_obs"]` as one float64 `[N, 3]` batch (cast into the float32 column)."""

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        if "final_obs" in infos:
            finals = np.full((len(obs), 3), np.nan)
            ended = infos["_final_obs"]
            finals[ended] = np.stack(infos["final_obs"][ended].tolist())
            infos = {**infos, "final_obs": finals}
        return obs, rewards, terminations, truncations, infos


def _record(path, numeric: bool, **options) -> None:
    venv = SyncVectorEnv([Hops] * N, autoreset_mode=AutoresetMode.SAME_STEP)
    env = RecordRLDSVector(_NumericFinals(venv) if numeric else venv, path, **options)
    env.reset(seed=5)
    for step_actions in np.random.default_rng(2).uniform(-1, 1, (STEPS, N, 2)):
        env.step(step_actions.astype(np.float32))
    env.close()


@pytest.mark.parametrize("options", [{}, {"info_keys": ["t", "x"]}], ids=["obs", "info-keys"])
def test_final_observations_are_written_batch_wide_with_the_bytes_of_one_at_a_time(
    tmp_path, monkeypatch, options
):
    replaced = []
    replace = core.BatchRecorder.replace
    monkeypatch.setattr(
        core.BatchRecorder, "replace", lambda s, i, o, m: replaced.append(o) or replace(s, i, o, m)
    )
    for numeric in (True, False):
        _record(tmp_path / f"batch-{numeric}", numeric, **options)
    # Neither final observations nor final infos one sub-env at a time.
    assert not replaced
    monkeypatch.setattr(core.BatchRecorder, "replace_rows", lambda *a: False)
    _record(tmp_path / "one-at-a-time", True, **options)
    assert len(replaced) >= 10 and all(o is not None for o in replaced)
    want = records(tmp_path / "one-at-a-time")
    assert sum(want.values()) >= 20
    assert records(tmp_path / "batch-True") == want
    assert records(tmp_path / "batch-False") == want
