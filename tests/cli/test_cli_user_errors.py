"""Mistakes users make on the command line: one line of advice, no traceback, no data lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers_core import run_cli

import rlds_writer

BIN = Path(sys.executable).parent / "rlds-writer"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def _run(*args, expect=1, **kwargs):
    result = subprocess.run(
        [str(BIN), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300, **kwargs
    )
    assert result.returncode == expect, (result.returncode, result.stdout, result.stderr)
    return result


# What a command says to a mistake is checked through main() in this process
# (run_cli: a traceback would fail the test as it is raised); the tests about
# the process itself (Ctrl-C, a closed pipe, two runs in a row) start real ones.
def _one_line_error(result, *needles):
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_record_output_that_is_a_file_is_refused_and_the_file_kept(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = run_cli("record", "--output", target, "--episodes", "2", expect=1)
    _one_line_error(result, "--output", "expected a directory", "got an existing file")
    assert target.read_text() == "mine"


@pytest.mark.parametrize("rows", ["1", "0", "-3"])
def test_record_with_too_few_rows_names_the_option(tmp_path, rows):
    result = run_cli("record", "--output", tmp_path / "ds", "--rows", rows, expect=1)
    _one_line_error(result, "--rows", "expected rows >= 2")
    assert not (tmp_path / "ds" / "dataset_info.json").exists()


def test_convert_d4rl_given_a_directory_says_to_pass_the_file(tmp_path):
    (tmp_path / "src").mkdir()
    result = run_cli("convert", "--from", "d4rl-hdf5", tmp_path / "src", tmp_path / "out", expect=1)
    _one_line_error(result, "expected a D4RL-style .hdf5 file", "found a directory")


@pytest.mark.slow
def test_record_append_continues_the_seeded_sequence_instead_of_repeating_it(tmp_path):
    ds = tmp_path / "ds"
    _run("record", "--output", ds, "--episodes", "6", "--no-load-back", expect=0)
    first = [e["steps"] for e in rlds_writer.open_dataset(ds)["train"]]
    _run("record", "--output", ds, "--episodes", 6, "--mode", "append", "--no-load-back", expect=0)
    episodes = [e["steps"] for e in rlds_writer.open_dataset(ds)["train"]]
    assert len(episodes) == 12
    # The first run is untouched by the second.
    for a, b in zip(first, episodes[:6]):
        np.testing.assert_array_equal(a["action"], b["action"])
    # Same seed, same settings: a repeat would give identical action sequences.
    old = {tuple(s["action"].tolist()) for s in episodes[:6]}
    new = [tuple(s["action"].tolist()) for s in episodes[6:]]
    assert sum(seq in old for seq in new) < 6
    assert new != [tuple(s["action"].tolist()) for s in episodes[:6]]


@pytest.mark.slow
def test_ctrl_c_in_record_reports_the_episodes_safely_on_disk(tmp_path):
    ds = tmp_path / "ds"
    proc = subprocess.Popen(
        [str(BIN), "record", "--output", str(ds), "--episodes", "100000000", "--no-load-back"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 120
    # Episodes reach the shard file as they end: once it has bytes, the loop runs.
    while time.monotonic() < deadline and not any(
        p.stat().st_size > 0 for p in ds.glob("catch-train.tfrecord-*")
    ):
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("Interrupted:")]
    safe = int(line.split()[1])
    assert safe > 0
    import tensorflow_datasets as tfds

    loaded = tfds.builder_from_directory(str(ds)).as_dataset(split="train")
    assert sum(1 for _ in loaded) == safe


def test_info_piped_into_a_closed_reader_exits_quietly(tmp_path):
    ds = tmp_path / "ds"
    run_cli("record", "--output", ds, "--episodes", "3", "--no-load-back")  # the data, not the test
    # The reading end is closed before the tool prints anything (`... | head -0`):
    # its first write meets a broken pipe, which must not become a traceback.
    proc = subprocess.Popen(
        [str(BIN), "info", str(ds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
