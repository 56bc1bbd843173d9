"""SIGKILL a batched recording at random moments: nothing flushed is lost, nothing is torn.

The child (batch_crash_child.py) records a vector env a batch at a time and
reports how many episodes each `flush()` had written; the second kill lands
while the batch lane holds every batch since the last flush (its clock held). After each kill,
`recover` runs and the dataset must hold a prefix of the uninterrupted
run's records, byte for byte and in order, at least as long as the last
flush reported; TFDS then loads it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import batch_crash_child
import pytest
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.store.formats.tfrecord import tfrecord

STEPS = 4000  # longer than any kill waits: the child is always killed mid-run
CHILD = Path(batch_crash_child.__file__)


def _records_in_order(path: Path) -> list[bytes]:
    shards = sorted(path.glob("*.tfrecord-*"), key=lambda p: p.name)
    out = []
    for shard in shards:
        with open(shard, "rb") as f:
            out.extend(data for _, data in tfrecord.iter_records(f))
    return out


def _flushed(report: Path) -> int:
    lines = report.read_text().split("\n") if report.exists() else []
    counts = [int(line.split()[1]) for line in lines if line.startswith("flushed")]
    return counts[-1] if counts else 0


def test_sigkill_mid_batched_recording_loses_no_flushed_episode(tmp_path):
    reference = tmp_path / "reference"
    batch_crash_child.record(str(reference), None, 2000)
    want = _records_in_order(reference)
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for kill in range(3):
        directory, report = tmp_path / f"run{kill}", tmp_path / f"report{kill}"
        held = {"BATCH_LANE_INTERVAL": "600"} if kill == 1 else {}
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(report), str(STEPS)],
            env={**env, **held},
        )
        deadline = time.monotonic() + 120
        while _flushed(report) < 40 * (kill + 1) and time.monotonic() < deadline:
            assert child.poll() is None, "the recorder ended before it was killed"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL
        flushed = _flushed(report)
        assert flushed >= 40 * (kill + 1)
        rlds_writer.recover(directory)
        got = _records_in_order(directory)
        assert len(got) >= flushed
        assert len(got) < len(want) and got == want[: len(got)]
        builder = tfds.builder_from_directory(os.fspath(directory))
        assert builder.info.splits["train"].num_examples == len(got)


# Slow: a child importing EnvPool, a TF load of every episode.
@pytest.mark.slow
def test_sigkill_mid_envpool_async_recording_loses_no_flushed_episode(tmp_path):
    """EnvPool's async API (its own threads, its own order): after a SIGKILL and
    `recover`, every flushed episode is there and plain TFDS loads them all, each an
    episode of CartPole from is_first to is_last."""
    pytest.importorskip("envpool")
    directory, report = tmp_path / "run", tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(directory), str(report), str(STEPS), "envpool"], env=env
    )
    deadline = time.monotonic() + 120
    while _flushed(report) < 30 and time.monotonic() < deadline:
        assert child.poll() is None, "the recorder ended before it was killed"
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    flushed = _flushed(report)
    assert flushed >= 30
    rlds_writer.recover(directory)
    builder = tfds.builder_from_directory(os.fspath(directory))
    assert builder.info.splits["train"].num_examples >= flushed
    dataset = builder.as_dataset(split="train")
    assert sum(1 for _ in dataset) == builder.info.splits["train"].num_examples
    for episode in dataset.take(5):
        steps = list(episode["steps"].as_numpy_iterator())
        assert [s["is_first"] for s in steps] == [True] + [False] * (len(steps) - 1)
        assert [s["is_last"] for s in steps] == [False] * (len(steps) - 1) + [True]


def test_episodes_open_at_interpreter_exit_are_written_cut_short(tmp_path):
    from rlds_writer.read import open_dataset

    script = (
        "import gymnasium as gym, numpy as np, sys\n"
        "from rlds_writer import RecordRLDSVector\n"
        "venv = gym.make_vec('CartPole-v1', num_envs=4, vectorization_mode='vector_entry_point')\n"
        "env = RecordRLDSVector(venv, sys.argv[1])\n"
        "env.reset(seed=0)\n"
        "for _ in range(5):\n"
        "    env.step(np.zeros(4, np.int64))\n"  # no close(): the interpreter exits
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "ds")], check=True, env=env)
    episodes = list(open_dataset(tmp_path / "ds").episodes("train"))
    assert [e["end_reason"] for e in episodes] == [b"cut_short"] * 4
    assert [len(e["steps"]["reward"]) for e in episodes] == [6] * 4
