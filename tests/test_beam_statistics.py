"""Per-dimension field statistics as a Beam pipeline (issue 25 item 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("apache_beam")

from helpers_core import new_buffer  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer.maintain import beam_statistics, field_statistics  # noqa: E402


def _record(path, episodes=11, seed=0):
    cfg = rlds_writer.DatasetConfig(
        name="arm",
        observation_info={
            "joints": tfds.features.Tensor(shape=(2, 3), dtype=np.float32),
            "gripper": np.float64,
        },
        action_info=tfds.features.Tensor(shape=(4,), dtype=np.float32),
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"load": np.int32},
    )
    rng = np.random.default_rng(seed)

    def obs():
        return {
            "joints": rng.normal(size=(2, 3)).astype(np.float32),
            "gripper": float(rng.uniform()),
        }

    with rlds_writer.store.DatasetWriter(path, cfg, max_episodes_per_file=3) as w:
        for i in range(episodes):
            buffer = new_buffer(w)
            buffer.start(obs(), {"load": np.int32(i)})
            for t in range(int(rng.integers(1, 7))):
                action = rng.normal(size=4).astype(np.float32) * (i + 1)
                buffer.add(action, float(rng.normal()), 1.0, obs(), {"load": np.int32(t)})
            w.write(buffer.finish(terminated=bool(i % 2)), "train")


def _assert_same_statistics(got, want):
    fields = [k for k, v in want.items() if isinstance(v, dict)]
    assert fields and sorted(fields) == sorted(k for k, v in got.items() if isinstance(v, dict))
    for key in ("split", "num_trajectories", "num_transitions"):
        assert got[key] == want[key], key
    for name in fields:
        g, w = got[name], want[name]
        for key in ("count", "min", "max", "q01", "q99", "exact_quantiles"):
            assert g[key] == w[key], (name, key)
        for key in ("mean", "std"):  # merged per shard: float64 rounding apart
            np.testing.assert_allclose(g[key], w[key], rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.slow
def test_beam_statistics_on_two_worker_processes_match_the_single_process_run(tmp_path):
    path = tmp_path / "arm"
    _record(path)
    reader = rlds_writer.open_dataset(path)
    assert len(reader.shard_lengths("train")) == 4  # 4 work items
    cmd = [
        sys.executable,
        "-m",
        "rlds_writer.maintain.beam_statistics",
        str(path),
        "--split=train",
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "observation/joints[5]" in proc.stdout  # the table
    cache = path / "dataset_statistics_train.json"
    got = json.loads(cache.read_text())
    want = field_statistics.compute_field_statistics(path, "train")
    _assert_same_statistics(got, want)
    # Written as the split's cache: dataset_statistics returns it as it is.
    assert (
        got["fingerprint"] == field_statistics.dataset_statistics(path, cache=False)["fingerprint"]
    )
    assert field_statistics.dataset_statistics(path) == got


def test_beam_statistics_in_process_runner_with_an_output_path(tmp_path):
    path = tmp_path / "arm"
    _record(path, episodes=7, seed=3)
    output = tmp_path / "out" / "stats.json"
    output.parent.mkdir()
    got = beam_statistics.beam_dataset_statistics(
        path, "train", ["--runner=DirectRunner"], output=output
    )
    assert json.loads(output.read_text()) == got
    assert not (path / "dataset_statistics_train.json").exists()
    _assert_same_statistics(got, field_statistics.compute_field_statistics(path, "train"))


def test_merged_reservoirs_are_a_sample_of_the_rows_of_the_right_size(tmp_path, monkeypatch):
    """Above SAMPLE_ROWS, the shards' samples merge into one sample of that size."""
    path = tmp_path / "arm"
    _record(path, episodes=12, seed=5)
    monkeypatch.setattr(field_statistics, "SAMPLE_ROWS", 4)
    reader = rlds_writer.open_dataset(path)
    items = beam_statistics._work_items(reader, "train")
    partials = [beam_statistics.shard_partial(item, str(path), 0) for item in items]
    # Merged in another order and grouping, as a runner may.
    merged = beam_statistics.merge_partials(
        [beam_statistics.merge_partials(partials[2:]), *partials[:2]]
    )
    exact = field_statistics.compute_field_statistics(path, "train")
    actions = np.concatenate(
        [
            e["steps"]["action"][:-1] if e["steps"]["is_last"][-1] else e["steps"]["action"]
            for e in reader.episodes("train")
        ]
    )
    field = merged["fields"]["action"]
    assert field["count"] == exact["action"]["count"] == len(actions) > 4
    assert field["sample"].shape == (4, 4)
    rows = {tuple(r) for r in actions.astype(np.float64)}
    assert all(tuple(r) in rows for r in field["sample"])
    stats = beam_statistics._finish(merged, "train")
    assert stats["action"]["exact_quantiles"] is False
    assert stats["action"]["min"] == exact["action"]["min"]
    assert stats["action"]["max"] == exact["action"]["max"]
    assert beam_statistics.merge_partials([]) is None
