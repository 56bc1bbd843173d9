"""Shards, dataset_info.json, metadata.json and directory modes match TFDS's own writer."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from dm_env import specs
from helpers_core import (
    assert_same,
    load_episodes,
    load_episodes_from_data_source,
    random_episodes,
    write_with_rlds_writer,
    write_with_tfds,
)

import rlds_writer
from rlds_writer.envs.catch import Catch

F32 = np.float32


def _config(name="shard"):
    import tensorflow_datasets as tfds

    return rlds_writer.DatasetConfig(
        name=name,
        observation_info=tfds.features.Tensor(shape=(2,), dtype=F32),
        action_info=np.int64,
        reward_info=F32,
        discount_info=F32,
        episode_metadata_info={"k": np.int64},
    )


def _episodes(n, seed=0):
    return random_episodes(
        _config(), np.random.default_rng(seed), lengths=[1 + i % 4 for i in range(n)]
    )


def _files(path):
    return sorted(p for p in os.listdir(path) if not p.startswith("."))


def _json(path, name="dataset_info.json"):
    with open(os.path.join(path, name)) as f:
        return json.load(f)


@pytest.mark.parametrize(
    "file_format,split,version",
    [("tfrecord", "train", "0.0.1"), ("array_record", "validation", "1.2.3")],
)
def test_shards_and_dataset_info_are_exactly_what_tfds_sequential_writer_writes(
    tmp_path, file_format, split, version
):
    episodes = _episodes(7)
    ours, ref = tmp_path / "ours", tmp_path / "tfds"
    write_with_rlds_writer(
        ours,
        _config(),
        episodes,
        max_episodes_per_file=3,
        file_format=file_format,
        split_name=split,
        version=version,
        store_ds_metadata=False,
    )
    write_with_tfds(
        ref,
        _config(),
        episodes,
        max_episodes_per_file=3,
        file_format=file_format,
        split=split,
        version=version,
    )
    shards = [f"shard-{split}.{file_format}-{i:05d}" for i in range(3)]
    assert _files(ours) == _files(ref) == sorted(["dataset_info.json", "features.json", *shards])
    info = _json(ours)
    assert info == _json(ref)
    (entry,) = info["splits"]
    assert entry["shardLengths"] == ["3", "3", "1"]
    assert entry["filepathTemplate"] == "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"
    assert (info["fileFormat"], info["version"]) == (file_format, version)
    assert _json(ours, "features.json") == _json(ref, "features.json")
    if file_format == "tfrecord":
        assert_same(load_episodes(ours, split), load_episodes(ref, split))
    else:
        assert_same(
            load_episodes_from_data_source(ours, split), load_episodes_from_data_source(ref, split)
        )


def test_array_record_loads_through_as_data_source_in_any_order(tmp_path):
    import tensorflow_datasets as tfds

    episodes = _episodes(5, seed=1)
    write_with_rlds_writer(
        tmp_path, _config(), episodes, max_episodes_per_file=2, file_format="array_record"
    )
    builder = tfds.builder_from_directory(os.fspath(tmp_path))
    source = builder.as_data_source(split="train")
    assert len(source) == 5
    for i in [4, 0, 2]:
        episode = source[i]
        assert episode["k"] == episodes[i].episode_metadata["k"]
        steps = list(episode["steps"])
        assert len(steps) == len(episodes[i].observations)
        observations = np.array([s["observation"] for s in steps])
        assert_same(observations, np.array(episodes[i].observations))
        assert [bool(s["is_last"]) for s in steps][-1]
    # TFDS has no tf.data reader for ArrayRecord, for its own datasets too.
    with pytest.raises(NotImplementedError, match="as_data_source"):
        builder.as_dataset(split="train")


def test_tfrecord_loads_through_as_dataset_and_builder_from_directories(tmp_path):
    import tensorflow_datasets as tfds

    write_with_rlds_writer(tmp_path / "a", _config(), _episodes(3, seed=4), max_episodes_per_file=2)
    write_with_rlds_writer(tmp_path / "b", _config(), _episodes(2, seed=5))
    builder = tfds.builder_from_directories([os.fspath(tmp_path / "a"), os.fspath(tmp_path / "b")])
    assert builder.info.splits["train"].num_examples == 5
    assert len(list(builder.as_dataset(split="train"))) == 5


def test_metadata_json_is_json_safe_and_records_env_specs(tmp_path):
    import tensorflow_datasets as tfds

    metadata = {
        "agent": "random",
        "lr": np.float32(0.5),
        "steps": np.int64(3),
        "flag": np.bool_(True),
        "grid": np.arange(4, dtype=np.uint8).reshape(2, 2),
        "pair": (1, "a", np.float64(2.5)),
        "spec": specs.BoundedArray((2,), np.float32, minimum=-1.0, maximum=[1.0, 2.0], name="b"),
        "dtype": np.float32,
        "raw": b"bytes",
        "nested": {"x": {"y": [np.int8(1), None]}, 3: "int key"},
    }
    env = Catch(rows=4, columns=3, seed=0)
    backend = rlds_writer.TFDSBackendWriter(
        tmp_path,
        rlds_writer.config_from_env(env, "catch"),
        store_ds_metadata=True,
        ds_metadata={"source": "test"},
    )
    with rlds_writer.EnvLogger(env, backend, metadata=metadata) as logged:
        timestep = logged.reset()
        while not timestep.last():
            timestep = logged.step(1)
    stored = _json(tmp_path, "metadata.json")
    assert stored["source"] == "test"
    for key, value in {
        "agent": "random",
        "lr": 0.5,
        "steps": 3,
        "flag": True,
        "grid": [[0, 1], [2, 3]],
        "pair": [1, "a", 2.5],
        "spec": {
            "spec": "BoundedArray",
            "shape": [2],
            "dtype": "float32",
            "name": "b",
            "minimum": -1.0,
            "maximum": [1.0, 2.0],
        },
        "dtype": "float32",
        "raw": "bytes",
        "nested": {"x": {"y": [1, None]}, "3": "int key"},
    }.items():
        assert stored[key] == value, key
    env_specs = stored["env_specs"]
    assert env_specs["observation_spec"] == {
        "spec": "Array",
        "shape": [4, 3],
        "dtype": "float32",
        "name": "board",
    }
    assert env_specs["action_spec"] == {
        "spec": "DiscreteArray",
        "shape": [],
        "dtype": "int64",
        "name": "action",
        "minimum": 0,
        "maximum": 2,
        "num_values": 3,
    }
    assert env_specs["discount_spec"]["spec"] == "BoundedArray"
    assert env_specs["reward_spec"]["dtype"] == "float32"  # Catch declares float32
    # TFDS reads it back as the dataset's metadata.
    builder = tfds.builder_from_directory(os.fspath(tmp_path))
    assert builder.info.metadata["agent"] == "random"
    assert builder.info.metadata["env_specs"]["action_spec"]["num_values"] == 3
    assert len(load_episodes(tmp_path)) == 1


def test_store_ds_metadata_false_writes_no_metadata_json(tmp_path):
    env = Catch(rows=3, columns=3, seed=0)
    backend = rlds_writer.TFDSBackendWriter(
        tmp_path,
        rlds_writer.config_from_env(env, "catch"),
        store_ds_metadata=False,
        ds_metadata={"source": "test"},
    )
    with rlds_writer.EnvLogger(env, backend, metadata={"agent": "random"}) as logged:
        logged.reset()
        logged.step(0)
    assert "metadata.json" not in _files(tmp_path)
    assert len(load_episodes(tmp_path)) == 1


def test_env_logger_on_a_directory_stores_specs_and_metadata_and_keeps_old_keys_on_append(
    tmp_path,
):
    """`EnvLogger(data_directory=...)` has `metadata.json` (its specs, the user's
    metadata and `ds_metadata`) from its creation on; on append the keys earlier
    runs wrote stay; `store_ds_metadata=False` writes none."""

    def record(path, **kwargs):
        env = Catch(rows=3, columns=3, seed=0)
        with rlds_writer.EnvLogger(env, data_directory=str(path), **kwargs) as logged:
            first = _json(path, "metadata.json") if os.path.exists(path / "metadata.json") else None
            logged.reset()
            logged.step(0)
        return first

    first = record(tmp_path / "d", metadata={"agent": "random"}, ds_metadata={"run": 1})
    assert first["agent"] == "random" and first["run"] == 1
    assert first["env_specs"]["action_spec"]["num_values"] == 3
    assert _json(tmp_path / "d", "metadata.json") == first  # not rewritten after
    record(tmp_path / "d", metadata={"agent": "greedy"}, mode="append")
    again = _json(tmp_path / "d", "metadata.json")
    assert again == {**first, "agent": "greedy"}  # `run` kept from the first run
    assert len(load_episodes(tmp_path / "d")) == 2
    record(tmp_path / "none", metadata={"agent": "random"}, store_ds_metadata=False)
    assert "metadata.json" not in _files(tmp_path / "none")
    assert len(load_episodes(tmp_path / "none")) == 1


def test_existing_dataset_without_mode_raises_and_is_left_untouched(tmp_path):
    write_with_rlds_writer(tmp_path, _config(), _episodes(2), max_episodes_per_file=1)
    before = {name: (tmp_path / name).read_bytes() for name in _files(tmp_path)}
    with pytest.raises(
        rlds_writer.errors.DatasetExistsError, match="mode='append'.*mode='overwrite'"
    ):
        rlds_writer.TFDSBackendWriter(tmp_path, _config())
    with pytest.raises(FileExistsError):  # DatasetExistsError is a FileExistsError
        rlds_writer.EnvLogger(Catch(rows=3), data_directory=os.fspath(tmp_path))
    assert {name: (tmp_path / name).read_bytes() for name in _files(tmp_path)} == before
    # The failed attempts released the directory: an explicit mode works.
    rlds_writer.TFDSBackendWriter(tmp_path, _config(), mode="append").close()


def test_overwrite_replaces_the_dataset(tmp_path):
    import tensorflow_datasets as tfds

    write_with_rlds_writer(tmp_path, _config(), _episodes(5), max_episodes_per_file=2)
    assert len(load_episodes(tmp_path)) == 5
    other = rlds_writer.DatasetConfig(
        name="shard",
        observation_info=tfds.features.Text(),
        action_info=np.int64,
    )
    with rlds_writer.TFDSBackendWriter(tmp_path, other, mode="overwrite") as backend:
        backend.begin_episode("only")
        backend.end_episode(terminated=False)
    assert _files(tmp_path) == ["dataset_info.json", "features.json", "shard-train.tfrecord-00000"]
    (episode,) = load_episodes(tmp_path)
    assert episode["steps"][0]["observation"] == b"only"


def test_append_continues_the_shard_sequence_and_keeps_old_episodes(tmp_path):
    first, second = _episodes(3, seed=2), _episodes(3, seed=3)
    write_with_rlds_writer(tmp_path, _config(), first, max_episodes_per_file=2)
    write_with_rlds_writer(tmp_path, _config(), second, max_episodes_per_file=2, mode="append")
    (entry,) = _json(tmp_path)["splits"]
    # Like TFDS's SequentialWriter(overwrite=False): new episodes go to new shards.
    assert entry["shardLengths"] == ["2", "1", "2", "1"]
    assert _files(tmp_path)[-4:] == [f"shard-train.tfrecord-{i:05d}" for i in range(4)]
    ref = tmp_path.parent / "tfds_reference"
    write_with_tfds(ref, _config(), first + second)
    assert_same(load_episodes(tmp_path), load_episodes(ref))


def test_append_with_other_features_is_refused(tmp_path):
    import tensorflow_datasets as tfds

    write_with_rlds_writer(tmp_path, _config(), _episodes(1))
    other = _config()
    other.observation_info = tfds.features.Tensor(shape=(3,), dtype=F32)
    with pytest.raises(rlds_writer.errors.IncompatibleDatasetError, match="observation"):
        rlds_writer.TFDSBackendWriter(tmp_path, other, mode="append")
    assert len(load_episodes(tmp_path)) == 1


def test_append_to_another_split_keeps_both_splits_loadable(tmp_path):
    train, test = _episodes(3, seed=6), _episodes(2, seed=7)
    write_with_rlds_writer(tmp_path, _config(), train, max_episodes_per_file=2)
    write_with_rlds_writer(tmp_path, _config(), test, split_name="test", mode="append")
    splits = {s["name"]: s["shardLengths"] for s in _json(tmp_path)["splits"]}
    assert splits == {"train": ["2", "1"], "test": ["2"]}
    assert "shard-test.tfrecord-00000" in _files(tmp_path)
    ref = tmp_path.parent / "tfds_reference"
    write_with_tfds(ref / "train", _config(), train)
    write_with_tfds(ref / "test", _config(), test, split="test")
    assert_same(load_episodes(tmp_path, "train"), load_episodes(ref / "train", "train"))
    assert_same(load_episodes(tmp_path, "test"), load_episodes(ref / "test", "test"))
