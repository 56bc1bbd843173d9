"""Each recorded episode says why it ended: the env (terminated, truncated) or the recorder."""

from __future__ import annotations

import json

import dm_env
import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.errors import StepValueError


class _InfoEnv(gym.Wrapper):
    """CartPole whose info carries `n`; `n` becomes a string (refused) when asked."""

    bad_at = -1

    def reset(self, **kwargs):
        self.t = 0
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "n": 0}

    def step(self, action):
        self.t += 1
        obs, r, te, tr, info = self.env.step(action)
        return obs, r, te, tr, {**info, "n": "bad" if self.t == self.bad_at else self.t}


def _record_every_ending(path):
    """Records, in order: terminated, truncated, reset mid-episode, refused value, close."""
    inner = _InfoEnv(gym.make("CartPole-v1", max_episode_steps=12))
    env = rlds_writer.RecordRLDS(inner, path, name="ends", info_keys=["n"])
    env.reset(seed=0)
    terminated = truncated = False
    while not (terminated or truncated):  # always push right: the pole falls (terminated)
        _, _, terminated, truncated, _ = env.step(1)
    assert terminated
    env.reset(seed=1)
    for i in range(12):  # alternating pushes keep the pole up until the time limit
        _, _, terminated, truncated, _ = env.step(i % 2)
    assert truncated and not terminated
    env.reset(seed=2)
    env.step(0)
    env.reset(seed=3)  # mid-episode: the previous one is cut short
    inner.bad_at = 2
    env.step(0)
    with pytest.raises(StepValueError, match="cut short"):
        env.step(1)
    inner.bad_at = -1
    env.reset(seed=4)
    env.step(0)
    env.close()  # with an episode open


EXPECTED = [b"terminated", b"truncated", b"cut_short", b"cut_short", b"cut_short"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("ends") / "ds"
    _record_every_ending(path)
    return path


def test_end_reason_is_a_declared_text_feature_tfds_loads(dataset):
    features = json.loads((dataset / "features.json").read_text())
    assert "end_reason" in json.dumps(features)
    builder = tfds.builder_from_directory(str(dataset))
    assert isinstance(builder.info.features["end_reason"], tfds.features.Text)
    got = [e["end_reason"] for e in tfds.as_numpy(builder.as_dataset(split="train"))]
    assert got == EXPECTED


def test_end_reason_agrees_with_the_flags(dataset):
    for episode in rlds_writer.open_dataset(dataset).episodes():
        last_terminal = bool(episode["steps"]["is_terminal"][-1])
        assert last_terminal == (episode["end_reason"] == b"terminated")


def test_reader_drops_cut_short_episodes_when_asked(dataset):
    episodes = rlds_writer.open_dataset(dataset).episodes()
    assert len(list(episodes)) == 5
    assert [e["end_reason"] for e in episodes.without_cut_short()] == EXPECTED[:2]
    kept = list(episodes.transitions(cut_short="drop"))
    lengths = [len(e["steps"]["is_first"]) - 1 for e in episodes.without_cut_short()]
    assert len(kept) == sum(lengths)


def test_stats_count_cut_short_apart_from_truncated(dataset, capsys):
    stats = rlds_writer.maintain.compute_statistics(dataset)["splits"]["train"]
    assert (stats["terminated"], stats["truncated"], stats["cut_short"]) == (1, 1, 3)
    from rlds_writer.cli.main import main

    assert main(["stats", str(dataset)]) == 0
    assert "1 terminated, 1 truncated, 3 cut short" in capsys.readouterr().out


def test_datasets_without_the_field_report_no_cut_short_count(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="plain", observation_info=tfds.features.Tensor(shape=(5, 5), dtype=np.float32),
        action_info=np.int64, reward_info=np.float32, discount_info=np.float32,
    )  # fmt: skip
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(rows=5, columns=5, seed=0),
        rlds_writer.TFDSBackendWriter(tmp_path / "ds", config),
    )
    ts = env.reset()
    while not ts.last():
        ts = env.step(1)
    env.close()
    episode = next(iter(rlds_writer.open_dataset(tmp_path / "ds").episodes()))
    assert "end_reason" not in episode  # the user's DatasetConfig is kept as given
    assert (
        rlds_writer.maintain.compute_statistics(tmp_path / "ds")["splits"]["train"]["cut_short"]
        is None
    )


def test_envlogger_fills_end_reason_when_the_config_declares_it(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="declared", observation_info=tfds.features.Tensor(shape=(5, 5), dtype=np.float32),
        action_info=np.int64, reward_info=np.float32, discount_info=np.float32,
        episode_metadata_info={"end_reason": tfds.features.Text()},
    )  # fmt: skip
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(rows=5, columns=5, seed=0),
        rlds_writer.TFDSBackendWriter(tmp_path / "ds", config),
    )
    ts = env.reset()
    while not ts.last():
        ts = env.step(1)
    assert ts.step_type == dm_env.StepType.LAST
    env.reset()
    env.step(0)
    env.close()
    got = [e["end_reason"] for e in rlds_writer.open_dataset(tmp_path / "ds").episodes()]
    assert got == [b"terminated", b"cut_short"]


def test_cli_record_writes_end_reason(tmp_path):
    from rlds_writer.cli.main import main

    assert main(["record", "--output", str(tmp_path / "c"), "--episodes", "3"]) == 0
    got = [e["end_reason"] for e in rlds_writer.open_dataset(tmp_path / "c").episodes()]
    assert got == [b"terminated"] * 3
