"""The feature model: one vocabulary of leaf kinds, one walk over feature specs.

TFDS describes a dataset by a `FeaturesDict`, saved as `features.json` (the
JSON form of its `Feature` proto: every node has a `pythonClassName` and one
content key, `featuresDict`, `sequence`, `tensor`, `text`, `image`,
`classLabel`). Both sides of the store see the same tree of leaves:

- `walk_features` (`store/features/feature_walk.py`, public here too) is the one
  walk: it yields every leaf (and every empty `FeaturesDict`) with its path,
  per-step leaves first, descending nested dicts and the top-level `steps`
  sequence. The writer walks TFDS's feature
  objects with it (`field_specs.compile_fields`); the reader, statistics and
  `info` walk `features.json` with it (`parse_features`, `load_features`).
- The kinds below say how a leaf's values sit in a `tf.train.Example`; the
  encoder, the decoder, statistics and inspection all speak them.

`parse_features` turns `features.json` into a flat list of `Leaf`s, one per
`tf.train.Example` key, with what the reader needs to decode each one exactly
as TFDS does: the kind, the decoded numpy dtype, the shape and the encoding.
Supported: `Tensor`/`Scalar` of every numeric dtype and of strings (with
`encoding` none, bytes or zlib), `Text`, `ClassLabel`, `Image` (PNG/JPEG), and
nested `FeaturesDict`s; a `Dataset` or `Sequence` is allowed as the top-level
`steps` feature. Anything else raises `UnsupportedFeatureError` naming the feature.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import IncompatibleDatasetError, UnsupportedFeatureError
from rlds_writer.store.features.feature_walk import (  # noqa: F401 - public here too
    STEPS,
    FeatureNode,
    check_unique_keys,
    walk_features,
    walk_features_json,
)
from rlds_writer.store.features.feature_walk import class_name as _class_name
from rlds_writer.store.features.feature_walk import dict_children as _dict_children
from rlds_writer.store.features.feature_walk import field as _field
from rlds_writer.store.features.feature_walk import json_steps as _json_steps
from rlds_writer.store.features.feature_walk import malformed as _malformed
from rlds_writer.store.features.feature_walk import short_repr as _short

# The kinds of leaf: how its values sit in a tf.train.Example.
FLOAT = "float"  # float_list of the values themselves (a Tensor of a float dtype).
INT = "int"  # int64_list of the values (integer or bool Tensors, ClassLabel).
BYTES = "bytes"  # bytes_list, one little-endian raw buffer per value (encoding=bytes).
ZLIB = "zlib"  # like BYTES, each buffer zlib-compressed (encoding=zlib).
TEXT = "text"  # bytes_list of byte strings (Text, a Tensor of dtype string).
PNG = "png"  # bytes_list of PNG files (Image).
JPEG = "jpeg"  # bytes_list of JPEG files (Image(encoding_format="jpeg")).
# Only the writer's: a leaf whose values TFDS's own encoder turns into bytes
# (class labels given as names, ragged sequences, images TFDS converts, ...).
FALLBACK = "fallback"

NUMERIC_KINDS = (FLOAT, INT)  # the values themselves, one list entry per element
ENCODED_KINDS = (BYTES, ZLIB)  # one raw buffer per value
IMAGE_KINDS = (PNG, JPEG)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One leaf feature of a dataset, as stored in a `tf.train.Example`.

    Attributes:
      path: the leaf's path inside an episode, e.g. `('steps', 'observation')`.
      key: the `tf.train.Example` key, e.g. `'steps/observation'`.
      kind: how values are stored (`FLOAT`, `INT`, `BYTES`, `ZLIB`, `TEXT`,
        `PNG` or `JPEG`).
      dtype: the numpy dtype TFDS decodes to (`object` for strings).
      shape: the shape of one value (one step's value for per-step leaves);
        `None` marks an unknown dimension.
      in_steps: whether the leaf is a per-step field.
      class_name: the TFDS feature class, e.g. `'Tensor'`, `'Image'`.
      encoding_format: `'png'` or `'jpeg'` for images, else None.
    """

    path: tuple[str, ...]
    key: str
    kind: str
    dtype: np.dtype
    shape: tuple[int | None, ...]
    in_steps: bool
    class_name: str
    encoding_format: str | None = None

    @property
    def dynamic(self) -> bool:
        """True for encoded tensors with several unknown dimensions.

        TFDS stores those as two lists, `<key>/value` (the encoded bytes) and
        `<key>/shape` (the shape of each value).
        """
        return self.kind in ENCODED_KINDS and self.shape.count(None) > 1

    @property
    def wire_type(self) -> str:
        """`'float'`, `'int64'` or `'bytes'`: the list type the values are stored in."""
        return {FLOAT: "float", INT: "int64"}.get(self.kind, "bytes")

    @property
    def is_numeric(self) -> bool:
        """True if the values themselves are stored (float_list or int64_list)."""
        return self.kind in NUMERIC_KINDS

    @property
    def is_image(self) -> bool:
        """True for PNG or JPEG images."""
        return self.kind in IMAGE_KINDS

    @property
    def static(self) -> bool:
        """True if every dimension of the value shape is known."""
        return None not in self.shape

    @property
    def size(self) -> int | None:
        """Number of elements in one value, or None if the shape is not static."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.static else None

    def describe(self) -> str:
        """Returns the decoded value type as text, e.g. `uint8[84,84,3]`."""
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        name = "bytes" if self.dtype == np.object_ else self.dtype.name
        return f"{name}[{dims}]"


@dataclasses.dataclass(frozen=True)
class Features:
    """The parsed features of an RLDS dataset.

    Attributes:
      leaves: every leaf, per-step leaves first.
      has_steps: whether the dataset has a top-level `steps` sequence.
      empty_dicts: paths of empty `FeaturesDict`s (no leaves; they decode to `{}`).
    """

    leaves: tuple[Leaf, ...]
    has_steps: bool
    empty_dicts: tuple[tuple[str, ...], ...] = ()

    @property
    def step_leaves(self) -> tuple[Leaf, ...]:
        return tuple(leaf for leaf in self.leaves if leaf.in_steps)

    @property
    def episode_leaves(self) -> tuple[Leaf, ...]:
        return tuple(leaf for leaf in self.leaves if not leaf.in_steps)


def load_features(path: str | os.PathLike) -> Features:
    """Reads and parses a `features.json` file.

    Args:
      path: the file (or the dataset directory holding it).

    Returns:
      The parsed `Features`.

    Raises:
      FileNotFoundError: if the file does not exist.
      IncompatibleDatasetError: if the file is not a features.json TFDS can read.
      UnsupportedFeatureError: for a feature kind the reader cannot decode.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "features.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (RecursionError, ValueError) as e:
        # json's own errors are ValueErrors; a crafted file may nest without end.
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise IncompatibleDatasetError(
            f"{path}: not a features.json TFDS can read ({reason}); restore the file "
            "from the dataset's source"
        ) from None
    return parse_features_file(config, path)


def parse_features_file(config: Any, path: str) -> Features:
    """`parse_features` of the decoded JSON of the file `path`, errors naming the file.

    Raises:
      IncompatibleDatasetError: if it is not a features.json TFDS can read.
      UnsupportedFeatureError: for a feature kind the reader cannot decode.
    """
    if not isinstance(config, Mapping):
        raise IncompatibleDatasetError(
            f"{path}: not a features.json TFDS can read (expected a JSON object); restore "
            "the file from the dataset's source"
        )
    try:
        return parse_features(config)
    except IncompatibleDatasetError as e:
        raise IncompatibleDatasetError(
            f"{path}: not a features.json TFDS can read ({e}); restore the file "
            "from the dataset's source"
        ) from None
    except UnsupportedFeatureError as e:
        raise UnsupportedFeatureError(f"{path}: {e}") from None


def parse_features(config: Mapping[str, Any]) -> Features:
    """Parses the JSON dict of a `features.json`.

    Args:
      config: the decoded JSON.

    Returns:
      The parsed `Features`.

    Raises:
      UnsupportedFeatureError: for a feature kind the reader cannot decode, or
        the legacy (`type`/`content`) format.
      IncompatibleDatasetError: if the JSON is not a TFDS `FeaturesDict`
        (a field of the wrong type, a shape out of range, nesting too deep).
    """
    nodes = walk_features_json(config)  # checks the top level first
    top = _dict_children(config, ())
    has_steps = STEPS in top and _json_steps(top[STEPS], (STEPS,)) is not None
    steps: list[Leaf] = []
    episode: list[Leaf] = []
    empties: list[tuple[str, ...]] = []
    for node in nodes:
        if node.empty_dict:
            empties.append(node.path)
        else:
            leaf = _leaf(node.spec, node.path, node.in_steps)
            (steps if node.in_steps else episode).append(leaf)
    check_unique_keys([leaf.path for leaf in steps + episode], IncompatibleDatasetError)
    return Features(leaves=tuple(steps + episode), has_steps=has_steps, empty_dicts=tuple(empties))


# Limits that no real feature reaches; past them a crafted shape would make
# TensorFlow (and any allocation by shape) fail natively.
_MAX_DIM = 2**31 - 1
_MAX_ELEMENTS = 2**34
_MAX_RANK = 32


def _dimension(d: Any) -> int:
    """A JSON dimension (TFDS writes them as strings) as an int; ValueError if it is none."""
    if isinstance(d, bool) or not isinstance(d, (int, str)):
        raise ValueError(d)
    return int(d)


def _shape(
    content: Mapping[str, Any], key: str = "", in_steps: bool = False
) -> tuple[int | None, ...]:
    dims = content.get("shape", {})
    if isinstance(dims, Mapping):
        dims = dims.get("dimensions", [])
    if not isinstance(dims, list) or len(dims) > _MAX_RANK:
        raise _malformed((key,), f"shape must be a list of at most {_MAX_RANK} dimensions")
    try:
        shape = tuple(None if _dimension(d) == -1 else _dimension(d) for d in dims)
    except ValueError:
        shape = ()
        known = [0]
    else:
        known = [d for d in shape if d is not None]
    # Zero-sized dimensions are legal at episode level (TFDS reads them back);
    # per step, TensorFlow's parser dies on them (SIGFPE) and no writer makes them.
    smallest = 1 if in_steps else 0
    if any(d < smallest or d > _MAX_DIM for d in known) or math.prod(known) > _MAX_ELEMENTS:
        raise _malformed(
            (key,),
            f"shape {_short(dims)} is not readable (expected -1 or {smallest}..{_MAX_DIM} per "
            f"dimension, at most {_MAX_ELEMENTS} elements)",
        )
    return shape


# The dtypes TFDS stores in features.json, by name.
_DTYPES = {
    name: np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
}


def _dtype(name: Any, path: tuple[str, ...]) -> np.dtype:
    if name in ("string", "object"):
        return np.dtype(object)
    if isinstance(name, str) and name in _DTYPES:
        return _DTYPES[name]
    if not isinstance(name, str):
        raise _malformed(path, f"dtype must be a string, got {_short(name)}")
    raise UnsupportedFeatureError(
        f"{'/'.join(path)}: dtype {_short(name)} cannot be decoded without TensorFlow"
    )


def _leaf(node: Mapping[str, Any], path: tuple[str, ...], in_steps: bool) -> Leaf:
    """The `Leaf` of one `features.json` leaf node, or why the reader cannot decode it."""
    key = "/".join(path)
    cls = _class_name(node, path)
    if cls in ("Tensor", "Scalar"):
        content = _field(node, "tensor", Mapping, path)
        dtype = _dtype(_field(content, "dtype", str, path + ("tensor",)), path)
        shape = _shape(content, key, in_steps)
        encoding = content.get("encoding", "none")
        if not isinstance(encoding, str):
            raise _malformed(path, f"Tensor encoding must be a string, got {_short(encoding)}")
        encoding = encoding.lower()
        if content.get("optional"):
            raise UnsupportedFeatureError(f"{key}: optional Tensor features are not supported")
        if encoding in ("", "none"):
            kind = TEXT if dtype == np.object_ else FLOAT if dtype.kind == "f" else INT
            if dtype.kind not in "biufO":
                raise UnsupportedFeatureError(
                    f"{key}: dtype {dtype.name} has no tf.train.Example list type"
                )
        elif encoding == "bytes":
            kind = BYTES
        elif encoding == "zlib":
            kind = ZLIB
        else:
            raise UnsupportedFeatureError(
                f"{key}: Tensor encoding {_short(encoding)} is not supported"
            )
        if kind in ENCODED_KINDS and dtype == np.object_:
            raise UnsupportedFeatureError(f"{key}: string Tensor with encoding {encoding!r}")
        if kind in NUMERIC_KINDS and shape.count(None) > 1 or kind == TEXT and None in shape:
            raise UnsupportedFeatureError(
                f"{key}: Tensor of shape {shape} and encoding {encoding!r} is not supported"
            )
        if in_steps and kind in (*NUMERIC_KINDS, TEXT) and None in shape:
            # TFDS cannot parse these either (two unknown dimensions with the steps axis).
            raise UnsupportedFeatureError(
                f"{key}: per-step Tensor with unknown dimensions {shape} and no encoding "
                "is not supported"
            )
        return Leaf(path, key, kind, dtype, shape, in_steps, cls)
    if cls == "Text":
        text = node.get("text", {})
        if not isinstance(text, Mapping):
            raise _malformed(path, f"field 'text' must be an object, got {_short(text)}")
        if text.get("encoder") or text.get("encoderConfig"):
            raise UnsupportedFeatureError(f"{key}: Text with an encoder is not supported")
        return Leaf(path, key, TEXT, np.dtype(object), (), in_steps, cls)
    if cls == "ClassLabel":
        return Leaf(path, key, INT, np.dtype(np.int64), (), in_steps, cls)
    if cls == "Image":
        content = _field(node, "image", Mapping, path)
        shape = _shape(content, key, in_steps)
        dtype = _dtype(content.get("dtype", "uint8"), path)
        fmt = content.get("encodingFormat") or content.get("encoding_format") or "png"
        if not isinstance(fmt, str):
            raise _malformed(path, f"Image encodingFormat must be a string, got {_short(fmt)}")
        if dtype not in (np.uint8, np.uint16, np.float32):
            raise UnsupportedFeatureError(f"{key}: Image dtype {dtype.name} is not supported")
        if len(shape) != 3:
            raise UnsupportedFeatureError(
                f"{key}: Image of shape {shape} (video?) is not supported"
            )
        kind = JPEG if fmt.lower() in ("jpeg", "jpg") else PNG
        return Leaf(path, key, kind, dtype, shape, in_steps, cls, fmt)
    raise UnsupportedFeatureError(
        f"{key}: feature {cls[:60]} cannot be decoded without TFDS (supported: Tensor, "
        "Scalar, Text, ClassLabel, Image, FeaturesDict)"
    )
