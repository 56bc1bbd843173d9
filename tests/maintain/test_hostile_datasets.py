"""Crafted datasets must not make any tool read, write or delete outside the directory,
nor run out of memory, nor give a wrong answer: each gets a one-line error naming the file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct

import crash_child
import pytest

import rlds_writer
from rlds_writer.errors import CorruptRecordError, RLDSWriterError
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats.tfrecord import tfrecord

NAME = crash_child.NAME


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


@pytest.fixture
def outside(tmp_path):
    """A file of the user's, outside the dataset, that nothing may touch."""
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_text("the user's own data\n" * 100)
    return path


def _shard(directory, index):
    return directory / layout.shard_name(NAME, "train", "tfrecord", index)


def _edit_info(dataset, **changes):
    path = dataset / layout.DATASET_INFO
    info = json.loads(path.read_text())
    for key, value in changes.items():
        if key.startswith("split_"):
            info["splits"][0][key[len("split_") :]] = value
        else:
            info[key] = value
    path.write_text(json.dumps(info))


def _untouched(path):
    assert path.read_text() == "the user's own data\n" * 100


# ------------------------------------------------------------- symbolic links


def test_a_symlinked_lock_file_is_never_written_through(dataset, outside):
    (dataset / layout.LOCK).symlink_to(outside)
    with pytest.raises(RLDSWriterError, match="symbolic link"):
        rlds_writer.recover(dataset)
    with pytest.raises(RLDSWriterError, match="symbolic link"):
        crash_child.write_dataset(dataset, range(10, 12), mode="append")
    with pytest.raises(RLDSWriterError, match="symbolic link"):
        rlds_writer.merge([dataset], dataset.parent / "merged")
    _untouched(outside)


def test_a_symlinked_shard_is_refused_by_recover_not_truncated(dataset, outside):
    _shard(dataset, 3).unlink()
    _shard(dataset, 3).symlink_to(outside)
    with pytest.raises(RLDSWriterError, match="symbolic link"):
        rlds_writer.recover(dataset)
    _untouched(outside)


def test_a_symlinked_shard_is_refused_by_merge(dataset, outside, tmp_path):
    _shard(dataset, 3).unlink()
    _shard(dataset, 3).symlink_to(outside)
    with pytest.raises(RLDSWriterError, match="symbolic link"):
        rlds_writer.merge([dataset], tmp_path / "merged", move=True, recover_sources=False)
    _untouched(outside)
    assert os.path.islink(_shard(dataset, 3))


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_shard_that_is_not_a_regular_file_is_refused_not_waited_on(dataset, kind):
    # A FIFO blocked open() forever (recover, open_dataset, the Ray datasource, the
    # torch stream); a directory gave "[Errno 21] Is a directory: 6".
    shard = _shard(dataset, 1)
    shard.unlink()
    os.mkfifo(shard) if kind == "fifo" else shard.mkdir()
    message = f"{shard}: a {'FIFO' if kind == 'fifo' else 'directory'}, not a regular file"

    def timeout(*args):
        raise TimeoutError("blocked on the planted file")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(30)
    try:
        with pytest.raises(RLDSWriterError, match=message):
            rlds_writer.recover(dataset)
        with pytest.raises(RLDSWriterError, match=message):
            rlds_writer.open_dataset(dataset)["train"][3]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -------------------------------------------------- names reaching outside


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "../elsewhere/x"},
        {"name": "/tmp/x"},
        {"name": ".."},
        {"split_name": "../../train"},
        {"split_filepathTemplate": "../elsewhere/precious.txt{SHARD_INDEX}"},
        {"split_filepathTemplate": "/abs/{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"},
        {"split_filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}"},
        {"split_shardLengths": ["-5"]},
        {"split_shardLengths": ["3", "x"]},
    ],
    ids=lambda c: repr(c),
)
def test_names_and_counts_that_reach_outside_are_refused_everywhere(dataset, outside, changes):
    _edit_info(dataset, **changes)
    with pytest.raises(RLDSWriterError, match="dataset_info.json"):
        rlds_writer.open_dataset(dataset)
    with pytest.raises(RLDSWriterError, match="dataset_info.json"):
        rlds_writer.maintain.info(dataset)
    with pytest.raises(RLDSWriterError, match="dataset_info.json"):
        rlds_writer.recover(dataset)
    for move in (False, True):
        with pytest.raises(RLDSWriterError, match="dataset_info.json"):
            rlds_writer.merge([dataset], dataset.parent / f"merged-{move}", move=move)
    _untouched(outside)
    assert len(list(dataset.glob("*.tfrecord-*"))) == 4


def test_merge_move_never_deletes_a_file_outside_the_source(dataset, outside, tmp_path):
    # The classic attack: the dataset's name leads its shard names outside.
    rel = os.path.relpath(outside.parent, dataset)
    _edit_info(dataset, name=f"{rel}/precious")
    with pytest.raises(RLDSWriterError):
        rlds_writer.merge([dataset], tmp_path / "merged", move=True)
    _untouched(outside)


def test_a_crafted_merge_journal_cannot_move_outside_files(dataset, outside, tmp_path):
    dest = tmp_path / "merged"
    dest.mkdir()
    plan = {
        "journal_version": 1,
        "sources": [os.fspath(dataset)],
        "move": True,
        "steps": [{"src": os.fspath(outside), "dst": "x.tfrecord-00000", "size": 1}],
        "splits": {},
        "dataset_info": {},
        "files": {},
        "metadata": None,
    }
    (dest / layout.MERGE_JOURNAL).write_text(json.dumps(plan))
    with pytest.raises(RLDSWriterError, match="outside"):
        rlds_writer.merge([dataset], dest, move=True)
    _untouched(outside)


# ------------------------------------------------------------- crafted records


def _record_offsets(path):
    return [offset for offset, _ in tfrecord.scan(path).spans]


def _forge_length(path, record, length):
    """Gives record `record` a length field with a valid CRC (a crafted, not a torn file)."""
    offset = _record_offsets(path)[record]
    data = bytearray(path.read_bytes())
    header = struct.pack("<Q", length)
    data[offset : offset + 12] = header + struct.pack("<I", tfrecord.masked_crc32c(header))
    path.write_bytes(bytes(data))
    return offset


@pytest.mark.parametrize("length", [2**40, 2**60, 2**64 - 1])
def test_a_huge_length_field_is_a_corrupt_record_not_a_memory_error(dataset, length):
    offset = _forge_length(_shard(dataset, 1), 1, length)
    episodes = rlds_writer.open_dataset(dataset)["train"]
    with pytest.raises(CorruptRecordError) as e:
        list(episodes)
    assert e.value.offset == offset and e.value.index == 1
    assert "rlds-writer recover" in str(e.value)
    skipping = rlds_writer.open_dataset(dataset, on_corrupt="skip")["train"]
    assert len(list(skipping)) == 8  # records 1 and 2 of that shard are behind the break
    problems = rlds_writer.maintain.info(dataset)["problems"]
    assert any(f"record 1 at byte offset {offset}" in p for p in problems)


def test_one_flipped_length_bit_costs_one_record_not_the_rest_of_the_shard(dataset):
    shard = _shard(dataset, 0)  # episodes 0, 1, 2: a closed shard
    offset = _record_offsets(shard)[0]
    data = bytearray(shard.read_bytes())
    data[offset + 3] ^= 0x40
    damaged = bytes(data)
    shard.write_bytes(damaged)
    report = rlds_writer.recover(dataset)
    assert report.splits["train"] == [2, 3, 3, 1]
    assert crash_child.check_records(dataset) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    (kept,) = [p for p in dataset.iterdir() if p.name.startswith(".corrupt-")]
    assert kept.read_bytes() == damaged  # no byte deleted without a copy
    assert crash_child.check_loaded(dataset) == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_every_tool_reports_one_corruption_at_the_same_place(dataset):
    shard = _shard(dataset, 1)
    offset = _record_offsets(shard)[1]
    data = bytearray(shard.read_bytes())
    data[offset + tfrecord.HEADER_SIZE + 10] ^= 0x01  # data CRC no longer matches
    shard.write_bytes(bytes(data))
    where = f"{shard.name}: record 1 at byte offset {offset} is corrupt: data CRC mismatch"
    with pytest.raises(CorruptRecordError) as e:
        list(rlds_writer.open_dataset(dataset)["train"])
    assert where in str(e.value)
    assert any(where in p for p in rlds_writer.maintain.info(dataset)["problems"])
    violations = rlds_writer.maintain.validate(dataset)["violations"]
    assert any(where in v["message"] for v in violations), violations
    report = rlds_writer.recover(dataset, dry_run=True)
    (acted,) = [s for s in report.shards if s.actions != ["ok"]]
    assert acted.file == shard.name and f"at byte {offset}" in " ".join(acted.detail)


def test_a_crafted_index_cache_is_not_trusted(dataset):
    reader = rlds_writer.open_dataset(dataset, index_cache="disk")
    expected = [int(e["episode_id"]) for e in reader["train"]]
    random_access = [int(reader["train"][i]["episode_id"]) for i in range(10)]
    assert random_access == expected
    # Rotate every cached offset list; keep the file stats so the cache "matches".
    import numpy as np

    for cache in (dataset / ".rlds_reader_index").iterdir():
        with np.load(cache) as z:
            content = {k: z[k] for k in z.files}
        content["offsets"] = np.roll(content["offsets"], 1)
        with open(cache, "wb") as f:
            np.savez(f, **content)
    again = rlds_writer.open_dataset(dataset, index_cache="disk")["train"]
    assert [int(again[i]["episode_id"]) for i in range(10)] == expected


# ------------------------------------------------------------- crafted features


def _edit_features(dataset, edit):
    path = dataset / layout.FEATURES
    features = json.loads(path.read_text())
    edit(features["featuresDict"]["features"]["steps"]["sequence"]["feature"])
    path.write_text(json.dumps(features))


def _observation(steps):
    return steps["featuresDict"]["features"]["observation"]["tensor"]


@pytest.mark.parametrize("dims", [["4294967296", "4294967296"], ["0", "5"], ["-7"]])
def test_a_crafted_feature_shape_is_refused_before_tensorflow_sees_it(dataset, dims):
    _edit_features(dataset, lambda steps: _observation(steps)["shape"].update(dimensions=dims))
    for call in (
        rlds_writer.maintain.validate,
        rlds_writer.maintain.compute_statistics,
        rlds_writer.open_dataset,
    ):
        with pytest.raises(RLDSWriterError, match="features.json.*shape"):
            call(dataset)


def test_a_features_json_nested_without_end_is_refused(dataset):
    leaf = '{"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor"}'
    deep = '{"featuresDict": {"features": {"x": ' * 5000 + leaf + "}}}" * 5000
    path = dataset / layout.FEATURES
    text = path.read_text()
    path.write_text(text.replace('"observation":', f'"deep": {deep}, "observation":', 1))
    for call in (rlds_writer.open_dataset, rlds_writer.maintain.validate):
        with pytest.raises(RLDSWriterError, match="features.json"):
            call(dataset)


# Slow: a child process, memory measured.
@pytest.mark.slow
def test_a_zlib_bomb_is_refused_within_bounded_memory(tmp_path):
    import resource
    import zlib

    import numpy as np
    import tensorflow_datasets as tfds

    config = rlds_writer.DatasetConfig(
        name="bomb",
        observation_info=tfds.features.Tensor(shape=(4,), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        step_metadata_info={
            "blob": tfds.features.Tensor(shape=(None,), dtype=np.uint8, encoding="zlib")
        },
    )
    backend = rlds_writer.TFDSBackendWriter(tmp_path / "ds", config)
    obs = np.zeros(4, np.float32)
    backend.begin_episode(obs, {"blob": np.zeros(8, np.uint8)})
    backend.add_step(0, 0.0, 1.0, obs, {"blob": np.zeros(8, np.uint8)})
    backend.end_episode(terminated=True)
    backend.close()
    # Swap the stored value for 1.5 MB that inflates to 1.5 GB, with a valid CRC.
    shard = next((tmp_path / "ds").glob("bomb-train.tfrecord-*"))
    record = bytearray(next(tfrecord.iter_records(open(shard, "rb")))[1])
    small = zlib.compress(np.zeros(8, np.uint8).tobytes())
    bomb = zlib.compress(bytes(1_500_000_000), 9)
    assert small in record
    assert len(bomb) < 2_000_000
    # Same length prefix trick: replace inside a rebuilt example.
    from rlds_writer.store.features import wire

    located = wire.parse_example(bytes(record))
    assert "steps/blob" in located
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    forged = _replace_bytes_value(bytes(record), small, bomb)
    shard.write_bytes(tfrecord.frame(forged))
    with pytest.raises(RLDSWriterError, match="steps/blob.*inflates"):
        list(rlds_writer.open_dataset(tmp_path / "ds")["train"])
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 400, grown_mb  # the 1.5 GB it would inflate to is never held


def _replace_bytes_value(example: bytes, old: bytes, new: bytes) -> bytes:
    """Rebuilds a tf.train.Example with one bytes value replaced (lengths re-encoded)."""
    from tensorflow.core.example import example_pb2

    parsed = example_pb2.Example.FromString(example)
    for feature in parsed.features.feature.values():
        values = feature.bytes_list.value
        for i, value in enumerate(values):
            if value == old:
                values[i] = new
                return parsed.SerializeToString()
    raise AssertionError("value not found")
