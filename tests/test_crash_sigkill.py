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
import multiprocessing
import os
import random
import signal
import time
from typing import Any

import crash_child
import numpy as np
import pytest

import rlds_writer
from rlds_writer import layout
from rlds_writer.inspection import decoded_episodes, iter_shard_records

_PRELOAD = [
    "crash_child",
    "tensorflow",
    "tensorflow_datasets",
    "rlds_writer.writer",
    "rlds_writer.backend",
    "rlds_writer.recovery",
    "rlds_writer.envs.catch",
]
_STEP_KEYS = ("observation", "action", "reward", "discount", "t", "is_first", "is_last")


@pytest.fixture(scope="module")
def forkserver() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _expected(cache: dict[int, dict[str, Any]], episode_id: int) -> dict[str, Any]:
    if episode_id not in cache:
        cache[episode_id] = crash_child.expected_episode(episode_id)
    return cache[episode_id]


def _check_raw(directory: Any, cache: dict[int, dict[str, Any]]) -> int:
    """Checks every record of the dataset against the env; returns the episode count."""
    import tensorflow as tf

    info = layout.read_json(directory / layout.DATASET_INFO)
    lengths, _ = layout.read_splits(info)["train"]
    files = layout.list_shard_files(directory, crash_child.NAME, "train", info["fileFormat"])
    assert sorted(files) == list(range(len(lengths))), "shard files are not contiguous"
    episode_id = 0
    for index, n in enumerate(lengths):
        records = list(iter_shard_records(files[index], info["fileFormat"]))
        assert len(records) == n, f"{files[index].name}: {len(records)} records, listed {n}"
        for record in records:
            feature = tf.train.Example.FromString(record).features.feature
            got = {
                key: np.array(getattr(value, value.WhichOneof("kind")).value)
                for key, value in feature.items()
            }
            assert got["episode_id"].tolist() == [episode_id], "episodes out of order"
            want = _expected(cache, episode_id)
            steps = len(want["t"])
            np.testing.assert_array_equal(
                got["steps/observation"].reshape(steps, crash_child.ROWS, crash_child.COLUMNS),
                want["observation"],
            )
            for key in ("action", "reward", "discount", "t", "is_first", "is_last", "is_terminal"):
                np.testing.assert_array_equal(
                    got[f"steps/{key}"], want[key].astype(got[f"steps/{key}"].dtype), key
                )
            episode_id += 1
    return episode_id


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
    cache: dict[int, dict[str, Any]] = {}
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
        for shard in result.shards:
            for action in shard.actions:
                stats[f"recover: {action}"] += 1
        stats["recover changed something"] += result.changed
        count = _check_raw(directory, cache)
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
    loaded = 0
    for episode in decoded_episodes(directory, "train"):
        want = _expected(cache, loaded)
        assert int(episode["episode_id"]) == loaded
        for key in (*_STEP_KEYS, "is_terminal"):
            np.testing.assert_array_equal(episode["steps"][key], want[key], key)
        loaded += 1
    assert loaded == present
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
