"""`info`'s feature tree is built from the one walk over feature specs."""

import numpy as np
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.maintain.feature_tree import features_tree, render_features
from rlds_writer.store.dataset import Dataset


def test_tree_keeps_the_features_order_nesting_and_empty_dicts(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="tree",
        observation_info={
            "pos": tfds.features.Tensor(shape=(2,), dtype=np.float32),
        },
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        episode_metadata_info={"seed": np.int64, "none": {}},
    )
    with rlds_writer.store.DatasetWriter(tmp_path / "d", config) as writer:
        del writer  # the empty dataset is enough: its features.json is written
    features_json = Dataset.open(tmp_path / "d").features_config
    tree = features_tree(features_json)
    steps = tree["features"]["steps"]
    assert list(tree["features"]) == list(features_json["featuresDict"]["features"])
    assert steps["type"] == "Dataset"
    observation = steps["feature"]["features"]["observation"]
    assert observation["features"]["pos"] == {"type": "Tensor", "dtype": "float32", "shape": [2]}
    assert tree["features"]["seed"]["dtype"] == "int64"
    assert tree["features"]["none"] == {"type": "FeaturesDict", "features": {}}
    lines = render_features(tree)
    assert "  observation" in lines and "none" in lines


def test_an_empty_top_level_features_dict_is_described_not_a_key_error():
    empty = {
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {},
    }
    assert features_tree(empty) == {"type": "FeaturesDict", "features": {}}
