"""`TFDSBackendWriter.write_episode`: your own data in, exactly as if it had been recorded."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import assert_same, load_episodes

import rlds_writer
from rlds_writer.errors import StepValueError


def _config():
    return rlds_writer.DatasetConfig(
        name="own",
        observation_info={
            "pos": tfds.features.Tensor(shape=(2,), dtype=np.float32),
            "label": tfds.features.Text(),
        },
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"t": np.int32},
        episode_metadata_info={"source": tfds.features.Text()},
    )


N = 5
OBS = {
    "pos": np.arange(2 * N, dtype=np.float32).reshape(N, 2),
    "label": [f"o{i}" for i in range(N)],
}
ACTIONS = np.arange(N - 1)
REWARDS = np.linspace(0, 1, N - 1, dtype=np.float32)
DISCOUNTS = np.array([1, 1, 1, 0], np.float32)


def _recorded(path):
    with rlds_writer.TFDSBackendWriter(path, _config()) as backend:
        backend.begin_episode({"pos": OBS["pos"][0], "label": "o0"}, {"t": 0})
        for t in range(N - 1):
            obs = {"pos": OBS["pos"][t + 1], "label": f"o{t + 1}"}
            backend.add_step(ACTIONS[t], REWARDS[t], DISCOUNTS[t], obs, {"t": t + 1})
        backend.set_episode_metadata({"source": "log.csv"})
        backend.end_episode(terminated=True)
    return load_episodes(path)


def test_columns_write_the_same_episode_as_recording_it(tmp_path):
    with rlds_writer.TFDSBackendWriter(tmp_path / "own", _config()) as backend:
        backend.write_episode(
            {
                "observation": OBS,
                "action": ACTIONS,
                "reward": REWARDS,
                "discount": DISCOUNTS,
                "t": np.arange(N, dtype=np.int32),
            },
            episode_metadata={"source": "log.csv"},
            terminated=True,
        )
    assert_same(load_episodes(tmp_path / "own"), _recorded(tmp_path / "rec"))


def test_step_dicts_and_rlds_layout_columns_write_the_same_episode(tmp_path):
    steps = [
        {
            "observation": {"pos": OBS["pos"][t], "label": OBS["label"][t]},
            "action": ACTIONS[t] if t < N - 1 else None,
            "reward": REWARDS[t] if t < N - 1 else None,
            "discount": DISCOUNTS[t] if t < N - 1 else None,
            "t": t,
        }
        for t in range(N)
    ]
    rlds_layout = {
        "observation": OBS,
        "action": np.append(ACTIONS, 0),  # RLDS's zeros on the final step
        "reward": np.append(REWARDS, 0),
        "discount": np.append(DISCOUNTS, 0),
        "t": np.arange(N, dtype=np.int32),
    }
    for name, form in (("dicts", steps), ("rlds", rlds_layout)):
        with rlds_writer.TFDSBackendWriter(tmp_path / name, _config()) as backend:
            backend.write_episode(form, episode_metadata={"source": "log.csv"}, terminated=True)
        assert_same(load_episodes(tmp_path / name), _recorded(tmp_path / f"rec_{name}"))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"action": np.arange(N - 2)},
            r"steps/action: expected 4 rows \(one per transition\), got 3",
        ),
        ({"action": np.arange(N)}, "steps/action: has 5 rows and its last is not zeros"),
        ({"t": np.arange(2, dtype=np.int32)}, r"steps/t: expected 5 rows \(one per step\), got 2"),
        ({"reward": np.array([0, 1, 2, "x"])}, "steps/reward"),
    ],
)
def test_a_bad_episode_writes_nothing_and_keeps_earlier_episodes(tmp_path, change, match):
    good = {"observation": OBS, "action": ACTIONS, "reward": REWARDS, "discount": DISCOUNTS}
    good["t"] = np.arange(N, dtype=np.int32)
    with rlds_writer.TFDSBackendWriter(tmp_path / "ds", _config()) as backend:
        backend.write_episode(good, episode_metadata={"source": "a"})
        with pytest.raises(StepValueError, match=match):
            backend.write_episode({**good, **change}, episode_metadata={"source": "b"})
        backend.write_episode(good, episode_metadata={"source": "c"})
    assert [e["source"] for e in load_episodes(tmp_path / "ds")] == [b"a", b"c"]
