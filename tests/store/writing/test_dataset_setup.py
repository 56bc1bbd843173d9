"""The DatasetInfo a recording writes: TFDS's own RLDS layout, built without TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.rlds import rlds_base

from rlds_writer.store.writing.dataset_setup import build_dataset_info


def _config() -> rlds_base.DatasetConfig:
    return rlds_base.DatasetConfig(
        name="probe",
        observation_info=tfds.features.FeaturesDict(
            {
                "image": tfds.features.Image(shape=(8, 8, 3), encoding_format="png"),
                "state": tfds.features.Tensor(shape=(3,), dtype=np.float32),
            }
        ),
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.int64),
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"station": tfds.features.Scalar(np.int32)},
        episode_metadata_info={"episode_id": tfds.features.Text()},
        overall_description="a probe",
        homepage="https://example.org",
        citation="none",
    )


def test_the_info_equals_tfds_own_rlds_build_info(tmp_path):
    config = _config()
    ours = build_dataset_info(config, "probe", "1.0.0", tmp_path, metadata={"seed": 3})
    identity = tfds.core.DatasetIdentity(
        name="probe", version=tfds.core.Version("1.0.0"), data_dir=str(tmp_path), module_name=""
    )
    theirs = rlds_base.build_info(config, identity, ds_metadata={"seed": 3})
    assert ours.features.to_json() == theirs.features.to_json()
    assert ours.as_proto == theirs.as_proto
    assert ours.metadata == theirs.metadata


def test_recording_a_dataset_never_imports_tensorflow(tmp_path):
    # TFDS's build_info names tf.bool: about 5 s of import in every recording process.
    script = textwrap.dedent(
        """
        import sys
        import rlds_writer
        env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=sys.argv[1])
        for _ in range(3):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(1)
        env.close()
        print(len(rlds_writer.open_dataset(sys.argv[1])["train"]), "tensorflow" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stdout.split() == ["3", "False"], out.stderr[-2000:]


def test_a_new_dataset_gets_tfds_own_info_file_once_with_its_split_listed(tmp_path, monkeypatch):
    from google.protobuf import json_format

    from rlds_writer.store.storage import file_io
    from rlds_writer.store.writing.writer import DatasetWriter

    replaced = []
    atomic_write_text = file_io.atomic_write_text

    def spy(path, text, fsync=False):
        replaced.append((os.path.basename(path), os.path.exists(path)))
        atomic_write_text(path, text, fsync)

    monkeypatch.setattr(file_io, "atomic_write_text", spy)
    directory = tmp_path / "ds"
    writer = DatasetWriter(directory, _config(), split="eval", metadata={"seed": 3})
    try:
        # Written once, as a new file: on ext4 a rename over an existing file
        # flushes the new one's blocks.
        assert replaced == [("dataset_info.json", False)]
        info = json.loads((directory / "dataset_info.json").read_text())
        proto = writer.info.tfds_info.as_proto
        tfds_own = json.loads(json_format.MessageToJson(proto, sort_keys=True))
        assert {k: v for k, v in info.items() if k != "splits"} == tfds_own
        assert info["splits"] == [
            {
                "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}",
                "name": "eval",
                "numBytes": "0",
                "shardLengths": [],
            }
        ]
        builder = tfds.builder_from_directory(str(directory))
        assert builder.info.splits["eval"].num_examples == 0
        assert builder.info.features.to_json() == writer.info.tfds_info.features.to_json()
        assert json.loads((directory / "metadata.json").read_text()) == {"seed": 3}
    finally:
        writer.close()


def test_fields_that_would_share_one_key_are_refused_before_anything_is_written(tmp_path):
    """A name holding '/' beside a dict of the same path (`a/b` and `a: {b}`) would
    store both under `steps/observation/a/b`: TFDS refuses to load that ("Try to
    overwrite existing key") and the reader gave one field the other's values.
    Refused when writing (natively or through TFDS's info) and when reading."""
    import pytest

    import rlds_writer
    from rlds_writer.errors import IncompatibleDatasetError, SpecError
    from rlds_writer.store.features.features import parse_features

    tensor = tfds.features.Tensor(shape=(1,), dtype=np.float32)
    observation = {"a/b": tensor, "a": {"b": tensor}}
    for extra in ({}, {"citation": "x"}):  # our encoder, and TFDS's build_dataset_info
        config = rlds_writer.DatasetConfig(
            name="clash", observation_info=observation, action_info=np.float32, **extra
        )
        with pytest.raises(SpecError, match=r"^steps/observation/a/b: two fields would be"):
            rlds_writer.TFDSBackendWriter(tmp_path / "clash", config)
        assert not (tmp_path / "clash" / "features.json").exists()
    # A features.json made so elsewhere is refused by the reader, naming the key.
    one = rlds_writer.DatasetConfig(
        name="one", observation_info={"a/b": tensor}, action_info=np.float32
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "one", one) as writer:
        writer.write_episode({"observation": {"a/b": np.ones((2, 1), np.float32)}, "action": [0.0]})
    config = json.loads((tmp_path / "one" / "features.json").read_text())
    steps = config["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    observation_json = steps["features"]["observation"]["featuresDict"]["features"]
    observation_json["a"] = {
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {"features": {"b": observation_json["a/b"]}},
    }
    with pytest.raises(IncompatibleDatasetError, match=r"steps/observation/a/b: two fields"):
        parse_features(config)
