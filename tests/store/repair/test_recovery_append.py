"""mode="append": recover first, continue after the last real shard, never overwrite a file."""

from __future__ import annotations

import json

import crash_child
import numpy as np
import pytest
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.errors import DatasetExistsError, IncompatibleDatasetError
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage import file_io
from rlds_writer.store.writing import split_shards

NAME = crash_child.NAME


def _shard(directory, index, file_format="tfrecord"):
    return directory / layout.shard_name(NAME, "train", file_format, index)


def test_append_after_a_crash_lists_orphans_and_continues_after_the_last_shard(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(4), max_episodes_per_file=3)
    stale_info = (directory / layout.DATASET_INFO).read_text()
    crash_child.write_dataset(directory, range(4, 8), max_episodes_per_file=3, mode="append")
    # A crash: dataset_info.json lists shards [3, 1]; files hold [3, 1, 3, 1], and
    # the last one ends in a torn record.
    (directory / layout.DATASET_INFO).write_text(stale_info)
    last = _shard(directory, 3)
    with open(last, "ab") as f:
        f.write(b"\x07" * 30)
    kept_bytes = {i: _shard(directory, i).read_bytes() for i in range(3)}
    crash_child.write_dataset(directory, range(8, 12), max_episodes_per_file=3, mode="append")
    lengths = layout.read_splits(file_io.read_json(directory / layout.DATASET_INFO))["train"][0]
    assert lengths == [3, 1, 3, 1, 3, 1]
    for i, data in kept_bytes.items():  # earlier shard files untouched
        assert _shard(directory, i).read_bytes() == data
    assert crash_child.check_records(directory) == list(range(12))
    assert crash_child.check_loaded(directory) == list(range(12))


def test_append_keeps_earlier_metadata_and_adds_new_keys(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(2), metadata={"run": 1, "agent": "a"})
    crash_child.write_dataset(directory, range(2, 3), metadata={"run": 2}, mode="append")
    assert file_io.read_json(directory / layout.METADATA) == {"run": 2, "agent": "a"}


def test_append_then_update_metadata_keeps_earlier_keys(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(2), metadata={"run": 1, "agent": "a"})
    backend = rlds_writer.TFDSBackendWriter(directory, crash_child.dataset_config(), mode="append")
    backend.update_metadata({"run": 2, "env_specs": {"obs": [6, 4]}})  # as EnvLogger does
    backend.close()
    assert file_io.read_json(directory / layout.METADATA) == {
        "run": 2,
        "agent": "a",
        "env_specs": {"obs": [6, 4]},
    }


def test_append_with_other_features_is_refused_and_shows_the_difference(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(2))
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    config = rlds_writer.DatasetConfig(
        name=NAME,
        observation_info=tfds.features.Tensor(shape=(6, 5), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float64,
        discount_info=np.float32,
        step_metadata_info={"t": np.int32},
        episode_metadata_info={"episode_id": np.int64},
    )
    with pytest.raises(IncompatibleDatasetError) as caught:
        rlds_writer.TFDSBackendWriter(directory, config, mode="append")
    message = str(caught.value)
    assert "observation/tensor/shape/dimensions: dataset has ['6', '4'], writer has ['6', '5']" in (
        message
    )
    assert "reward/tensor/dtype: dataset has 'float32', writer has 'float64'" in message
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert not (directory / layout.LOCK).exists()  # released on refusal


def test_append_under_another_name_or_format_is_refused(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(2))
    with pytest.raises(IncompatibleDatasetError, match="name: dataset has 'catch_crash'"):
        rlds_writer.TFDSBackendWriter(
            directory, crash_child.dataset_config(), mode="append", name="other"
        )
    with pytest.raises(IncompatibleDatasetError, match="file_format"):
        rlds_writer.TFDSBackendWriter(
            directory, crash_child.dataset_config(), mode="append", file_format="array_record"
        )


def test_existing_dataset_needs_an_explicit_mode(tmp_path):
    directory = tmp_path / "ds"
    crash_child.write_dataset(directory, range(1))
    with pytest.raises(DatasetExistsError, match="mode='append'"):
        crash_child.write_dataset(directory, range(1, 2))


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_a_shard_file_is_never_overwritten(tmp_path, file_format):
    path = tmp_path / layout.shard_name(NAME, "train", file_format, 0)
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        split_shards.open_shard(path, file_format, False)
    assert path.read_bytes() == b"precious"


def test_array_record_flush_makes_episodes_durable_by_closing_the_shard(tmp_path):
    directory = tmp_path / "ds"
    backend = rlds_writer.TFDSBackendWriter(
        directory, crash_child.dataset_config(), file_format="array_record"
    )
    try:
        crash_child.record_episode(backend, 0)
        crash_child.record_episode(backend, 1)
        backend.flush()
        # Listed, closed, readable now (not only at close) ...
        info = json.loads((directory / layout.DATASET_INFO).read_text())
        assert layout.read_splits(info)["train"][0] == [2]
        assert crash_child.check_records(directory) == [0, 1]
        crash_child.record_episode(backend, 2)
        backend.flush()
    finally:
        backend.close()
    # ... and the next episodes went to the next shard.
    assert crash_child.check_loaded(directory) == [0, 1, 2]
    assert sorted(layout.list_shard_files(directory, NAME, "train", "array_record")) == [0, 1]
