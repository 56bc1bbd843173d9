"""`Decoder.decode(..., lazy=keys)`: step fields decoded one step at a time equal the whole arrays.

`show` reads image-like fields this way so that its memory does not grow with
the episode's length; every storage kind must give exactly what `decode` gives.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.read.decode import Decoder, LazySteps
from rlds_writer.read.nest import flatten


def test_lazy_steps_equal_the_decoded_columns_for_every_storage_kind(tmp_path):
    observation_info = {
        "grid": tfds.features.Tensor(
            shape=(3, 40), dtype=np.uint8
        ),  # int64 varints of 1 and 2 bytes
        "signed": tfds.features.Tensor(shape=(2, 3), dtype=np.int32),  # negatives: 10-byte varints
        "big": tfds.features.Tensor(shape=(2,), dtype=np.uint64),
        "flags": tfds.features.Tensor(shape=(4,), dtype=np.bool_),
        "floats": tfds.features.Tensor(shape=(4, 5), dtype=np.float32),
        "raw": tfds.features.Tensor(shape=(6, 7), dtype=np.uint16, encoding="bytes"),
        "packed": tfds.features.Tensor(shape=(5, 5), dtype=np.float64, encoding="zlib"),
        "image": tfds.features.Image(shape=(16, 16, 3)),
        "depth": tfds.features.Image(shape=(None, None, 1), dtype=np.uint16),
    }
    config = rlds_writer.DatasetConfig(
        name="kinds",
        observation_info=observation_info,
        action_info=np.int64,
        reward_info=np.float32,
    )
    rng = np.random.default_rng(0)
    steps = 300
    observation = {
        "grid": rng.integers(0, 256, (steps, 3, 40), dtype=np.uint8),
        "signed": rng.integers(-(2**31), 2**31, (steps, 2, 3), dtype=np.int32),
        "big": rng.integers(0, 2**64, (steps, 2), dtype=np.uint64),
        "flags": rng.integers(0, 2, (steps, 4)).astype(bool),
        "floats": rng.standard_normal((steps, 4, 5)).astype(np.float32),
        "raw": rng.integers(0, 65536, (steps, 6, 7), dtype=np.uint16),
        "packed": rng.standard_normal((steps, 5, 5)),
        "image": rng.integers(0, 256, (steps, 16, 16, 3), dtype=np.uint8),
        "depth": rng.integers(0, 65536, (steps, 9, 12, 1), dtype=np.uint16),
    }
    with rlds_writer.TFDSBackendWriter(tmp_path / "ds", config) as writer:
        writer.write_episode(
            {
                "observation": {k: list(v) for k, v in observation.items()},
                "action": list(range(steps - 1)),
                "reward": [0.5] * (steps - 1),
            }
        )
    reader = rlds_writer.open_dataset(tmp_path / "ds")
    ((where, record),) = list(reader.episodes().records())
    decoder = Decoder(reader.features)
    whole = decoder.decode(record, where)
    keys = [leaf.key for leaf in reader.features.step_leaves]
    lazy = decoder.decode(record, where, lazy=keys)
    compared = 0
    for (path, column), (lazy_path, steps_of) in zip(flatten(whole), flatten(lazy)):
        assert path == lazy_path
        if path[0] != "steps":
            continue
        assert isinstance(steps_of, LazySteps) and len(steps_of) == len(column) == steps
        for t in (0, 1, 127, 128, steps - 1, -1):
            value = steps_of[t]
            assert value.dtype == column[t].dtype and value.shape == column[t].shape, path
            np.testing.assert_array_equal(value, column[t])
        compared += 1
    assert compared >= 13  # every observation field, action, reward, discount, flags
