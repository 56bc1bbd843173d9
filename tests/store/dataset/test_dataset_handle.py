"""`Dataset`: a dataset directory opened once, its JSON parsed and checked once."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers_core import assert_same

import rlds_writer
from rlds_writer.errors import IncompatibleDatasetError, NotADatasetError
from rlds_writer.maintain import field_statistics, statistics
from rlds_writer.maintain.summary import info
from rlds_writer.store.dataset import Dataset, open_handle


def test_open_reads_the_listing_features_and_metadata(catch):
    dataset = Dataset.open(catch)
    assert dataset.path == str(catch)
    assert dataset.is_local
    assert dataset.name == "rlds_dataset"
    assert dataset.file_format == "tfrecord"
    assert list(dataset.splits) == ["train"]
    listing = dataset.splits["train"]
    assert listing.num_episodes == 2
    assert dataset.shard_files("train") == {
        i: listing.shard_name(i) for i in range(listing.num_shards)
    }
    assert dataset.metadata == json.loads((catch / "metadata.json").read_text())
    assert [leaf.key for leaf in dataset.features.step_leaves][:2] == [
        "steps/action",
        "steps/discount",
    ]
    assert open_handle(dataset) is dataset
    assert "train=2" in repr(dataset)


def test_no_tool_reads_the_json_again_once_the_dataset_is_open(catch, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(catch, copy)
    dataset = Dataset.open(copy)
    expected = {
        "info": info(copy),
        "stats": statistics.compute_statistics(copy),
        "dims": field_statistics.compute_field_statistics(copy),
        "episodes": list(rlds_writer.open_dataset(copy).episodes("train")),
    }
    # The files change under the open handle: every tool given the handle reads
    # what was opened (only the shard files are listed afresh).
    for name in ("dataset_info.json", "features.json", "metadata.json"):
        (copy / name).write_text("{ not json")
    assert info(dataset) == expected["info"]
    assert statistics.compute_statistics(dataset) == expected["stats"]
    assert field_statistics.compute_field_statistics(dataset) == expected["dims"]
    episodes = list(rlds_writer.open_dataset(dataset).episodes("train"))
    assert_same(episodes, expected["episodes"])
    with pytest.raises(IncompatibleDatasetError):
        Dataset.open(copy)


@pytest.mark.parametrize("name", ["dataset_info.json", "features.json"])
def test_a_malformed_json_file_is_a_one_line_error_naming_it(catch, tmp_path, name):
    copy = tmp_path / "ds"
    shutil.copytree(catch, copy)
    (copy / name).write_text('{"name": "rlds_dataset", "splits": [')
    for tool in (Dataset.open, info, rlds_writer.open_dataset, statistics.compute_statistics):
        with pytest.raises(IncompatibleDatasetError) as raised:
            tool(copy)
        message = str(raised.value)
        assert message.startswith(f"{copy / name}: not ")
        assert "\n" not in message


def test_a_directory_without_a_dataset_is_not_a_dataset(tmp_path):
    with pytest.raises(NotADatasetError, match="it is an empty directory"):
        Dataset.open(tmp_path)
    with pytest.raises(TypeError, match="dataset path or Dataset"):
        open_handle(3)


def test_a_symlinked_shard_is_never_read_through(catch, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(catch, copy)
    victim = tmp_path / "victim"
    shard = copy / Dataset.open(copy).splits["train"].shard_name(0)
    shard.rename(victim)
    shard.symlink_to(victim)
    dataset = Dataset.open(copy)
    with pytest.raises(IncompatibleDatasetError, match="symbolic link"):
        dataset.open_file(shard.name)
    with pytest.raises(IncompatibleDatasetError, match="symbolic link"):
        rlds_writer.open_dataset(dataset).episodes("train")[0]
    with pytest.raises(IncompatibleDatasetError, match="symbolic link"):
        list(rlds_writer.open_dataset(dataset).episodes("train"))
    assert any("unreadable" in p for p in info(dataset)["problems"])


def test_recover_takes_the_handle(catch, tmp_path):
    from rlds_writer.maintain.recover import recover

    copy = tmp_path / "ds"
    shutil.copytree(catch, copy)
    listing = (copy / "dataset_info.json").read_text()
    report = recover(Dataset.open(copy), dry_run=True)
    assert report.summary() == recover(copy, dry_run=True).summary()
    assert (copy / "dataset_info.json").read_text() == listing
