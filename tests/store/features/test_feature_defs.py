"""Features made without TFDS: the same files, the same records, and no TFDS import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import dm_env
import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds
from dm_env import specs
from google.protobuf import json_format
from gymnasium import spaces
from helpers_core import NUMERIC_DTYPES

import rlds_writer
from rlds_writer.errors import SpecError
from rlds_writer.record import config as config_lib
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.store.features import feature_defs as fd
from rlds_writer.store.writing import dataset_setup
from rlds_writer.store.writing.writer import DatasetWriter


def _every_kind() -> list[object]:
    kinds: list[object] = [fd.Text(), fd.Scalar(np.int64), fd.Scalar(np.bool_)]
    for dtype in NUMERIC_DTYPES:
        for shape in ((), (3,), (2, 3)):
            for encoding in fd.TENSOR_ENCODINGS:
                kinds.append(fd.Tensor(shape, dtype, encoding))
    for channels in (1, 2, 3, 4):
        kinds.append(fd.Image((8, 6, channels), np.uint8, "png"))
        kinds.append(fd.Image((8, 6, channels), np.uint16, "png"))
    kinds.append(fd.Image((8, 6, 1), np.float32, "png"))
    kinds.append(fd.Image((8, 6, 1), np.uint8, "jpeg", 80))
    kinds.append(fd.Image((8, 6, 3), np.uint8, "jpeg"))
    kinds.append(fd.FeaturesDict({}))
    kinds.append(fd.FeaturesDict({"b": fd.Text(), "a": {"z": np.float32, "y": fd.Scalar(np.int8)}}))
    kinds.append(fd.Dataset({"observation": fd.Tensor((2,), np.float32), "is_first": np.bool_}))
    return kinds


@pytest.mark.parametrize("feature", _every_kind(), ids=repr)
def test_every_kind_gives_the_features_json_node_tfds_gives(feature):
    theirs = fd.as_tfds(feature)
    assert json_format.MessageToDict(theirs.to_proto()) == feature.to_json()


def test_own_features_refuse_what_tfds_would_encode_differently():
    with pytest.raises(ValueError):
        fd.Tensor((2,), np.object_)
    with pytest.raises(ValueError):
        fd.Image((8, 8, 3), np.uint16, "jpeg")  # JPEG holds 8 bits
    with pytest.raises(ValueError):
        fd.Image((8, 8, 3), np.float32, "png")  # TFDS bitcasts one channel only
    assert not fd.natively_written({"a": fd.Tensor((0, 3), np.float32)})
    assert not fd.natively_written({"a": tfds.features.Text()})
    assert fd.natively_written({"a": np.float32, "b": {"c": fd.Text()}})


def test_public_builders_still_give_tfds_own_objects():
    image = spaces_lib.feature_from_space(
        spaces.Box(0, 255, (16, 16, 3), np.uint8), image_encoding="jpeg", jpeg_quality=70
    )
    assert isinstance(image, tfds.features.Image) and image.jpeg_quality == 70
    config = spaces_lib.config_from_spaces(spaces.Box(-1, 1, (3,)), spaces.Discrete(2), "x")
    assert type(config) is config_lib.dataset_config_class()
    assert isinstance(config.observation_info, tfds.features.Tensor)
    assert isinstance(config.reward_info, tfds.features.Tensor)
    env_config = rlds_writer.config_from_env(rlds_writer.Catch(seed=0), "x")
    assert isinstance(env_config.observation_info, tfds.features.Tensor)


class _Rich(gym.Env):
    """Observations of every kind a space turns into: images, depth, float64, text."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (16, 16, 3), np.uint8),
                "depth": spaces.Box(0, 9, (16, 16, 1), np.uint16),
                "exact": spaces.Box(-1.0, 1.0, (2,), np.float64),
                "pair": spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(4))),
                "note": spaces.Text(8),
            }
        )
        self.action_space = spaces.Box(-1, 1, (2,), np.float32)
        self._t = 0

    def _obs(self):
        rng = np.random.default_rng(self._t)
        return {
            "image": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8),
            "depth": rng.integers(0, 9, (16, 16, 1), dtype=np.uint16),
            "exact": rng.uniform(-1, 1, 2),
            "pair": (int(self._t % 3), rng.integers(0, 2, 4, dtype=np.int8)),
            "note": "t" * (self._t % 5),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {"speed": 0.0}

    def step(self, action):
        self._t += 1
        return self._obs(), 0.5 * self._t, self._t == 5, False, {"speed": self._t * 1.5}


def _record(directory, mode="error"):
    env = rlds_writer.RecordRLDS(
        _Rich(),
        directory,
        name="rich",
        image_encoding="jpeg",
        jpeg_quality=60,
        info_keys=["speed"],
        metadata={"seed": 7},
        mode=mode,
    )
    env.reset(seed=0)
    for _ in range(12):
        _, _, terminated, truncated, _ = env.step(np.zeros(2, np.float32))
        if terminated or truncated:
            env.reset()
    env.close()


def _files(directory):
    return {
        name: (directory / name).read_bytes()
        for name in sorted(os.listdir(directory))
        if not name.startswith(".")
    }


def _same_files_both_ways(tmp_path, monkeypatch, record) -> None:
    """`record` made with features left as `feature_defs`, then made TFDS's objects: same files."""
    built = []
    build = dataset_setup.build_dataset_info
    monkeypatch.setattr(
        dataset_setup, "build_dataset_info", lambda *a: built.append(a) or build(*a)
    )
    record(tmp_path / "own")
    assert built == []  # TFDS's DatasetInfo was not built
    monkeypatch.setattr(fd, "natively_written", lambda feature: False)
    record(tmp_path / "tfds")
    assert len(built) == 1
    own, theirs = _files(tmp_path / "own"), _files(tmp_path / "tfds")
    assert set(own) == set(theirs) and len(own) >= 4
    for name in own:
        assert own[name] == theirs[name], name


def test_a_recording_made_without_tfds_is_file_for_file_the_one_tfds_objects_make(
    tmp_path, monkeypatch
):
    _same_files_both_ways(tmp_path, monkeypatch, _record)
    loaded = tfds.builder_from_directory(os.fspath(tmp_path / "own"))
    assert loaded.info.features["steps"]["observation"]["image"].encoding_format == "jpeg"
    episodes = list(tfds.as_numpy(loaded.as_dataset(split="train")))
    first = next(iter(episodes[0]["steps"]))
    assert len(episodes) == 3 and first["observation"]["exact"].dtype == np.float64


def test_either_path_appends_to_a_dataset_the_other_made(tmp_path, monkeypatch):
    _record(tmp_path / "ds")
    with monkeypatch.context() as patched:
        patched.setattr(fd, "natively_written", lambda feature: False)
        _record(tmp_path / "ds", mode="append")
    _record(tmp_path / "ds", mode="append")
    assert len(rlds_writer.open_dataset(tmp_path / "ds")["train"]) == 9


def test_recording_from_specs_and_spaces_never_imports_tfds_or_etils(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import gymnasium as gym
        import rlds_writer
        out = sys.argv[1]
        env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=out + "/dm")
        for _ in range(2):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(1)
        env.close()
        env = rlds_writer.RecordRLDS(
            gym.make("CartPole-v1"), out + "/gym", info_keys=[], step_fn=lambda *a: {"k": 1.0}
        )
        env.reset(seed=0)
        for _ in range(20):
            if any(env.step(0)[2:4]):
                env.reset()
        env.close()
        vec = rlds_writer.RecordRLDSVector(
            gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"), out + "/vec"
        )
        vec.reset(seed=0)
        for _ in range(30):
            vec.step(vec.action_space.sample())
        vec.close()
        heavy = ("tensorflow_datasets", "tensorflow", "etils")
        print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stdout.split() == ["[]"], out.stderr[-2000:]
    for name in ("dm", "gym", "vec"):
        builder = tfds.builder_from_directory(os.fspath(tmp_path / name))
        assert builder.info.splits["train"].num_examples >= 1


def test_a_bad_version_is_one_error_naming_it(tmp_path):
    config = config_lib.RecordingConfig(name="x", observation_info=np.float32)
    with pytest.raises(SpecError, match="version: expected MAJOR.MINOR.PATCH.*'1.0'"):
        DatasetWriter(tmp_path / "ds", config, version="1.0")
    assert not (tmp_path / "ds").exists()


def test_features_json_is_never_written_through_a_planted_link(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "features.json").symlink_to(outside)
    (directory / "metadata.json").symlink_to(outside)
    config = config_lib.RecordingConfig(name="x", observation_info=np.float32)
    DatasetWriter(directory, config, metadata={"a": 1}).close()
    assert outside.read_text() == "keep"
    assert not (directory / "features.json").is_symlink()
    assert tfds.builder_from_directory(os.fspath(directory)).info.features["steps"]


def test_description_fields_reach_dataset_info_json_through_tfds(tmp_path):
    # `homepage` is a field of both configs; only TFDS's DatasetInfo writes it.
    config = config_lib.env_config(rlds_writer.Catch(seed=0), "x", homepage="https://example.org")
    assert isinstance(config, config_lib.RecordingConfig)
    DatasetWriter(tmp_path / "ds", config).close()
    info = tfds.builder_from_directory(os.fspath(tmp_path / "ds")).info
    assert info.homepage == "https://example.org"
    # A field only TFDS's config has gives TFDS's config.
    tfds_only = config_lib.env_config(rlds_writer.Catch(seed=0), "x", description="d")
    assert type(tfds_only) is config_lib.dataset_config_class() and tfds_only.description == "d"


class _RichDmEnv(dm_env.Environment):
    """A dm_env env whose specs become an image, a float64 vector and text."""

    def __init__(self):
        self._t = 0

    def _obs(self):
        rng = np.random.default_rng(self._t)
        return {
            "image": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8),
            "vec": rng.uniform(-1, 1, 3),
            "note": "t" * (self._t % 4),
        }

    def reset(self):
        self._t = 0
        return dm_env.restart(self._obs())

    def step(self, action):
        self._t += 1
        if self._t == 4:
            return dm_env.termination(1.0, self._obs())
        return dm_env.transition(0.5, self._obs())

    def observation_spec(self):
        return {
            "image": specs.Array((16, 16, 3), np.uint8),
            "vec": specs.Array((3,), np.float64),
            "note": specs.StringArray(()),
        }

    def action_spec(self):
        return specs.DiscreteArray(3)

    def reward_spec(self):
        return specs.Array((), np.float32)

    def discount_spec(self):
        return specs.BoundedArray((), np.float32, 0.0, 1.0)


def _log_dm_env(directory):
    env = rlds_writer.EnvLogger(_RichDmEnv(), data_directory=directory, metadata={"run": 1})
    for _ in range(2):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(1)
    env.close()


def test_an_envlogger_recording_made_without_tfds_is_file_for_file_tfds_own(tmp_path, monkeypatch):
    _same_files_both_ways(tmp_path, monkeypatch, _log_dm_env)
    steps = tfds.builder_from_directory(os.fspath(tmp_path / "own")).info.features["steps"]
    assert steps["observation"]["image"].encoding_format == "png"
