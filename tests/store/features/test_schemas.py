"""Schemas TFDS reads back are recorded and read back; the others are refused up front."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers_core import (
    assert_same,
    load_episodes,
    random_episodes,
    write_with_rlds_writer,
    write_with_tfds,
)

import rlds_writer
from rlds_writer.errors import SpecError


def _oxe_like_config():
    """OXE datasets declare `episode_metadata` even when it is empty."""
    return rlds_writer.DatasetConfig(
        name="oxe_like",
        observation_info={
            "image": tfds.features.Image(shape=(4, 4, 3)),
            "state": tfds.features.Tensor(shape=(3,), dtype=np.float32),
        },
        action_info=tfds.features.Tensor(shape=(7,), dtype=np.float32),
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"language_instruction": tfds.features.Text()},
        episode_metadata_info={
            "episode_metadata": tfds.features.FeaturesDict({}),
            "nested": {"empty": tfds.features.FeaturesDict({}), "flag": np.bool_},
        },
    )


def _our_episodes(path):
    out = []
    for episode in rlds_writer.open_dataset(path).episodes():
        columns = episode.pop("steps")
        from rlds_writer.read.nest import rows

        out.append({**episode, "steps": list(rows(columns))})
    return out


@pytest.mark.parametrize("writer", ["ours", "tfds"])
def test_empty_features_dicts_load_as_empty_dicts_in_tfds_and_our_reader(tmp_path, writer):
    config = _oxe_like_config()
    episodes = random_episodes(config, np.random.default_rng(0), lengths=[1, 3])
    write = write_with_rlds_writer if writer == "ours" else write_with_tfds
    write(tmp_path / "ds", config, episodes)
    from_tfds = load_episodes(tmp_path / "ds")
    assert [e["episode_metadata"] for e in from_tfds] == [{}, {}]
    assert [e["nested"]["empty"] for e in from_tfds] == [{}, {}]
    assert_same(_our_episodes(tmp_path / "ds"), from_tfds)


def test_our_bytes_with_empty_dicts_equal_what_tfds_writes(tmp_path):
    config = _oxe_like_config()
    episodes = random_episodes(config, np.random.default_rng(1), lengths=[2])
    write_with_rlds_writer(tmp_path / "ours", config, episodes)
    write_with_tfds(tmp_path / "tfds", config, episodes)
    assert_same(load_episodes(tmp_path / "ours"), load_episodes(tmp_path / "tfds"))


@pytest.mark.parametrize(
    ("observation_info", "match"),
    [
        (tfds.features.Sequence(np.int64, length=2), r"Sequence\(length=2\).*Tensor\(shape="),
        ({"a": np.float32, "b": tfds.features.FeaturesDict({})}, "empty FeaturesDict inside steps"),
    ],
)
def test_step_features_tfds_cannot_load_are_refused_when_the_writer_is_created(
    tmp_path, observation_info, match
):
    config = rlds_writer.DatasetConfig(
        name="refused", observation_info=observation_info, action_info=np.int64
    )
    with pytest.raises(SpecError, match=match):
        rlds_writer.TFDSBackendWriter(tmp_path / "ds", config)
    assert not (tmp_path / "ds").exists() or not list((tmp_path / "ds").iterdir())


def test_variable_length_sequences_per_step_are_recorded_and_load_in_tfds(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="seq",
        observation_info=tfds.features.Sequence(np.int64),
        action_info=np.int64,
        reward_info=np.float32,
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "ds", config) as backend:
        backend.begin_episode(np.arange(3))
        backend.add_step(1, np.float32(0.5), None, np.arange(5))
        backend.end_episode(terminated=True)
    (episode,) = load_episodes(tmp_path / "ds")
    assert [list(s["observation"]) for s in episode["steps"]] == [[0, 1, 2], [0, 1, 2, 3, 4]]
