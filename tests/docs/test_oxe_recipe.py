"""The OXE recipe (examples/oxe_robot.py): recorded with RecordRLDS, loaded the OXE way."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

import rlds_writer

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "oxe_robot.py")


@pytest.fixture(scope="module")
def oxe():
    spec = importlib.util.spec_from_file_location("oxe_robot", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dataset(oxe, tmp_path_factory):
    path = tmp_path_factory.mktemp("oxe") / "toy_arm"
    oxe.record(str(path), episodes=3)
    return str(path)


def test_cameras_are_image_features_and_text_is_text(dataset):
    features = tfds.builder_from_directory(dataset).info.features
    obs = features["steps"]["observation"]
    for camera in ("image", "wrist_image"):
        assert isinstance(obs[camera], tfds.features.Image)
        assert obs[camera].shape == (32, 32, 3) and obs[camera].encoding_format == "png"
    assert isinstance(obs["depth"], tfds.features.Image)
    assert obs["depth"].np_dtype == np.uint16 and obs["depth"].shape == (32, 32, 1)
    assert isinstance(features["steps"]["language_instruction"], tfds.features.Text)
    assert isinstance(features["episode_metadata"]["file_path"], tfds.features.Text)


def test_oxe_pipeline_windows_hold_the_recorded_steps_without_the_final_one(oxe, dataset):
    import tensorflow as tf

    window = 2
    windows = list(oxe.oxe_pipeline(dataset, window=window).as_numpy_iterator())
    episodes = list(rlds_writer.open_dataset(dataset, final_step="drop").episodes())
    assert len(windows) == sum(len(e["steps"]["action"]) - window + 1 for e in episodes)
    i = 0
    for e, episode in enumerate(episodes):
        steps = episode["steps"]
        file_path = episode["episode_metadata"]["file_path"]
        assert file_path == f"toy_arm/episode_{e:04d}".encode()
        for start in range(len(steps["action"]) - window + 1):
            item = windows[i]
            i += 1
            span = slice(start, start + window)
            np.testing.assert_array_equal(item["action"], steps["action"][span])
            np.testing.assert_array_equal(
                item["observation"]["proprio"], steps["observation"]["state"][span]
            )
            np.testing.assert_allclose(
                item["observation"]["depth"][..., 0],
                steps["observation"]["depth"][span][..., 0].astype(np.float32) / 1000.0,
            )
            expected = tf.image.resize(steps["observation"]["image"][span], (16, 16)).numpy() / 255
            np.testing.assert_allclose(item["observation"]["image_primary"], expected, atol=1e-6)
            assert list(item["task"]["language_instruction"]) == list(
                steps["language_instruction"][span]
            )
            assert set(item["episode_file"]) == {file_path}
