"""Parallel writers in their own subdirectories, read together or merged into one dataset."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time

import crash_child
import pytest

import rlds_writer
from rlds_writer import cli
from rlds_writer.errors import (
    DatasetExistsError,
    IncompatibleDatasetError,
    LockedError,
    RecoveryError,
)
from rlds_writer.store.dataset import layout
from rlds_writer.store.repair.merge import MERGE_JOURNAL, MergeError
from rlds_writer.store.storage import file_io
from rlds_writer.store.storage.object_path import as_path

merge_module = importlib.import_module("rlds_writer.store.repair.merge")
EPISODES = 6  # per writer: shards of 4 and 2


def _ids(worker: int) -> list[int]:
    return list(range(worker * 100, worker * 100 + EPISODES))


@pytest.fixture(scope="module")
def four_writers(tmp_path_factory):
    """Four writer processes, each into its own subdirectory, all at once."""
    root = tmp_path_factory.mktemp("parallel")
    ctx = crash_child.forkserver_context()
    processes = []
    for worker in range(4):
        process = ctx.Process(
            target=crash_child.write_dataset,
            args=(str(rlds_writer.store.writer_directory(root, worker)), _ids(worker)),
            kwargs={
                "max_episodes_per_file": 4,
                "metadata": {"recorder": "crash_child", "worker": worker},
            },
        )
        process.start()
        processes.append(process)
    for process in processes:
        process.join()
        assert process.exitcode == 0
    return root


@pytest.fixture
def sources(four_writers, tmp_path):
    """A private copy of the four writers' directories."""
    out = []
    for worker in range(4):
        source = rlds_writer.store.writer_directory(four_writers, worker)
        copy = tmp_path / "src" / source.name
        shutil.copytree(source, copy)
        out.append(copy)
    return out


ALL_IDS = [i for worker in range(4) for i in _ids(worker)]


def test_builder_from_directories_reads_the_unmerged_subdirectories_together(four_writers):
    import tensorflow_datasets as tfds

    subdirs = sorted(os.fspath(p) for p in four_writers.iterdir())
    assert [os.path.basename(p) for p in subdirs] == [f"writer-{i:05d}" for i in range(4)]
    builder = tfds.builder_from_directories(subdirs)
    ids = [int(e["episode_id"]) for e in tfds.as_numpy(builder.as_dataset(split="train"))]
    assert sorted(ids) == ALL_IDS


def test_four_writers_merged_hold_every_episode_exactly_once(sources, tmp_path):
    dest = tmp_path / "merged"
    report = rlds_writer.merge(sources, dest)
    assert report.episodes == {"train": 24}
    assert report.splits == {"train": [4, 2] * 4}
    assert report.shards_copied == 8 and not report.resumed
    assert crash_child.check_records(dest) == ALL_IDS  # contiguous shards, source order
    assert crash_child.check_loaded(dest) == ALL_IDS
    assert rlds_writer.maintain.validate(dest)["ok"]
    assert not rlds_writer.recover(dest).changed
    metadata = file_io.read_json(dest / layout.METADATA)
    assert metadata["recorder"] == "crash_child"
    assert [m["metadata"] for m in metadata["merged_from"]] == [{"worker": w} for w in range(4)]
    assert [m["episodes"]["train"] for m in metadata["merged_from"]] == [
        [0, 6],
        [6, 12],
        [12, 18],
        [18, 24],
    ]
    assert (dest / layout.FEATURES).read_text() == (sources[0] / layout.FEATURES).read_text()
    assert not (dest / MERGE_JOURNAL).exists() and not (dest / layout.LOCK).exists()
    # Copying leaves the sources whole.
    assert crash_child.check_records(sources[2]) == _ids(2)
    with pytest.raises(DatasetExistsError):
        rlds_writer.merge(sources, dest)


def test_merge_command_moves_shards_and_removes_the_sources(sources, tmp_path, capsys):
    dest = tmp_path / "merged"
    argv = ["merge", *map(os.fspath, sources), "--output", os.fspath(dest), "--move", "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shards_moved"] == 8 and report["episodes"] == {"train": 24}
    assert not any(s.exists() for s in sources)
    assert crash_child.check_records(dest) == ALL_IDS


def test_merge_refuses_different_features_or_version_and_shows_the_difference(sources, tmp_path):
    features = (sources[1] / layout.FEATURES).read_text()
    (sources[1] / layout.FEATURES).write_text(features.replace('"4"', '"5"'))
    info = file_io.read_json(sources[2] / layout.DATASET_INFO)
    info["version"] = "1.0.0"
    (sources[2] / layout.DATASET_INFO).write_text(json.dumps(info))
    with pytest.raises(IncompatibleDatasetError) as caught:
        rlds_writer.merge(sources, tmp_path / "merged")
    message = str(caught.value)
    assert "writer-00001" in message and "observation/tensor/shape/dimensions" in message
    assert "writer-00002" in message and "version '1.0.0' != '0.0.1'" in message
    assert not layout.holds_dataset(tmp_path / "merged")


def _interrupt_after(monkeypatch, target, name, calls):
    real = getattr(target, name)
    count = {"n": 0}

    def flaky(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise KeyboardInterrupt("interrupted")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, flaky)


def test_interrupted_copy_merge_is_finished_by_running_it_again(sources, tmp_path, monkeypatch):
    dest = tmp_path / "merged"
    _interrupt_after(monkeypatch, file_io, "copy_complete", 3)
    with pytest.raises(KeyboardInterrupt):
        rlds_writer.merge(sources, dest)
    monkeypatch.undo()
    assert (dest / MERGE_JOURNAL).exists() and not (dest / layout.DATASET_INFO).exists()
    with pytest.raises(RecoveryError, match="run the same merge again"):
        rlds_writer.recover(dest)
    with pytest.raises(MergeError, match="unfinished merge"):
        rlds_writer.merge(sources[:2], dest)
    # As if killed while copying the fourth shard: a partial temporary copy.
    fourth = layout.shard_name(crash_child.NAME, "train", "tfrecord", 3)
    (dest / f".{fourth}.merge-tmp").write_bytes(b"partial")
    report = rlds_writer.merge(sources, dest)
    assert report.resumed and report.shards_already_done == 3 and report.shards_copied == 5
    assert crash_child.check_records(dest) == ALL_IDS


def test_interrupted_move_merge_is_finished_by_running_it_again(sources, tmp_path, monkeypatch):
    dest = tmp_path / "merged"
    _interrupt_after(monkeypatch, type(as_path(sources[0])), "rename", 5)
    with pytest.raises(KeyboardInterrupt):
        rlds_writer.merge(sources, dest, move=True)
    monkeypatch.undo()
    # As if killed in a cross-device move of the sixth shard after its copy,
    # before the source was deleted: the shard is in both places.
    sixth = layout.shard_name(crash_child.NAME, "train", "tfrecord", 1)
    shutil.copyfile(
        sources[2] / sixth, dest / layout.shard_name(crash_child.NAME, "train", "tfrecord", 5)
    )
    report = rlds_writer.merge(sources, dest, move=True)
    assert report.resumed and report.shards_already_done == 6 and report.shards_moved == 2
    assert crash_child.check_records(dest) == ALL_IDS
    assert not any(s.exists() for s in sources)
    assert not any(p.name.endswith("merge-tmp") for p in dest.iterdir())


@pytest.mark.parametrize("move", [False, True], ids=["copy", "move"])
def test_merge_killed_at_random_moments_finishes_exactly_once(sources, tmp_path, move):
    import random
    import signal

    ctx = crash_child.forkserver_context()
    rng = random.Random(5 + move)
    for attempt in range(3):
        dest = tmp_path / f"merged{attempt}"
        args = ([os.fspath(s) for s in sources], os.fspath(dest), move, 0.06)
        # Killed twice in a row, then finished by a third run.
        for _ in range(2):
            process = ctx.Process(target=crash_child.slow_merge, args=args)
            process.start()
            time.sleep(rng.uniform(0.0, 0.35))
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it finished (and the fork server reaped it) before the kill
            process.join()
        finished = (dest / layout.DATASET_INFO).exists() and not (dest / MERGE_JOURNAL).exists()
        if not finished:  # (a killed run may have finished just before its kill)
            rlds_writer.merge(sources, dest, move=move)
        assert crash_child.check_records(dest) == ALL_IDS
        assert not (dest / MERGE_JOURNAL).exists()
        if move:
            assert not any(s.exists() for s in sources)
            break  # the sources are gone
        assert crash_child.check_records(sources[1]) == _ids(1)


def test_merge_recovers_a_crashed_source_first(sources, tmp_path):
    # Writer 3 "crashed": dataset_info.json lists only its first shard, and its
    # second shard ends in a torn record.
    info = file_io.read_json(sources[3] / layout.DATASET_INFO)
    stale = layout.with_splits(info, {"train": ([4], 0)})
    (sources[3] / layout.DATASET_INFO).write_text(json.dumps(stale))
    last = sources[3] / layout.shard_name(crash_child.NAME, "train", "tfrecord", 1)
    with open(last, "ab") as f:
        f.write(b"\x00" * 7)
    report = rlds_writer.merge(sources, tmp_path / "merged")
    assert list(report.recovered) == [os.fspath(sources[3])]
    assert crash_child.check_records(tmp_path / "merged") == ALL_IDS


def test_merge_through_generic_path_operations(sources, tmp_path, monkeypatch):
    # As on gs:// or s3://: no os.rename/shutil/flock, only path-object calls.
    monkeypatch.setattr(file_io, "is_local", lambda path: False)
    report = rlds_writer.merge(sources, tmp_path / "merged")
    monkeypatch.undo()
    assert report.episodes == {"train": 24}
    assert crash_child.check_loaded(tmp_path / "merged") == ALL_IDS


def test_merge_waits_for_writers_and_checks_its_arguments(sources, tmp_path):
    writer = rlds_writer.TFDSBackendWriter(sources[0], crash_child.dataset_config(), mode="append")
    try:
        with pytest.raises(LockedError, match="merge"):
            rlds_writer.merge(sources, tmp_path / "merged")
    finally:
        writer.close()
    with pytest.raises(ValueError, match="one of the sources"):
        rlds_writer.merge(sources, sources[0])
    with pytest.raises(ValueError, match="twice"):
        rlds_writer.merge([sources[0], sources[0]], tmp_path / "merged")
