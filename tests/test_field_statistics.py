"""Per-dimension statistics: exact, final steps left out, a cache that follows the shards."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import rlds_writer
from rlds_writer.cli.main import main
from rlds_writer.maintain import field_statistics


def _record(path, episodes, mode="error", seed=0):
    env = rlds_writer.RecordRLDS(gym.make("CartPole-v1"), path, name="cartpole", mode=mode)
    rng = np.random.default_rng(seed)
    for i in range(episodes):
        env.reset(seed=seed + i)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            done = terminated or truncated
    env.close()


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "ds"
    _record(path, 6)
    return path


def _columns(path):
    episodes = list(rlds_writer.open_dataset(path).episodes())
    obs = np.concatenate([e["steps"]["observation"] for e in episodes]).astype(np.float64)
    # The final step's action and reward are RLDS's zeros, not data.
    act = np.concatenate([e["steps"]["action"][:-1] for e in episodes]).astype(np.float64)
    rew = np.concatenate([e["steps"]["reward"][:-1] for e in episodes]).astype(np.float64)
    return len(episodes), obs, act, rew


def test_statistics_equal_numpy_over_every_row_and_leave_out_final_steps(dataset):
    stats = rlds_writer.maintain.dataset_statistics(dataset)
    episodes, obs, act, rew = _columns(dataset)
    assert stats["num_trajectories"] == episodes
    assert stats["num_transitions"] == len(act)
    for name, values in (("observation", obs), ("action", act), ("reward", rew)):
        field = stats[name]
        assert field["count"] == len(values)
        np.testing.assert_allclose(field["mean"], values.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(field["std"], values.std(axis=0), rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(field["min"], values.min(axis=0))
        np.testing.assert_array_equal(field["max"], values.max(axis=0))
        np.testing.assert_allclose(field["q01"], np.quantile(values, 0.01, axis=0))
        np.testing.assert_allclose(field["q99"], np.quantile(values, 0.99, axis=0))
        assert field["exact_quantiles"]
    assert len(stats["observation"]["mean"]) == 4


def test_quantiles_of_large_fields_come_from_a_uniform_sample_and_moments_stay_exact(
    dataset, monkeypatch
):
    monkeypatch.setattr(field_statistics, "SAMPLE_ROWS", 50)
    stats = rlds_writer.maintain.dataset_statistics(dataset, cache=False)
    _, obs, _, _ = _columns(dataset)
    field = stats["observation"]
    assert not field["exact_quantiles"]
    np.testing.assert_allclose(field["mean"], obs.mean(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(field["max"], obs.max(axis=0))
    # A 50-row sample: the 1% and 99% quantiles fall inside the data's range.
    assert np.all(np.asarray(field["q01"]) >= obs.min(axis=0))
    assert np.all(np.asarray(field["q99"]) <= obs.max(axis=0))
    assert np.all(np.asarray(field["q01"]) <= np.asarray(field["q99"]))


def test_the_cache_is_reused_and_recomputed_when_shards_change(dataset):
    first = rlds_writer.maintain.dataset_statistics(dataset)
    cache = dataset / "dataset_statistics_train.json"
    assert json.loads(cache.read_text())["fingerprint"] == first["fingerprint"]
    cached = json.loads(cache.read_text())
    cached["reward"]["mean"] = 123.0  # had it been recomputed, this would be gone
    cache.write_text(json.dumps(cached))
    assert rlds_writer.maintain.dataset_statistics(dataset)["reward"]["mean"] == 123.0
    _record(dataset, 2, mode="append", seed=100)
    again = rlds_writer.maintain.dataset_statistics(dataset)
    assert again["num_trajectories"] == first["num_trajectories"] + 2
    assert again["reward"]["mean"] != 123.0


def test_the_cache_file_does_not_disturb_the_dataset(dataset):
    rlds_writer.maintain.dataset_statistics(dataset)
    assert rlds_writer.maintain.validate(dataset)["ok"]
    assert not rlds_writer.recover(dataset).changed


def test_cli_prints_a_row_per_dimension_and_json_training_code_loads(dataset, capsys):
    assert main(["stats", str(dataset), "--per-dimension"]) == 0
    table = capsys.readouterr().out
    assert "observation[3]" in table and "q99" in table
    assert main(["stats", str(dataset), "--per-dimension", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert np.ndim(stats["action"]["mean"]) == 0  # a scalar action: scalar statistics
    assert {"mean", "std", "min", "max", "q01", "q99"} <= set(stats["observation"])


def test_clock_fields_are_not_printed_as_statistics(tmp_path, capsys):
    assert main(["record", "--output", str(tmp_path / "c"), "--episodes", "2"]) == 0
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "c")]) == 0
    assert "timestamp_ns" not in capsys.readouterr().out
    stats = rlds_writer.maintain.compute_statistics(tmp_path / "c")
    assert "timestamp_ns" in stats["splits"]["train"]["step_metadata"]
