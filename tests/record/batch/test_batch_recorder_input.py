"""The batch contract refuses a bad batch by field name, and the step is then recorded for none."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from batch_envs import records

from rlds_writer.errors import StepValueError
from rlds_writer.record import spaces
from rlds_writer.record.batch import BatchRecorder

N = 4


def _recorder(path) -> BatchRecorder:
    config = spaces.spaces_config(
        gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2), "input"
    )
    return BatchRecorder(path, config, N)


def _step(rec, obs=None, action=None):
    rec.add(
        np.zeros(N, np.int64) if action is None else action,
        np.ones(N),
        None,
        np.zeros((N, 3), np.float32) if obs is None else obs,
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"obs": np.zeros((N, 4), np.float32)}, "steps/observation: expected a batch float32"),
        ({"obs": np.zeros((N - 1, 3), np.float32)}, "steps/observation: expected a batch"),
        ({"obs": np.empty((N, 3), object)}, "steps/observation: expected numbers"),
        ({"obs": [[0.0, 0.0, 0.0]] * (N - 1) + [[0.0]]}, "steps/observation: .*ragged"),
        ({"action": np.zeros(N, np.float32)}, "steps/action: .*does not cast to int64"),
    ],
    ids=["shape", "batch-size", "object", "ragged", "kind"],
)
def test_a_bad_batch_is_refused_by_field_and_recorded_for_no_sub_env(tmp_path, bad, message):
    good, refused = _recorder(tmp_path / "good"), _recorder(tmp_path / "refused")
    for rec in (good, refused):
        rec.begin(np.zeros((N, 3), np.float32))
        _step(rec)
    with pytest.raises(StepValueError, match=message):
        _step(refused, **bad)
    for rec in (good, refused):
        _step(rec)
        rec.end(np.ones(N, bool), True)
        rec.close()
    # The refused step left no row behind: the same records as a run without it.
    assert records(tmp_path / "refused") == records(tmp_path / "good")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["a", "b"], "steps/observation: expected a batch of 4 values .* got 2"),
        ([b"a", b"b", 3, b"d"], "steps/observation: expected text"),
        ("abcd", "steps/observation: expected a batch of 4 values"),
    ],
    ids=["batch-size", "not-text", "one-string"],
)
def test_a_bad_text_batch_is_refused_by_field_and_recorded_for_no_sub_env(tmp_path, bad, message):
    config = spaces.spaces_config(gym.spaces.Text(5), gym.spaces.Discrete(2), "text")
    runs = {}
    for name in ("good", "refused"):
        rec = runs[name] = BatchRecorder(tmp_path / name, config, N)
        rec.begin(["w"] * N)
        rec.add(np.zeros(N, np.int64), np.ones(N), None, ("x", "y", "z", "é"))
    with pytest.raises(StepValueError, match=message):
        runs["refused"].add(np.zeros(N, np.int64), np.ones(N), None, bad)
    for rec in runs.values():
        rec.end(np.ones(N, bool), True)
        rec.close()
    assert records(tmp_path / "refused") == records(tmp_path / "good")
