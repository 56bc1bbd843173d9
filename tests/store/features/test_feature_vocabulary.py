"""One vocabulary of feature kinds and one walk: the writer and the reader see the same leaves.

The writer compiles TFDS's feature objects (`field_specs.compile_fields`); the
reader parses the `features.json` TFDS saves for them (`features.load_features`).
Both go through `features.walk_features` and name kinds from `store.features.features`.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds

from rlds_writer.store.features import features, field_specs

F = tfds.features


def _features() -> F.FeaturesDict:
    return F.FeaturesDict(
        {
            "steps": F.Dataset(
                {
                    "observation": {
                        "position": F.Tensor(shape=(3,), dtype=np.float32),
                        "count": F.Scalar(dtype=np.int16),
                        "flag": F.Scalar(dtype=np.bool_),
                        "raw": F.Tensor(shape=(2, 2), dtype=np.float64, encoding="bytes"),
                        "packed": F.Tensor(shape=(4,), dtype=np.uint16, encoding="zlib"),
                        "camera": F.Image(shape=(8, 8, 3), encoding_format="png"),
                        "frame": F.Image(shape=(8, 8, 3)),  # no format: TFDS's PNG
                        "wrist": F.Image(shape=(8, 8, 3), encoding_format="jpeg"),
                        "depth": F.Image(shape=(8, 8, 1), dtype=np.uint16, encoding_format="png"),
                    },
                    "action": F.Tensor(shape=(2,), dtype=np.float32),
                    "reward": F.Scalar(dtype=np.float32),
                    "discount": F.Scalar(dtype=np.float32),
                    "is_first": F.Scalar(dtype=np.bool_),
                    "is_last": F.Scalar(dtype=np.bool_),
                    "is_terminal": F.Scalar(dtype=np.bool_),
                    "language": F.Text(),
                    "note": F.Scalar(dtype=np.str_),
                    "label": F.ClassLabel(names=["left", "right"]),
                }
            ),
            "episode_metadata": {"seed": F.Scalar(dtype=np.int64), "nothing": {}},
            "end_reason": F.Text(),
        }
    )


# Each leaf's kind as stored, which the reader decodes.
EXPECTED = {
    "steps/observation/position": features.FLOAT,
    "steps/observation/count": features.INT,
    "steps/observation/flag": features.INT,
    "steps/observation/raw": features.BYTES,
    "steps/observation/packed": features.ZLIB,
    "steps/observation/camera": features.PNG,
    "steps/observation/frame": features.PNG,
    "steps/observation/wrist": features.JPEG,
    "steps/observation/depth": features.PNG,
    "steps/action": features.FLOAT,
    "steps/reward": features.FLOAT,
    "steps/discount": features.FLOAT,
    "steps/is_first": features.INT,
    "steps/is_last": features.INT,
    "steps/is_terminal": features.INT,
    "steps/language": features.TEXT,
    "steps/note": features.TEXT,
    "steps/label": features.INT,
    "episode_metadata/seed": features.INT,
    "end_reason": features.TEXT,
}
# What the writer hands to TFDS's own encoder: class labels may be given as
# names, and an Image without a format is TFDS's to encode.
FALLBACK = {"steps/label", "steps/observation/frame"}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    spec = _features()
    directory = tmp_path_factory.mktemp("features")
    spec.save_config(str(directory))  # features.json, as TFDS writes it
    return field_specs.compile_fields(spec), field_specs.empty_dict_paths(spec), directory


def test_writer_and_reader_walk_to_the_same_leaves(both):
    fields, empties, directory = both
    parsed = features.load_features(directory)
    # features.json keeps a dict's features sorted by name; per-step ones come first.
    assert sorted((f.path, f.in_steps) for f in fields) == sorted(
        (leaf.path, leaf.in_steps) for leaf in parsed.leaves
    )
    assert list(EXPECTED) == [f.key for f in fields]  # the features' own order
    assert [leaf.in_steps for leaf in parsed.leaves] == sorted(
        (leaf.in_steps for leaf in parsed.leaves), reverse=True
    )
    assert empties == list(parsed.empty_dicts) == [("episode_metadata", "nothing")]


def test_both_sides_name_each_leaf_by_one_kind(both):
    fields, _, directory = both
    parsed = {leaf.key: leaf for leaf in features.load_features(directory).leaves}
    for field in fields:
        leaf = parsed[field.key]
        assert leaf.kind == EXPECTED[field.key], field.key
        if field.key in FALLBACK:
            assert field.kind == field_specs.FALLBACK, field.key
        else:
            assert field.kind == leaf.kind, field.key
    assert field_specs.FLOAT is features.FLOAT and field_specs.FALLBACK is features.FALLBACK
    assert parsed["steps/observation/camera"].is_image
    assert parsed["steps/observation/flag"].is_numeric
    assert parsed["steps/observation/raw"].wire_type == "bytes"
    assert parsed["steps/reward"].wire_type == "float"
    assert parsed["steps/label"].wire_type == "int64"


def test_the_walk_yields_leaves_and_empty_dicts_of_any_tree():
    top = {
        "steps": ["seq", {"a": 1, "b": {"c": 2, "d": {}}}],
        "meta": {},
        "x": 3,
    }

    def children(spec, path):
        return spec if isinstance(spec, dict) else None

    def steps_feature(spec, path):
        return spec[1] if isinstance(spec, list) else None

    nodes = list(features.walk_features(top, children, steps_feature))
    assert [(n.key, n.in_steps, n.empty_dict) for n in nodes] == [
        ("steps/a", True, False),
        ("steps/b/c", True, False),
        ("steps/b/d", True, True),
        ("meta", False, True),
        ("x", False, False),
    ]
    # A `steps` that is not a sequence is an episode-level feature like any other.
    plain = list(features.walk_features({"steps": 5}, children, steps_feature))
    assert [(n.key, n.in_steps) for n in plain] == [("steps", False)]
