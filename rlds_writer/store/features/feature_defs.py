"""TFDS's feature kinds that env specs and spaces become, defined without TFDS.

A recording whose features come from a dm_env spec or a Gymnasium space
needs six of TFDS's feature classes: `Tensor` (numeric, encoding none, bytes
or zlib) and `Scalar`, `Image` (PNG or JPEG), `Text`, `FeaturesDict` and the
`steps` `Dataset`. Importing TFDS to describe them costs about 135 ms, the largest
part of a short recording's fixed cost; these classes describe the same
features as data, and `to_json` gives the node of `features.json` TFDS would
write for each (the JSON form of its `Feature` proto), so a dataset made from
them is file for file the one TFDS's objects would make
(tests/store/features/test_feature_defs.py compares every kind).

`as_tfds` turns them into TFDS's own objects where TFDS is wanted anyway: the
public `feature_from_space`/`config_from_env` results, and a config that mixes
them with features a user built with TFDS. `natively_written` says whether a
tree is all of these and written by this package's own encoders, so the writer
can leave TFDS unimported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

_CLASS = "tensorflow_datasets.core.features."
TENSOR_CLASS = _CLASS + "tensor_feature.Tensor"
SCALAR_CLASS = _CLASS + "scalar.Scalar"
IMAGE_CLASS = _CLASS + "image_feature.Image"
TEXT_CLASS = _CLASS + "text_feature.Text"
DICT_CLASS = _CLASS + "features_dict.FeaturesDict"
DATASET_CLASS = _CLASS + "dataset_feature.Dataset"

TENSOR_ENCODINGS = ("none", "bytes", "zlib")
IMAGE_FORMATS = ("png", "jpeg")


def _shape_json(shape: tuple[int, ...]) -> dict[str, Any]:
    # Protobuf's JSON writes int64 as strings and leaves an empty list out.
    return {"dimensions": [str(d) for d in shape]} if shape else {}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """`tfds.features.Tensor` of a numeric or bool dtype and a fixed shape."""

    shape: tuple[int, ...]
    dtype: np.dtype
    encoding: str = "none"
    python_class = TENSOR_CLASS

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        # Wider numbers (float128) are TFDS's encoder's to refuse.
        numeric = self.dtype.kind in "biuf" and self.dtype.itemsize <= 8
        if not numeric or self.encoding not in TENSOR_ENCODINGS:
            raise ValueError(f"no own Tensor of {self.dtype} with encoding {self.encoding!r}")

    def to_json(self) -> dict[str, Any]:
        tensor = {"shape": _shape_json(self.shape), "dtype": self.dtype.name}
        tensor["encoding"] = self.encoding
        return {"pythonClassName": self.python_class, "tensor": tensor}

    def to_tfds(self) -> Any:
        import tensorflow_datasets as tfds

        if self.encoding == "none":
            return tfds.features.Tensor(shape=self.shape, dtype=self.dtype)
        return tfds.features.Tensor(shape=self.shape, dtype=self.dtype, encoding=self.encoding)


class Scalar(Tensor):
    """`tfds.features.Scalar`: a `Tensor` of shape `()` under its own class name."""

    python_class = SCALAR_CLASS

    def __init__(self, dtype: Any):
        super().__init__((), dtype)

    def to_tfds(self) -> Any:
        import tensorflow_datasets as tfds

        return tfds.features.Scalar(self.dtype)


# TensorFlow's `encode_jpeg` default, which TFDS uses for JPEG `Image`s.
DEFAULT_JPEG_QUALITY = 95


@dataclasses.dataclass(frozen=True)
class Image:
    """`tfds.features.Image` with its format named.

    `jpeg_quality` is what the encoder uses for JPEG frames (TFDS's `Image`
    has no such setting); `features.json` does not hold it.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    encoding_format: str
    jpeg_quality: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        channels = self.shape[-1] if len(self.shape) == 3 else None
        if self.encoding_format == "jpeg":
            fits = self.dtype == np.uint8 and channels in (1, 3)
        else:  # TFDS stores float32 PNGs bitcast to 4 uint8 channels
            fits = self.encoding_format == "png" and (
                self.dtype in (np.uint8, np.uint16)
                and channels in (1, 2, 3, 4)
                or self.dtype == np.float32
                and channels == 1
            )
        if not fits:
            raise ValueError(
                f"no own {self.encoding_format!r} Image of {self.dtype}{list(self.shape)}"
            )

    def to_json(self) -> dict[str, Any]:
        image = {
            "shape": _shape_json(self.shape),
            "dtype": self.dtype.name,
            "encodingFormat": self.encoding_format,
        }
        return {"pythonClassName": IMAGE_CLASS, "image": image}

    def to_tfds(self) -> Any:
        import tensorflow_datasets as tfds

        feature = tfds.features.Image(
            shape=self.shape, dtype=self.dtype, encoding_format=self.encoding_format
        )
        if self.jpeg_quality is not None:
            feature.jpeg_quality = self.jpeg_quality
        return feature


@dataclasses.dataclass(frozen=True)
class Text:
    """`tfds.features.Text` (UTF-8 strings, no vocabulary)."""

    def to_json(self) -> dict[str, Any]:
        return {"pythonClassName": TEXT_CLASS, "text": {}}

    def to_tfds(self) -> Any:
        import tensorflow_datasets as tfds

        return tfds.features.Text()


class FeaturesDict(Mapping):
    """`tfds.features.FeaturesDict`: named features, in the order given."""

    def __init__(self, features: Mapping[str, Any]):
        self._features = {str(k): as_feature(v) for k, v in features.items()}

    def __getitem__(self, key: str) -> Any:
        return self._features[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._features)

    def __len__(self) -> int:
        return len(self._features)

    def __repr__(self) -> str:
        return f"FeaturesDict({self._features!r})"

    def to_json(self) -> dict[str, Any]:
        children = {k: v.to_json() for k, v in self._features.items()}
        # An empty map is left out of the proto's JSON.
        content = {"features": children} if children else {}
        return {"pythonClassName": DICT_CLASS, "featuresDict": content}

    def to_tfds(self) -> Any:
        import tensorflow_datasets as tfds

        return tfds.features.FeaturesDict({k: as_tfds(v) for k, v in self._features.items()})


@dataclasses.dataclass(frozen=True)
class Dataset:
    """`tfds.features.Dataset`: RLDS's `steps`, a sequence of unknown length."""

    feature: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature", as_feature(self.feature))

    def to_json(self) -> dict[str, Any]:
        return {
            "pythonClassName": DATASET_CLASS,
            "sequence": {"feature": self.feature.to_json(), "length": "-1"},
        }

    def to_tfds(self) -> Any:
        import tensorflow_datasets as tfds

        return tfds.features.Dataset(as_tfds(self.feature))


OWN_TYPES = (Tensor, Image, Text, FeaturesDict, Dataset)


def as_feature(value: Any) -> Any:
    """A feature as the writer holds it: dicts made `FeaturesDict`s, dtypes scalar `Tensor`s.

    TFDS's `FeaturesDict` takes the same shorthands (`np.float32` for a
    scalar, a dict for a nested dict); anything else is returned as it is.
    """
    if isinstance(value, OWN_TYPES):
        return value
    if type(value) is dict:
        return FeaturesDict(value)
    if (isinstance(value, type) and issubclass(value, np.generic)) or isinstance(value, np.dtype):
        dtype = np.dtype(value)
        if dtype.kind in "biuf":
            return Tensor((), dtype)
    return value


def is_own(feature: Any) -> bool:
    """Whether `feature` (a node, a dict or a dtype) is made of these classes only."""
    return all(isinstance(leaf, OWN_TYPES) for leaf in _leaves(as_feature(feature)))


def natively_written(feature: Any) -> bool:
    """Whether a tree is all own features, each written by this package's encoders.

    A numeric tensor with a zero-sized dimension is not: TFDS's own checks
    refuse some of those by their serialized shape, and the writer runs them.
    """
    return all(
        isinstance(leaf, OWN_TYPES) and not (isinstance(leaf, Tensor) and 0 in leaf.shape)
        for leaf in _leaves(as_feature(feature))
    )


def _leaves(feature: Any) -> Iterator[Any]:
    """The leaves of a tree (dicts and `steps` descended), TFDS's nodes among them as they are."""
    if isinstance(feature, FeaturesDict):
        for value in feature.values():
            yield from _leaves(value)
    elif isinstance(feature, Dataset):
        yield from _leaves(feature.feature)
    else:
        yield feature


def as_tfds(feature: Any) -> Any:
    """`feature` with every own node (at any depth of a dict) made TFDS's own object."""
    if isinstance(feature, OWN_TYPES):
        return feature.to_tfds()
    if isinstance(feature, Mapping) and not hasattr(feature, "get_tensor_info"):
        return {k: as_tfds(v) for k, v in feature.items()}
    return feature
