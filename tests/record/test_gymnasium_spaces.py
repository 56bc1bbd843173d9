"""Features inferred from Gymnasium spaces and from observed values."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds
from gymnasium import spaces

from rlds_writer.errors import SpecError
from rlds_writer.record import spaces as spaces_lib


def _encoding(feature) -> str:
    return str(feature._encoding).lower()


def test_box_of_every_dtype_keeps_shape_and_dtype():
    for dtype in (np.float32, np.float16, np.int8, np.int32, np.int64, np.uint16, np.bool_):
        low, high = (0, 1) if dtype == np.bool_ else (0, 10)
        feature = spaces_lib.feature_from_space(spaces.Box(low, high, (2, 3), dtype))
        assert feature.shape == (2, 3) and feature.dtype == dtype


def test_image_boxes_are_png_images_by_default_and_small_uint8_boxes_are_not():
    # The default changed from a bytes-encoded Tensor to a PNG Image (issue 12).
    image = spaces_lib.feature_from_space(spaces.Box(0, 255, (16, 16, 3), np.uint8))
    assert isinstance(image, tfds.features.Image) and image.encoding_format == "png"
    rank2 = spaces_lib.feature_from_space(spaces.Box(0, 255, (16, 16), np.uint8))
    assert "bytes" in _encoding(rank2)  # TFDS Image needs a channel axis
    as_bytes = spaces_lib.feature_from_space(
        spaces.Box(0, 255, (16, 16, 3), np.uint8), image_encoding="bytes"
    )
    assert "bytes" in _encoding(as_bytes)
    assert "zlib" in _encoding(
        spaces_lib.feature_from_space(spaces.Box(0, 255, (16, 16), np.uint8), image_encoding="zlib")
    )
    small = spaces_lib.feature_from_space(spaces.Box(0, 255, (4,), np.uint8))
    assert "none" in _encoding(small)


def test_float64_boxes_are_stored_exactly_as_bytes():
    feature = spaces_lib.feature_from_space(spaces.Box(0.0, 1.0, (3,), np.float64))
    assert feature.dtype == np.float64 and "bytes" in _encoding(feature)


def test_discrete_multidiscrete_multibinary_text():
    assert spaces_lib.feature_from_space(spaces.Discrete(5)).dtype == np.int64
    md = spaces_lib.feature_from_space(spaces.MultiDiscrete([[2, 3], [4, 5]]))
    assert md.shape == (2, 2) and md.dtype == np.int64
    mb = spaces_lib.feature_from_space(spaces.MultiBinary(7))
    assert mb.shape == (7,) and mb.dtype == np.int8
    assert isinstance(spaces_lib.feature_from_space(spaces.Text(5)), tfds.features.Text)


def test_tuple_becomes_dict_keyed_by_index_and_values_are_converted():
    space = spaces.Dict({"a": spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (2,))))})
    feature = spaces_lib.feature_from_space(space)
    assert set(feature["a"]) == {"0", "1"}
    convert = spaces_lib.space_converter(space)
    value = {"a": (1, np.zeros(2, np.float32))}
    assert set(convert(value)["a"]) == {"0", "1"}
    assert spaces_lib.space_converter(spaces.Box(0, 1, (2,))) is spaces_lib._identity


def test_unsupported_space_names_its_path():
    space = spaces.Dict({"g": spaces.Sequence(spaces.Discrete(3))})
    with pytest.raises(SpecError, match=r"observation/g: Sequence spaces are not supported"):
        spaces_lib.feature_from_space(space, "observation")


def test_config_from_spaces_has_discount_only_when_asked():
    obs, act = spaces.Box(0, 1, (2,)), spaces.Discrete(2)
    assert spaces_lib.config_from_spaces(obs, act).discount_info is None
    assert spaces_lib.config_from_spaces(obs, act, discount=True).discount_info is not None


def test_feature_from_values_infers_types():
    f = spaces_lib.feature_from_values
    assert f([1.5, 2], "x").dtype == np.float32
    assert f([1, 2], "x").dtype == np.int64
    assert f([True, False], "x").dtype == np.bool_
    assert isinstance(f(["a", "bc"], "x"), tfds.features.Text)
    arr = f([np.zeros((2, 2), np.int16)], "x")
    assert arr.shape == (2, 2) and arr.dtype == np.int16
    assert f([[1.0, 2.0]], "x").dtype == np.float32
    nested = f([{"p": 1, "q": "s"}], "x")
    assert nested["p"].dtype == np.int64


def test_feature_from_values_rejects_inconsistent_values():
    with pytest.raises(SpecError, match=r"steps/x: values have different shapes"):
        spaces_lib.feature_from_values([np.zeros(2), np.zeros(3)], "steps/x")
    with pytest.raises(SpecError, match=r"steps/x: cannot infer"):
        spaces_lib.feature_from_values([object()], "steps/x")
    with pytest.raises(SpecError, match=r"steps/x: a dict with keys"):
        spaces_lib.feature_from_values([{"a": 1}, {"b": 1}], "steps/x")
