"""The DatasetInfo a recording writes: TFDS's own RLDS layout, built without TensorFlow."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.rlds import rlds_base

from rlds_writer.store.dataset_setup import build_dataset_info


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
