"""SIGKILL a recording process at random moments; no flushed episode may be lost.

A recorder (tests/crash_child.py) appends deterministic episodes to one
dataset until it is killed with SIGKILL, again and again: during start-up and
its append-time recovery, mid-episode, at episode boundaries, while a shard
rotates and while dataset_info.json is committed (4 episodes per shard, a
commit every 20 ms, a flush after every 1-4 episodes). After each kill the
test runs `recover` and checks, record by record, that the dataset holds
episodes 0..n-1 in order, each exactly as the env produced it, with n past
every episode the recorder reported as flushed. At the end the whole dataset
is loaded with `tfds.builder_from_directory` and validated.

The recorders are forked from a `forkserver` that has already imported
TensorFlow, so a new recorder starts in a fraction of a second.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from typing import Any

import crash_child
import pytest

import rlds_writer
from rlds_writer import layout


@pytest.fixture(scope="module")
def forkserver() -> Any:
    return crash_child.forkserver_context()


def _wait_for(path: Any, word: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and any(line.startswith(word) for line in path.read_text().splitlines()):
            return
        time.sleep(0.005)
    raise AssertionError(f"the recorder never reported {word!r}: {path.read_text()!r}")


def _kill_loop(ctx: Any, tmp_path: Any, file_format: str, kills: int, seed: int) -> None:
    directory = tmp_path / "dataset"
    rng = random.Random(seed)
    stats: collections.Counter = collections.Counter()
    present = 0
    for kill in range(kills):
        report = tmp_path / f"report-{kill}.txt"
        process = ctx.Process(
            target=crash_child.record_forever,
            args=(str(directory), present, str(report)),
            kwargs={"file_format": file_format, "seed": seed * 1000 + kill},
        )
        process.start()
        if kill % 3 == 0:
            # Anywhere from start-up (dataset creation, append-time recovery) on.
            time.sleep(rng.uniform(0.0, 0.3))
        else:
            _wait_for(report, "open")
            time.sleep(rng.uniform(0.0, 0.25))
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        assert process.exitcode == -signal.SIGKILL, process.exitcode
        lines = report.read_text().splitlines() if report.exists() else []
        flushed = [int(line.split()[1]) for line in lines if line.startswith("flushed")]
        stats["killed before the writer was open"] += not any(
            line.startswith("open") for line in lines
        )
        if not (directory / layout.DATASET_INFO).exists() and not any(
            "tfrecord-" in p.name or "array_record-" in p.name
            for p in (directory.iterdir() if directory.exists() else [])
        ):
            assert not flushed
            stats["killed while creating the dataset"] += 1
            continue
        result = rlds_writer.recover(directory)
        if not (directory / layout.DATASET_INFO).exists():
            # Killed while TFDS wrote the new dataset's JSON files: cleaned up.
            assert not flushed and "interrupted dataset creation" in result.summary()
            stats["killed while creating the dataset"] += 1
            continue
        for shard in result.shards:
            for action in shard.actions:
                stats[f"recover: {action}"] += 1
        stats["recover changed something"] += result.changed
        stats["recover: removed temporary file"] += len(result.removed_temp_files)
        ids = crash_child.check_records(directory)
        count = len(ids)
        assert ids == list(range(count)), "episodes missing, repeated or out of order"
        assert count >= present, f"kill {kill}: episodes were lost ({count} < {present})"
        if flushed:
            assert max(flushed) < count, (
                f"kill {kill}: episode {max(flushed)} was flushed but only {count} survived"
            )
        stats["flushed episodes"] += len(flushed)
        stats["episodes kept beyond the last flush"] += count - (
            max(flushed) + 1 if flushed else present
        )
        present = count
    # Recovery is idempotent: a second run changes nothing.
    assert not rlds_writer.recover(directory).changed
    result = rlds_writer.validate(directory)
    assert result["ok"], result["violations"]
    assert result["splits"]["train"]["episodes"] == present
    assert crash_child.check_loaded(directory) == list(range(present))
    print(f"\n{file_format}: {kills} kills, {present} episodes survived; {dict(stats)}")
    assert present > 0
    assert stats["recover changed something"] > 0


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_flushed_tfrecord_episode(forkserver, tmp_path):
    _kill_loop(forkserver, tmp_path, "tfrecord", kills=32, seed=1)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_flushed_array_record_episode(forkserver, tmp_path):
    # array_record cannot flush an open file: flush() closes the shard instead.
    _kill_loop(forkserver, tmp_path, "array_record", kills=10, seed=2)
