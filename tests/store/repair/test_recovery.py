"""`recover`: torn and garbage tails are cut, every complete record is kept.

Datasets hold deterministic episodes (tests/crash_child.py), so every record
that survives is checked against what the env produced: no corrupt record may
ever reach a reader.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct

import crash_child
import pytest

import rlds_writer
from rlds_writer import cli
from rlds_writer.errors import LockedError, RecoveryError
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.formats.tfrecord.tfrecord import scan as scan_tfrecord
from rlds_writer.store.storage import file_io

NAME = crash_child.NAME


def _shard(directory, index, file_format="tfrecord"):
    return directory / layout.shard_name(NAME, "train", file_format, index)


def _record_offsets(path):
    return [offset for offset, _ in scan_tfrecord(path).spans]


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """10 episodes in shards of 3, 3, 3, 1."""
    directory = tmp_path_factory.mktemp("pristine") / "ds"
    crash_child.write_dataset(directory, range(10), max_episodes_per_file=3)
    return directory


@pytest.fixture
def dataset(pristine, tmp_path):
    directory = tmp_path / "ds"
    shutil.copytree(pristine, directory)
    return directory


def test_recover_on_a_healthy_dataset_changes_nothing(dataset):
    before = _snapshot(dataset)
    report = rlds_writer.recover(dataset)
    assert not report.changed
    assert report.splits == {"train": [3, 3, 3, 1]}
    assert all(s.actions == ["ok"] for s in report.shards)
    assert _snapshot(dataset) == before
    assert "nothing to change" in report.summary()


def _truncate_mid_record(path):
    last = _record_offsets(path)[-1]
    os.truncate(path, last + 20)  # header plus a few data bytes


def _flip_data_crc(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # last byte of the last record's data CRC
    path.write_bytes(bytes(data))


def _flip_length(path):
    last = _record_offsets(path)[-1]
    data = bytearray(path.read_bytes())
    data[last + 2] ^= 0x10  # inside the length field: its CRC no longer matches
    path.write_bytes(bytes(data))


def _append_garbage(path):
    with open(path, "ab") as f:
        f.write(random.Random(7).randbytes(1000))


def _append_torn_header(path):
    with open(path, "ab") as f:
        f.write(struct.pack("<Q", 5000)[:6])


@pytest.mark.parametrize(
    ("damage", "survivors"),
    [
        (_truncate_mid_record, 8),
        (_flip_data_crc, 8),
        (_flip_length, 8),
        (_append_garbage, 9),
        (_append_torn_header, 9),
    ],
)
def test_damaged_tail_of_a_closed_shard_is_dropped_and_kept_aside(dataset, damage, survivors):
    # Damage the tail of the third shard (episodes 6, 7, 8); a fourth follows it,
    # so this is no crash's tear: the original bytes must be kept.
    shard = _shard(dataset, 2)
    damage(shard)
    damaged = shard.read_bytes()
    report = rlds_writer.recover(dataset)
    assert report.changed
    (acted,) = [s for s in report.shards if s.actions != ["ok"]]
    assert acted.file == shard.name
    assert "rewritten" in acted.actions
    assert acted.detail  # says why and where
    (kept,) = [p for p in dataset.iterdir() if p.name.startswith(f".corrupt-{shard.name}")]
    assert kept.read_bytes() == damaged
    expected = [i for i in range(10) if survivors == 9 or i != 8]
    assert crash_child.check_records(dataset) == expected
    assert scan_tfrecord(shard).tail_problem is None
    assert not rlds_writer.recover(dataset).changed  # idempotent
    assert crash_child.check_loaded(dataset) == expected
    assert rlds_writer.maintain.validate(dataset)["ok"]


@pytest.mark.parametrize("damage", [_truncate_mid_record, _append_torn_header])
def test_torn_tail_of_the_last_shard_is_cut_in_place(dataset, damage):
    shard = _shard(dataset, 3)  # episode 9, the shard a crash tears
    damage(shard)
    report = rlds_writer.recover(dataset)
    (acted,) = [s for s in report.shards if s.actions != ["ok"]]
    assert acted.file == shard.name
    assert "truncated" in acted.actions or "removed-torn" in acted.actions
    survivors = list(range(9)) if damage is _truncate_mid_record else list(range(10))
    assert crash_child.check_records(dataset) == survivors
    assert not rlds_writer.recover(dataset).changed


def test_bad_crc_mid_shard_drops_only_that_record_and_keeps_the_original(dataset):
    shard = _shard(dataset, 1)  # episodes 3, 4, 5
    middle = _record_offsets(shard)[1]
    data = bytearray(shard.read_bytes())
    data[middle + tfrecord.HEADER_SIZE + 30] ^= 0x04
    shard.write_bytes(bytes(data))
    report = rlds_writer.recover(dataset)
    (acted,) = [s for s in report.shards if s.actions != ["ok"]]
    assert acted.actions == ["listed", "rewritten"]
    assert report.splits["train"] == [3, 2, 3, 1]
    kept = [p.name for p in dataset.iterdir() if p.name.startswith(".corrupt-")]
    assert len(kept) == 1 and kept[0].startswith(f".corrupt-{shard.name}")
    assert (dataset / kept[0]).read_bytes() == bytes(data)
    expected = [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert crash_child.check_records(dataset) == expected
    assert crash_child.check_loaded(dataset) == expected


def test_random_damage_never_lets_a_corrupt_record_through(pristine, tmp_path):
    rng = random.Random(11)
    for trial in range(30):
        directory = tmp_path / f"ds{trial}"
        shutil.copytree(pristine, directory)
        shard = _shard(directory, rng.randrange(4))
        data = bytearray(shard.read_bytes())
        kind = trial % 3
        if kind == 0:  # flip one byte anywhere
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut anywhere
            data = data[: rng.randrange(len(data))]
        else:  # overwrite a run with random bytes
            pos = rng.randrange(len(data))
            data[pos : pos + 64] = rng.randbytes(len(data[pos : pos + 64]))
        shard.write_bytes(bytes(data))
        rlds_writer.recover(directory)
        ids = crash_child.check_records(directory)  # every kept record is intact
        assert ids == sorted(set(ids)) and len(ids) >= 6, ids
        assert not rlds_writer.recover(directory).changed
    # The last damaged copy loads through TFDS too.
    assert crash_child.check_loaded(directory) == ids


def test_episodes_written_after_the_last_commit_are_listed(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(4), max_episodes_per_file=3)
    stale_info = (directory / layout.DATASET_INFO).read_text()
    crash_child.write_dataset(directory, range(4, 9), max_episodes_per_file=3, mode="append")
    # As after a crash: dataset_info.json from before the last 5 episodes.
    (directory / layout.DATASET_INFO).write_text(stale_info)
    assert sum(layout.read_splits(json.loads(stale_info))["train"][0]) == 4
    report = rlds_writer.recover(directory)
    assert report.listed_before == {"train": [3, 1]}
    assert report.splits == {"train": [3, 1, 3, 2]}
    assert report.episodes == {"train": 9}
    assert crash_child.check_loaded(directory) == list(range(9))


def test_empty_torn_and_unreadable_shards_are_dropped_and_the_rest_renumbered(dataset):
    _shard(dataset, 1).write_bytes(b"")  # opened, never written
    garbage = random.Random(3).randbytes(200)
    _shard(dataset, 4).write_bytes(garbage)  # not TFRecord data at all
    # Only the last shard can hold a crash's torn first record: it goes.
    _shard(dataset, 5).write_bytes(_shard(dataset, 0).read_bytes()[:100])
    report = rlds_writer.recover(dataset)
    assert report.splits == {"train": [3, 3, 1]}
    actions = {s.file: s.actions for s in report.shards}
    assert actions[_shard(dataset, 1).name] == ["removed-empty"]
    assert actions[_shard(dataset, 2).name] == ["renamed"]
    assert actions[_shard(dataset, 4).name] == ["quarantined"]
    assert actions[_shard(dataset, 5).name] == ["removed-torn"]
    assert sorted(layout.list_shard_files(dataset, NAME, "train", "tfrecord")) == [0, 1, 2]
    (kept,) = [p for p in dataset.iterdir() if p.name.startswith(".corrupt-")]
    assert kept.read_bytes() == garbage
    assert crash_child.check_loaded(dataset) == [0, 1, 2, 6, 7, 8, 9]


def test_dry_run_reports_without_changing_anything(dataset):
    _append_garbage(_shard(dataset, 3))
    before = _snapshot(dataset)
    report = rlds_writer.recover(dataset, dry_run=True)
    assert report.changed and report.dry_run
    assert "dry run" in report.summary()
    assert _snapshot(dataset) == before


def test_leftover_temporary_files_are_removed(dataset):
    (dataset / ".dataset_info.json.tmp-12345").write_text("{")
    report = rlds_writer.recover(dataset)
    assert report.removed_temp_files == [".dataset_info.json.tmp-12345"]
    assert not (dataset / ".dataset_info.json.tmp-12345").exists()


def test_recover_is_refused_while_a_writer_is_open(dataset):
    import rlds_writer as rw

    backend = rw.TFDSBackendWriter(dataset, crash_child.dataset_config(), mode="append")
    try:
        with pytest.raises(LockedError, match="recover"):
            rlds_writer.recover(dataset)
    finally:
        backend.close()


def test_append_after_an_interrupted_creation_starts_afresh(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, [], max_episodes_per_file=3)
    # As if a power loss emptied the first commit's dataset_info.json.
    (directory / layout.DATASET_INFO).write_text("")
    crash_child.write_dataset(directory, range(2), mode="append")
    assert crash_child.check_loaded(directory) == [0, 1]


def test_a_creation_killed_before_its_first_commit_is_started_afresh(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, [], max_episodes_per_file=3)
    # As if killed after TFDS wrote features.json, before the first commit.
    (directory / layout.DATASET_INFO).unlink()
    assert not layout.holds_dataset(directory)
    crash_child.write_dataset(directory, range(2))  # mode="error": nothing is there yet
    assert crash_child.check_loaded(directory) == [0, 1]
    (directory / layout.DATASET_INFO).unlink()
    for shard in directory.glob("*.tfrecord-*"):
        shard.unlink()
    crash_child.write_dataset(directory, range(3), mode="append")
    assert crash_child.check_loaded(directory) == [0, 1, 2]


def test_recover_cleans_up_an_interrupted_creation(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, [], max_episodes_per_file=3)
    (directory / layout.FEATURES).write_text('{"featuresDict": ')
    report = rlds_writer.recover(directory)
    assert report.changed and "interrupted dataset creation" in report.summary()
    assert not layout.holds_dataset(directory)


def test_lost_dataset_info_with_shards_is_an_error_not_a_guess(dataset):
    (dataset / layout.DATASET_INFO).unlink()
    with pytest.raises(RecoveryError, match="Restore dataset_info.json"):
        rlds_writer.recover(dataset)


def test_unreadable_array_record_shard_is_set_aside(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(
        directory, range(7), max_episodes_per_file=3, file_format="array_record"
    )
    shard = _shard(directory, 1, "array_record")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # no footer: unreadable
    report = rlds_writer.recover(directory)
    shards = {s.file: s for s in report.shards}
    assert shards[shard.name].actions == ["quarantined"]
    assert "unreadable" in shards[shard.name].detail[0]
    assert shards[_shard(directory, 2, "array_record").name].actions == ["renamed"]
    assert report.splits == {"train": [3, 1]}
    assert crash_child.check_records(directory) == [0, 1, 2, 6]
    assert crash_child.check_loaded(directory) == [0, 1, 2, 6]
    assert any(p.name.startswith(".corrupt-") for p in directory.iterdir())


def test_recover_command_prints_a_json_report(dataset, capsys):
    _append_garbage(_shard(dataset, 0))
    assert cli.main(["recover", str(dataset), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["changed"] is True
    assert report["episodes"] == {"train": 10}
    assert report["shards"][0]["actions"] == ["rewritten"]  # a closed shard: kept aside
    assert cli.main(["recover", str(dataset)]) == 0
    assert "nothing to change" in capsys.readouterr().out


def test_every_split_is_recovered(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(4), max_episodes_per_file=3)
    backend = rlds_writer.TFDSBackendWriter(
        directory, crash_child.dataset_config(), split_name="eval", mode="append"
    )
    for episode_id in range(100, 103):
        crash_child.record_episode(backend, episode_id)
    backend.close()
    # A crash before eval was ever committed, with a torn eval tail.
    info = file_io.read_json(directory / layout.DATASET_INFO)
    (directory / layout.DATASET_INFO).write_text(
        json.dumps(layout.with_splits(info, {"train": ([3, 1], 0)}))
    )
    with open(directory / layout.shard_name(NAME, "eval", "tfrecord", 0), "ab") as f:
        f.write(b"\xff" * 9)
    report = rlds_writer.recover(directory)
    assert report.splits == {"train": [3, 1], "eval": [3]}
    assert crash_child.check_records(directory, "eval") == [100, 101, 102]
    assert crash_child.check_loaded(directory, "eval") == [100, 101, 102]
    assert rlds_writer.maintain.validate(directory)["splits"]["eval"]["episodes"] == 3
