"""Tests of `rlds_writer.maintain.statistics` and `rlds-writer stats`."""

from __future__ import annotations

import json

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from helpers_core import new_buffer  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402
from rlds_writer.maintain import statistics  # noqa: E402

# (split, per-step rewards, terminated) of each episode; every episode also has
# one final step with zero reward.
_EPISODES = [
    ("train", [1.0, 2.0, 3.0], True),
    ("train", [0.5], False),
    ("train", [-1.0, -1.0, 4.0, 0.25, 1.0], True),
    ("train", [], False),  # a one-step episode: reset then cut short
    ("test", [10.0, 10.0], False),
]


def _metadata(split_index: int, t: int) -> dict:
    return {
        "load": np.float32(split_index + 0.5 * t),
        "counts": np.array([t, 2 * t], dtype=np.int32),
        "flag": t % 2 == 1,
        "note": f"step {t}",
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "ds"
    cfg = rlds_writer.DatasetConfig(
        name="stats_ds",
        observation_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={
            "load": np.float32,
            "counts": tfds.features.Tensor(shape=(2,), dtype=np.int32),
            "flag": np.bool_,
            "note": tfds.features.Text(),
        },
    )
    writer = rlds_writer.store.DatasetWriter(path, cfg, max_episodes_per_file=2)
    for i, (split, rewards, terminated) in enumerate(_EPISODES):
        buffer = new_buffer(writer)
        buffer.start(np.zeros(2, np.float32), _metadata(i, 0))
        for t, reward in enumerate(rewards, start=1):
            buffer.add(1, reward, 1.0, np.full(2, t, np.float32), _metadata(i, t))
        writer.write(buffer.finish(terminated), split)
    writer.close()
    return path


def _expected(split: str) -> dict:
    returns, lengths, load_means, count_means, flag_means = [], [], [], [], []
    for i, (s, rewards, _) in enumerate(_EPISODES):
        if s != split:
            continue
        returns.append(sum(rewards))
        lengths.append(len(rewards) + 1)
        meta = [_metadata(i, t) for t in range(len(rewards) + 1)]
        load_means.append(np.mean([m["load"] for m in meta]))
        count_means.append(np.mean([m["counts"] for m in meta]))
        flag_means.append(np.mean([m["flag"] for m in meta]))
    return {
        "returns": np.array(returns),
        "lengths": np.array(lengths),
        "load": np.array(load_means),
        "counts": np.array(count_means),
        "flag": np.array(flag_means),
    }


def _check_summary(summary: dict, values: np.ndarray, median: bool = True) -> None:
    assert summary["mean"] == pytest.approx(np.mean(values))
    assert summary["std"] == pytest.approx(np.std(values))
    assert summary["min"] == pytest.approx(np.min(values))
    assert summary["max"] == pytest.approx(np.max(values))
    if median:
        assert summary["median"] == pytest.approx(np.median(values))


def test_statistics_match_numpy_on_every_split(dataset):
    stats = statistics.compute_statistics(dataset)
    assert stats["name"] == "stats_ds"
    assert set(stats["splits"]) == {"train", "test"}
    for split in ("train", "test"):
        s = stats["splits"][split]
        exp = _expected(split)
        assert s["episodes"] == len(exp["returns"])
        assert s["steps"] == int(exp["lengths"].sum())
        _check_summary(s["episode_return"], exp["returns"])
        _check_summary(s["episode_length"], exp["lengths"])
        # Text metadata is not numeric and is left out.
        assert set(s["step_metadata"]) == {"load", "counts", "flag"}
        for field in ("load", "counts", "flag"):
            _check_summary(s["step_metadata"][field], exp[field], median=False)
    train = stats["splits"]["train"]
    assert (train["terminated"], train["truncated"]) == (2, 2)
    assert (stats["splits"]["test"]["terminated"], stats["splits"]["test"]["truncated"]) == (0, 1)
    json.dumps(stats)  # a plain dict


def test_even_episode_count_median_is_the_mean_of_the_middle_pair(dataset):
    s = statistics.compute_statistics(dataset, split="train")["splits"]["train"]
    # returns: 6.0, 0.5, 3.25, 0.0 -> sorted 0.0, 0.5, 3.25, 6.0
    assert s["episode_return"]["median"] == pytest.approx((0.5 + 3.25) / 2)


def test_split_selection_and_unknown_split(dataset):
    stats = statistics.compute_statistics(dataset, split="test", per_episode=True)
    assert list(stats["splits"]) == ["test"]
    assert stats["splits"]["test"]["per_episode"] == {"return": [20.0], "length": [3]}
    with pytest.raises(ValueError, match="no split.*'valid'"):
        statistics.compute_statistics(dataset, split="valid")


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an RLDS dataset directory.*empty"):
        statistics.compute_statistics(tmp_path)


def test_running_stats_match_numpy_on_many_values():
    rng = np.random.default_rng(0)
    values = rng.normal(1e6, 3.0, size=5000)
    running = statistics.RunningStats()
    for v in values:
        running.add(v)
    out = running.to_dict()
    assert out["mean"] == pytest.approx(values.mean(), rel=1e-12)
    assert out["std"] == pytest.approx(values.std(), rel=1e-6)
    assert statistics.RunningStats().to_dict()["mean"] is None


def test_cli_stats_json_and_plot(dataset, tmp_path, capsys):
    png = tmp_path / "stats.png"
    code = cli.main(["stats", str(dataset), "--json", "--plot", str(png), "--split", "train"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["splits"]["train"]["episodes"] == 4
    assert "per_episode" not in out["splits"]["train"]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_cli_stats_table(dataset, capsys):
    assert cli.main(["stats", str(dataset), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "split train: 4 episodes, 13 steps, 2 terminated, 2 truncated" in text
    assert "load (episode mean)" in text


def test_array_record_dataset_gives_the_same_statistics_as_tfrecord(tmp_path, capsys):
    # TFDS has no as_dataset() for ArrayRecord; stats reads it through as_data_source().
    results = {}
    for fmt in ("tfrecord", "array_record"):
        out = tmp_path / fmt
        argv = ["record", "--output", str(out), "--episodes", "6", "--format", fmt]
        assert cli.main([*argv, "--seed", "3", "--no-load-back"]) == 0
        s = statistics.compute_statistics(out)["splits"]["train"]
        s.pop("step_metadata")  # timestamps differ
        results[fmt] = s
    capsys.readouterr()
    assert results["tfrecord"] == results["array_record"]
    assert results["tfrecord"]["episodes"] == 6


def test_encoded_fields_are_decoded_float64_reward_and_zlib_metadata(tmp_path):
    cfg = rlds_writer.DatasetConfig(
        name="encoded",
        observation_info=np.float32,
        action_info=np.int64,
        reward_info=tfds.features.Tensor(shape=(), dtype=np.float64, encoding="bytes"),
        discount_info=np.float32,
        step_metadata_info={
            "z": tfds.features.Tensor(shape=(2,), dtype=np.float32, encoding="zlib"),
        },
    )
    rewards = [[0.1, 1e-9, 1 / 3], [2.5]]
    with rlds_writer.store.DatasetWriter(tmp_path / "ds", cfg) as writer:
        for ep, rs in enumerate(rewards):
            buffer = new_buffer(writer)
            buffer.start(np.float32(0), {"z": np.array([ep, 1], np.float32)})
            for r in rs:
                buffer.add(
                    0, np.float64(r), 1.0, np.float32(0), {"z": np.array([ep, 3], np.float32)}
                )
            writer.write(buffer.finish(terminated=True))
    s = statistics.compute_statistics(tmp_path / "ds", per_episode=True)["splits"]["train"]
    # float64 kept exactly (bytes encoding), not rounded to float32.
    want = [float(np.sum(np.array(rs + [0.0], np.float64))) for rs in rewards]
    assert s["per_episode"]["return"] == want
    assert float(np.float32(want[0])) != want[0]  # the check above would fail at float32
    z_means = [np.mean([[0, 1]] + [[0, 3]] * 3), np.mean([[1, 1], [1, 3]])]
    _check_summary(s["step_metadata"]["z"], np.array(z_means), median=False)


def test_plots_date_episodes_by_their_clock_field_and_draw_a_rolling_mean(tmp_path):
    assert cli.main(["record", "--output", str(tmp_path / "c"), "--episodes", "30"]) == 0
    stats = rlds_writer.maintain.compute_statistics(tmp_path / "c", per_episode=True)
    per_episode = stats["splits"]["train"]["per_episode"]
    assert per_episode["time_field"] == "timestamp_ns"
    times = np.asarray(per_episode["time"])
    ns = [
        int(e["steps"]["timestamp_ns"][0])
        for e in rlds_writer.open_dataset(tmp_path / "c").episodes()
    ]
    np.testing.assert_allclose(times, (np.asarray(ns) - ns[0]) * 1e-9, atol=1e-6)
    assert statistics.rolling_window(30) == 2 and statistics.rolling_window(400) == 20
    out = tmp_path / "plot.png"
    rlds_writer.maintain.plot_statistics(stats, out)
    assert out.stat().st_size > 10_000


def test_json_output_is_json_when_returns_are_not_finite(tmp_path, capsys):
    """A NaN return is skipped by every statistic (the median too, which gave NaN), and
    `--json` prints standard JSON (null, never NaN/Infinity, which jq and JSON.parse refuse),
    also with --per-dimension over non-finite values."""
    config = rlds_writer.DatasetConfig(
        name="nan", observation_info=np.float64, action_info=np.float32, reward_info=np.float64
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "nan", config) as writer:
        for rewards in ([np.nan, 1.0], [2.0, 2.0], [np.inf, 0.0], [3.0, 4.0]):
            writer.write_episode(
                {
                    "observation": [np.nan, np.inf, 0.0],
                    "action": np.zeros(2, np.float32),
                    "reward": np.array(rewards),
                }
            )

    def strict(text):
        def refuse(constant):
            raise AssertionError(f"not JSON: {constant}")

        return json.loads(text, parse_constant=refuse)

    assert cli.main(["stats", str(tmp_path / "nan"), "--json"]) == 0
    returns = strict(capsys.readouterr().out)["splits"]["train"]["episode_return"]
    assert returns["median"] == 7.0  # of 4, inf, 7: the NaN return skipped
    assert returns["min"] == 4.0 and returns["max"] is None and returns["mean"] is None
    assert cli.main(["stats", str(tmp_path / "nan"), "--json", "--per-dimension"]) == 0
    strict(capsys.readouterr().out)
