"""`rlds-writer record` and `python -m rlds_writer record`, run as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_core import load_episodes, load_episodes_from_data_source

BIN = Path(sys.executable).parent


def _run(*args, expect=0):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == expect, (
        f"exit {result.returncode} != {expect}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result


def _shard_lengths(path):
    with open(path / "dataset_info.json") as f:
        (split,) = json.load(f)["splits"]
    return [int(n) for n in split["shardLengths"]]


def _check_catch_episodes(episodes, rows):
    for episode in episodes:
        steps = episode["steps"]
        assert len(steps) == rows  # rows - 1 transitions, plus the final step
        assert [bool(s["is_first"]) for s in steps] == [True] + [False] * (rows - 1)
        assert bool(steps[-1]["is_last"]) and bool(steps[-1]["is_terminal"])
        assert steps[-1]["action"] == 0 and steps[-1]["reward"] == 0.0
        assert float(np.sum(steps[0]["observation"])) == 2.0  # the ball and the paddle
        assert episode["seed"] == 0


def test_console_script_records_tfrecord_shards_that_tfds_loads(tmp_path):
    out = tmp_path / "catch"
    result = _run(
        str(BIN / "rlds-writer"),
        "record",
        "--output",
        str(out),
        "--episodes",
        "7",
        "--max-episodes-per-file",
        "3",
        "--format",
        "tfrecord",
    )
    assert "Recorded 7 episodes (63 transitions)" in result.stdout
    assert "7 episodes, 70 steps" in result.stdout  # its own load-back
    assert f"tfds.builder_from_directory('{out}').as_dataset(split='train')" in result.stdout
    assert _shard_lengths(out) == [3, 3, 1]
    episodes = load_episodes(out)
    assert len(episodes) == 7
    _check_catch_episodes(episodes, rows=10)


@pytest.mark.slow
def test_python_m_records_array_record_and_a_rerun_without_mode_fails_clearly(tmp_path):
    out = tmp_path / "catch_ar"
    args = [
        sys.executable,
        "-m",
        "rlds_writer",
        "record",
        "--output",
        str(out),
        "--episodes",
        "5",
        "--max-episodes-per-file",
        "2",
        "--format",
        "array_record",
        "--rows",
        "4",
    ]
    result = _run(*args)
    assert "as_data_source: 5 episodes, 20 steps" in result.stdout
    assert sorted(p.name for p in out.glob("catch-train.array_record-*")) == [
        f"catch-train.array_record-{i:05d}" for i in range(3)
    ]
    assert _shard_lengths(out) == [2, 2, 1]
    episodes = load_episodes_from_data_source(out)
    assert len(episodes) == 5
    _check_catch_episodes(episodes, rows=4)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    again = _run(*args, expect=1)
    message = again.stderr.strip().splitlines()[-1]
    assert message.startswith("rlds-writer record: error:")
    assert "already holds a dataset" in message and "--mode append" in message
    assert "Traceback" not in again.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    _run(*args, "--mode", "append", "--episodes", "1", "--no-load-back")  # last --episodes wins
    assert _shard_lengths(out) == [2, 2, 1, 1]
    assert len(load_episodes_from_data_source(out)) == 6
