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
from rlds_writer.store.dataset import layout


@pytest.fixture(scope="module")
def forkserver() -> Any:
    return crash_child.forkserver_context()


def _wait_for(path: Any, word: str, count: int = 1, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().split().count(word) >= count:
            return
        time.sleep(0.002)
    raise AssertionError(
        f"the recorder never reported {word!r} {count} times (does the writer still write "
        "records with os.writev and commit with os.replace? see crash_child._slow_down_io)"
    )


# Where each kill lands, by kill number modulo 4.
_WHEN = (
    "anytime",  # from start-up on: creation, append-time recovery, recording
    "recording",  # a random moment after the writer is open
    "mid-record",  # while a record is half written
    "mid-commit",  # dataset_info.json's temporary file written, not yet renamed
)


def _kill_loop(
    ctx: Any,
    tmp_path: Any,
    file_format: str,
    kills: int,
    seed: int,
    write_ahead_from: int | None = None,
) -> collections.Counter:
    directory = tmp_path / "dataset"
    rng = random.Random(seed)
    stats: collections.Counter = collections.Counter()
    present = 0
    for kill in range(kills):
        report = tmp_path / f"report-{kill}.txt"
        when = _WHEN[kill % 4]
        process = ctx.Process(
            target=crash_child.record_forever,
            args=(str(directory), present, str(report)),
            kwargs={
                "file_format": file_format,
                "seed": seed * 1000 + kill,
                # Slow, announced writes and commits to kill inside them.
                "slow_io": 0.03 if when.startswith("mid") else 0.0,
                "write_ahead_from": write_ahead_from,
            },
        )
        process.start()
        if when == "anytime":
            time.sleep(rng.uniform(0.0, 0.3))
        elif when == "recording":
            _wait_for(report, "open")
            time.sleep(rng.uniform(0.0, 0.25))
        else:
            # array_record's writer does its I/O in C++: no torn-record window to aim at.
            torn = when == "mid-record" and file_format == "tfrecord"
            _wait_for(report, "torn" if torn else "replace", rng.randint(1, 6))
        stats[f"kills {when}"] += 1
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
    result = rlds_writer.maintain.validate(directory)
    assert result["ok"], result["violations"]
    assert result["splits"]["train"]["episodes"] == present
    assert crash_child.check_loaded(directory) == list(range(present))
    print(f"\n{file_format}: {kills} kills, {present} episodes survived; {dict(stats)}")
    assert present > 0
    assert stats["recover changed something"] > 0
    return stats


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_flushed_tfrecord_episode(forkserver, tmp_path):
    _kill_loop(forkserver, tmp_path, "tfrecord", kills=32, seed=1)


@pytest.mark.slow
def test_sigkill_while_records_go_into_zeros_written_ahead_loses_nothing_and_keeps_nothing_aside(
    forkserver, tmp_path
):
    # Every record lands in zeros written ahead: a kill leaves them after the
    # last record or after a torn one, which recover cuts like any crash tail.
    stats = _kill_loop(forkserver, tmp_path, "tfrecord", kills=12, seed=3, write_ahead_from=0)
    assert stats["recover: truncated"] > 0
    assert not stats["recover: rewritten"] and not stats["recover: quarantined"], stats
    assert not any(".corrupt-" in p.name for p in (tmp_path / "dataset").iterdir())


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_flushed_array_record_episode(forkserver, tmp_path):
    # array_record cannot flush an open file: flush() closes the shard instead.
    _kill_loop(forkserver, tmp_path, "array_record", kills=10, seed=2)
