"""Parses a TFDS `features.json` into leaf specs, without TFDS or TensorFlow.

TFDS saves a dataset's `FeaturesDict` as the JSON form of its `Feature` proto:
every node has a `pythonClassName` and one content key (`featuresDict`,
`sequence`, `tensor`, `text`, `image`, `classLabel`). This module turns that
tree into a flat list of `Leaf`s, one per `tf.train.Example` key, with what the
reader needs to decode each one exactly as TFDS does: the stored list type,
the decoded numpy dtype, the shape and the encoding.

Supported kinds: `Tensor`/`Scalar` of every numeric dtype and of strings (with
`encoding` none, bytes or zlib), `Text`, `ClassLabel`, `Image` (PNG/JPEG), and
nested `FeaturesDict`s; a `Dataset` or `Sequence` is allowed as the top-level
`steps` feature. Anything else raises `NotImplementedError` naming the feature.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

STEPS = "steps"

# Leaf kinds.
NUMERIC = "numeric"  # float_list or int64_list holding the values themselves.
STRING = "string"  # bytes_list of byte strings (Text, or Tensor of dtype string).
RAW = "raw"  # bytes_list, one little-endian raw buffer per value (encoding=bytes).
ZLIB = "zlib"  # like RAW, each buffer zlib-compressed (encoding=zlib).
IMAGE = "image"  # bytes_list of PNG/JPEG files.

_CONTENT_KEYS = ("featuresDict", "sequence", "tensor", "text", "image", "classLabel")


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One leaf feature of a dataset, as stored in a `tf.train.Example`.

    Attributes:
      path: the leaf's path inside an episode, e.g. `('steps', 'observation')`.
      key: the `tf.train.Example` key, e.g. `'steps/observation'`.
      kind: how values are stored (one of the module-level kind constants).
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
        return self.kind in (RAW, ZLIB) and self.shape.count(None) > 1

    @property
    def wire_type(self) -> str:
        """`'float'`, `'int64'` or `'bytes'`: the list type the values are stored in."""
        if self.kind != NUMERIC:
            return "bytes"
        return "float" if self.dtype.kind == "f" else "int64"

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
    """

    leaves: tuple[Leaf, ...]
    has_steps: bool

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
      NotImplementedError: for a feature kind the reader cannot decode.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "features.json")
    with open(path, encoding="utf-8") as f:
        return parse_features(json.load(f))


def parse_features(config: Mapping[str, Any]) -> Features:
    """Parses the JSON dict of a `features.json`.

    Args:
      config: the decoded JSON.

    Returns:
      The parsed `Features`.

    Raises:
      NotImplementedError: for a feature kind the reader cannot decode, or the
        legacy (`type`/`content`) format.
      ValueError: if the top level is not a `FeaturesDict`.
    """
    if _class_name(config, ()) != "FeaturesDict":
        raise ValueError(
            f"features.json: the top-level feature must be a FeaturesDict, "
            f"got {config.get('pythonClassName', config.get('type'))!r}"
        )
    top = _dict_children(config, ())
    steps: list[Leaf] = []
    episode: list[Leaf] = []
    has_steps = False
    for name, sub in top.items():
        if name == STEPS and _class_name(sub, (name,)) in ("Dataset", "Sequence"):
            has_steps = True
            inner = sub["sequence"]["feature"]
            _walk(inner, (STEPS,), True, steps)
        else:
            _walk(sub, (name,), False, episode)
    return Features(leaves=tuple(steps + episode), has_steps=has_steps)


def _class_name(node: Mapping[str, Any], path: tuple[str, ...]) -> str:
    if "type" in node and "content" in node:
        raise NotImplementedError(
            f"{'/'.join(path) or 'features.json'}: the legacy features.json format "
            "(`type`/`content`) is not supported; re-save the features with TFDS >= 4.6"
        )
    name = node.get("pythonClassName")
    if not name:
        for key in _CONTENT_KEYS:
            if key in node:
                return {"featuresDict": "FeaturesDict", "sequence": "Sequence"}.get(
                    key, key[0].upper() + key[1:]
                )
        raise ValueError(f"{'/'.join(path)}: feature has no pythonClassName: {node!r}")
    return name.rsplit(".", 1)[-1]


def _dict_children(node: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    try:
        return dict(node["featuresDict"]["features"])
    except KeyError as e:
        raise ValueError(f"{'/'.join(path) or '<root>'}: malformed FeaturesDict") from e


def _shape(content: Mapping[str, Any]) -> tuple[int | None, ...]:
    dims = content.get("shape", {})
    if isinstance(dims, Mapping):
        dims = dims.get("dimensions", [])
    return tuple(None if int(d) == -1 else int(d) for d in dims)


def _dtype(name: str, path: tuple[str, ...]) -> np.dtype:
    if name in ("string", "object"):
        return np.dtype(object)
    try:
        return np.dtype(name)
    except TypeError as e:
        raise NotImplementedError(
            f"{'/'.join(path)}: dtype {name!r} cannot be decoded without TensorFlow"
        ) from e


def _walk(node: Mapping[str, Any], path: tuple[str, ...], in_steps: bool, out: list[Leaf]) -> None:
    cls = _class_name(node, path)
    key = "/".join(path)
    if cls == "FeaturesDict":
        for name, sub in _dict_children(node, path).items():
            _walk(sub, path + (name,), in_steps, out)
        return
    if cls in ("Tensor", "Scalar"):
        content = node["tensor"]
        dtype = _dtype(content["dtype"], path)
        shape = _shape(content)
        encoding = str(content.get("encoding", "none")).lower()
        if content.get("optional"):
            raise NotImplementedError(f"{key}: optional Tensor features are not supported")
        if encoding in ("", "none"):
            kind = STRING if dtype == np.object_ else NUMERIC
            if dtype.kind not in "biufO":
                raise NotImplementedError(
                    f"{key}: dtype {dtype.name} has no tf.train.Example list type"
                )
        elif encoding == "bytes":
            kind = RAW
        elif encoding == "zlib":
            kind = ZLIB
        else:
            raise NotImplementedError(f"{key}: Tensor encoding {encoding!r} is not supported")
        if kind == NUMERIC and shape.count(None) > 1 or kind == STRING and None in shape:
            raise NotImplementedError(
                f"{key}: Tensor of shape {shape} and encoding {encoding!r} is not supported"
            )
        if in_steps and kind in (NUMERIC, STRING) and None in shape:
            # TFDS cannot parse these either (two unknown dimensions with the steps axis).
            raise NotImplementedError(
                f"{key}: per-step Tensor with unknown dimensions {shape} and no encoding "
                "is not supported"
            )
        out.append(Leaf(path, key, kind, dtype, shape, in_steps, cls))
        return
    if cls == "Text":
        if node.get("text", {}).get("encoder") or node.get("text", {}).get("encoderConfig"):
            raise NotImplementedError(f"{key}: Text with an encoder is not supported")
        out.append(Leaf(path, key, STRING, np.dtype(object), (), in_steps, cls))
        return
    if cls == "ClassLabel":
        out.append(Leaf(path, key, NUMERIC, np.dtype(np.int64), (), in_steps, cls))
        return
    if cls == "Image":
        content = node["image"]
        shape = _shape(content)
        dtype = _dtype(content.get("dtype", "uint8"), path)
        fmt = content.get("encodingFormat") or content.get("encoding_format") or "png"
        if dtype not in (np.uint8, np.uint16, np.float32):
            raise NotImplementedError(f"{key}: Image dtype {dtype.name} is not supported")
        if len(shape) != 3:
            raise NotImplementedError(f"{key}: Image of shape {shape} (video?) is not supported")
        out.append(Leaf(path, key, IMAGE, dtype, shape, in_steps, cls, fmt))
        return
    raise NotImplementedError(
        f"{key}: feature {cls} cannot be decoded without TFDS (supported: Tensor, Scalar, "
        "Text, ClassLabel, Image, FeaturesDict)"
    )
