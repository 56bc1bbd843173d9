"""Every maintenance tool on datasets TFDS itself wrote (`tfds build` names shards `-of-`).

recover, info, validate, merge, stats and the reader must read them as TFDS
does, and must never reduce the number of episodes TFDS can read. Appending
to them (tests/store/writing/test_append_to_tfds_datasets.py) keeps their shards as they are.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.store.formats.tfrecord import tfrecord

EPISODES = 12


class _TinyRlds(tfds.core.GeneratorBasedBuilder):
    """An RLDS dataset built the way `tfds build` builds one."""

    name = "tiny_rlds"
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "steps": tfds.features.Dataset(
                        {
                            "observation": tfds.features.Tensor(shape=(3,), dtype=np.float32),
                            "action": np.int64,
                            "reward": np.float32,
                            "is_first": np.bool_,
                            "is_last": np.bool_,
                            "is_terminal": np.bool_,
                        }
                    ),
                    "episode_id": np.int64,
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(EPISODES):
            n = 3 + i % 4
            steps = [
                {
                    "observation": np.full(3, i, np.float32),
                    "action": t,
                    "reward": 1.0,
                    "is_first": t == 0,
                    "is_last": t == n - 1,
                    "is_terminal": t == n - 1,
                }
                for t in range(n)
            ]
            yield i, {"episode_id": i, "steps": steps}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    builder = _TinyRlds(data_dir=str(tmp_path_factory.mktemp("tfds")))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
    return builder.data_path


@pytest.fixture
def dataset(built, tmp_path):
    directory = tmp_path / "tiny"
    shutil.copytree(built, directory)
    return directory


def _tfds_ids(path):
    ds = tfds.builder_from_directory(str(path)).as_dataset(split="train")
    return sorted(int(e["episode_id"]) for e in ds)


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_the_fixture_has_tfds_default_shard_names(dataset):
    names = sorted(p.name for p in dataset.glob("*.tfrecord-*"))
    assert names == [f"tiny_rlds-train.tfrecord-0000{i}-of-00003" for i in range(3)]


def test_recover_changes_nothing_on_a_tfds_built_dataset(dataset):
    before = _snapshot(dataset)
    report = rlds_writer.recover(dataset)
    assert not report.changed, report.summary()
    assert report.episodes == {"train": EPISODES}
    assert _snapshot(dataset) == before
    assert _tfds_ids(dataset) == list(range(EPISODES))


def test_info_and_validate_find_a_tfds_built_dataset_sound(dataset):
    summary = rlds_writer.maintain.info(dataset)
    assert summary["problems"] == []
    assert summary["total"]["episodes"] == EPISODES
    assert rlds_writer.maintain.validate(dataset)["ok"]


def test_the_reader_and_stats_read_every_episode(dataset):
    episodes = rlds_writer.open_dataset(dataset)["train"]
    assert sorted(int(e["episode_id"]) for e in episodes) == list(range(EPISODES))
    stats = rlds_writer.maintain.compute_statistics(dataset)
    assert stats["splits"]["train"]["episodes"] == EPISODES


@pytest.mark.parametrize("move", [False, True])
def test_merge_of_tfds_built_datasets_keeps_every_episode(built, tmp_path, move):
    sources = []
    for i in range(2):
        sources.append(tmp_path / f"src{i}")
        shutil.copytree(built, sources[-1])
    report = rlds_writer.merge(sources, tmp_path / "merged", move=move)
    assert report.episodes == {"train": 2 * EPISODES}
    assert _tfds_ids(tmp_path / "merged") == sorted(list(range(EPISODES)) * 2)


def test_a_corrupt_record_in_a_tfds_built_shard_costs_only_that_record(dataset):
    shard = dataset / "tiny_rlds-train.tfrecord-00001-of-00003"
    spans = tfrecord.scan(shard).spans
    data = bytearray(shard.read_bytes())
    offset, _ = spans[1]
    data[offset + tfrecord.HEADER_SIZE + 5] ^= 0x20
    shard.write_bytes(bytes(data))
    report = rlds_writer.recover(dataset)
    assert report.episodes == {"train": EPISODES - 1}
    assert any(p.name.startswith(".corrupt-") for p in dataset.iterdir())
    # The names still follow the split's template, so TFDS finds every shard.
    assert len(_tfds_ids(dataset)) == EPISODES - 1


def test_overwrite_of_a_tfds_built_dataset_leaves_none_of_its_shards(dataset):
    config = rlds_writer.DatasetConfig(
        name="tiny_rlds",
        observation_info=tfds.features.Tensor(shape=(3,), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
    )
    rlds_writer.store.DatasetWriter(dataset, config, mode="overwrite").close()
    assert not list(dataset.glob("*-of-*"))
    assert rlds_writer.open_dataset(dataset).splits == {"train": 0}
