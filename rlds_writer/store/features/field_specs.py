"""The writer's view of the dataset's leaf fields: how each TFDS feature is encoded.

A dataset's `FeaturesDict` (TFDS's, or `store.features.feature_defs`' made without
TFDS: the same kinds, classified here alike) is compiled once (`compile_fields`, through the one
walk `features.walk_features`) into a list of `FieldSpec`s, one per leaf, each
with its kind from the one vocabulary in `store.features.features`: numeric `Tensor`s
and scalars (`FLOAT`, `INT`), `Tensor`s with `BYTES`/`ZLIB` encoding, scalar
strings and `Text` (`TEXT`), PNG and JPEG `Image`s are written by
`store.features.field_encoding`; every other kind (class labels, ragged tensors, ...)
goes through TFDS's own encoder (`FALLBACK`). Features TFDS would write but
could not read back are refused here, before anything is recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer import errors
from rlds_writer.store.features import feature_defs
from rlds_writer.store.features import features as feature_model
from rlds_writer.store.features.feature_defs import DEFAULT_JPEG_QUALITY

_log = logging.getLogger(__name__)

# The kinds, from the one vocabulary (re-exported: the writer's modules use them from here).
FLOAT = feature_model.FLOAT
INT = feature_model.INT
BYTES = feature_model.BYTES
ZLIB = feature_model.ZLIB
TEXT = feature_model.TEXT
PNG = feature_model.PNG
JPEG = feature_model.JPEG
FALLBACK = feature_model.FALLBACK

STEPS = feature_model.STEPS


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One leaf of the dataset's features.

    Attributes:
      path: path of the leaf inside the episode, e.g. `('steps', 'observation')`.
      key: the flat `tf.train.Example` key, e.g. `'steps/observation'`.
      feature: the leaf's feature (TFDS's connector, or one of `store.features.feature_defs`).
      kind: how it is encoded (a kind of `store.features.features`, or `FALLBACK`).
      in_steps: whether the leaf is a per-step field (under `steps`).
      shape: the value shape of one step (or of the episode-level value).
      dtype: the numpy dtype values are cast to (None for text and fallback).
    """

    path: tuple[str, ...]
    key: str
    feature: Any
    kind: str
    in_steps: bool
    shape: tuple[int | None, ...]
    dtype: np.dtype | None

    @property
    def name(self) -> str:
        return self.key

    def describe(self) -> str:
        """Returns the expected value as text, e.g. `uint8[84,84,3]`."""
        if self.kind == TEXT:
            return "text (str or bytes)"
        dtype = self.dtype if self.dtype is not None else _tensor_info_dtype(self.feature)
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{np.dtype(dtype).name}[{dims}]"

    @property
    def row_nbytes(self) -> int:
        """Bytes of one value of a field of fixed shape and dtype (an image's frame)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def zero(self) -> Any:
        """Returns the zero value of the field: used for the final step's action."""
        return zero_value(self.feature)

    @functools.cached_property
    def tfds_feature(self) -> Any:
        """The leaf as TFDS's own feature object, for TFDS's encoder (imports TFDS)."""
        return feature_defs.as_tfds(self.feature)

    def encode_by_tfds(self, value: Any) -> Any:
        """TFDS's `encode_example` of one value (an image given as a path or as bytes)."""
        return self.tfds_feature.encode_example(value)


def zero_value(feature: Any) -> Any:
    """Returns a zero value for a TFDS feature, built from its spec.

    Args:
      feature: a TFDS feature connector (`FeaturesDict`, `Tensor`, `Text`,
        ...) or one of `store.features.feature_defs`.

    Returns:
      A nested dict of numpy zeros of the feature's dtype and shape; an empty
      string for text; unknown dimensions are given length 0.
    """
    if isinstance(feature, feature_defs.FeaturesDict):
        return {k: zero_value(v) for k, v in feature.items()}
    if isinstance(feature, feature_defs.Text):
        return ""
    if isinstance(feature, feature_defs.Tensor | feature_defs.Image):
        return np.zeros(feature.shape, dtype=feature.dtype)
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.FeaturesDict):
        return {k: zero_value(v) for k, v in feature.items()}
    if isinstance(feature, tfds.features.Text):
        return ""
    info = _leaf_info(feature)
    if info is None:
        raise errors.SpecError(f"cannot build a zero value for feature {feature!r}")
    shape = tuple(0 if d is None else d for d in info.shape)
    dtype = info.np_dtype
    if dtype == np.object_ or np.dtype(dtype).kind in "SUO":
        if shape == ():
            return b""
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=dtype)


def _leaf_info(feature: Any) -> Any:
    """The feature's one `TensorInfo`, or None for a nested feature (a dict of them).

    Not told apart by `isinstance(info, Mapping)`: the ABC's first check of
    `TensorInfo` walks every Mapping subclass loaded (about 0.1 ms of every
    new writer).
    """
    import tensorflow_datasets as tfds

    info = feature.get_tensor_info()
    return info if isinstance(info, tfds.features.TensorInfo) else None


def _tensor_info_dtype(feature: Any) -> np.dtype:
    if isinstance(feature, feature_defs.Tensor | feature_defs.Image):
        return feature.dtype
    info = _leaf_info(feature)
    return np.dtype(object) if info is None else np.dtype(info.np_dtype)


def compile_fields(features: Any) -> list[FieldSpec]:
    """Compiles an RLDS `FeaturesDict` into its leaf fields.

    Args:
      features: the dataset's top-level `FeaturesDict` (TFDS's or
        `store.features.feature_defs`') with a `steps` `Dataset` feature.

    Returns:
      The leaf fields, per-step fields first, in the features' own order.

    Raises:
      SpecError: if the features have no `steps` dataset.
    """
    if STEPS not in features or not _is_dataset(features[STEPS]):
        raise errors.SpecError(
            "RLDS features need a 'steps' tfds.features.Dataset at the top level, "
            f"got keys {sorted(features.keys())}"
        )
    _check_readable(features)
    fields = [_field_spec(node) for node in _walk(features) if not node.empty_dict]
    if any(_serialized_unknown(field) for field in fields):
        _check_serialized(features)
    for field in fields:
        _check_decodable(field)
    return fields


def empty_dict_paths(features: Any) -> list[tuple[str, ...]]:
    """Paths of empty `FeaturesDict`s (such as OXE's `episode_metadata: {}`).

    They have no leaf, so nothing is stored for them, but TFDS expects `{}`
    in the example and gives `{}` back: recorders accept that value there.
    """
    return [node.path for node in _walk(features) if node.empty_dict]


def _is_dict(feature: Any) -> bool:
    if isinstance(feature, feature_defs.FeaturesDict):
        return True
    if isinstance(feature, feature_defs.OWN_TYPES):
        return False
    import tensorflow_datasets as tfds

    return isinstance(feature, tfds.features.FeaturesDict)


def _is_dataset(feature: Any) -> bool:
    if isinstance(feature, feature_defs.OWN_TYPES):
        return isinstance(feature, feature_defs.Dataset)
    import tensorflow_datasets as tfds

    return isinstance(feature, tfds.features.Dataset)


def _walk(top: Any) -> list[feature_model.FeatureNode]:
    """`features.walk_features` over feature objects (TFDS's or `store.features.feature_defs`')."""

    def children(feature: Any, path: tuple[str, ...]) -> Mapping[str, Any] | None:
        return dict(feature.items()) if _is_dict(feature) else None

    def steps_feature(feature: Any, path: tuple[str, ...]) -> Any:
        return feature.feature if _is_dataset(feature) else None

    return list(feature_model.walk_features(dict(top.items()), children, steps_feature))


def _check_readable(features: Any) -> None:
    """Refuses features that TFDS would write but `as_dataset` could not read back.

    TFDS's reader (`example_parser`) handles at most one unknown dimension per
    serialized tensor unless it is a nested (ragged) sequence; a per-step
    `Tensor(shape=(None,))` becomes `(None, None)` inside `steps` and fails.
    A per-step tensor with a zero-sized dimension becomes a
    `FixedLenSequenceFeature` of empty elements, on which TensorFlow's parser
    dies with SIGFPE. A fixed-length `Sequence` or an empty `FeaturesDict` per
    step does not load either. This checks the structure; `_check_serialized`
    the shapes.
    """
    if feature_defs.is_own(features):
        # No Sequence among them; an empty dict per step is the one refusal.
        for node in _walk(features):
            if node.in_steps and node.empty_dict:
                raise errors.SpecError(
                    f"{node.key}: TFDS cannot read back an empty FeaturesDict inside steps (it "
                    "mixes sequence and context features); drop it, or keep empty dicts in "
                    "episode metadata"
                )
        return
    import tensorflow_datasets as tfds

    def per_step(feature: Any, path: str) -> None:
        # A fixed-length Sequence inside `steps` decodes in TFDS 4.9 to a
        # ragged tensor indexed with 'ragged_flat_values' and fails to load.
        if isinstance(feature, tfds.features.Sequence) and feature._length is not None:
            raise errors.SpecError(
                f"{path}: TFDS cannot read back a Sequence(length={feature._length}) inside "
                "steps; use Tensor(shape=(length, ...)) for a fixed length, or "
                "Sequence(...) without length"
            )
        if isinstance(feature, tfds.features.FeaturesDict) and not feature.keys():
            raise errors.SpecError(
                f"{path}: TFDS cannot read back an empty FeaturesDict inside steps (it "
                "mixes sequence and context features); drop it, or keep empty dicts in "
                "episode metadata"
            )
        if isinstance(feature, tfds.features.FeaturesDict | tfds.features.Sequence):
            children = (
                feature.items()
                if isinstance(feature, tfds.features.FeaturesDict)
                else [("", feature.feature)]
            )
            for name, sub in children:
                per_step(sub, f"{path}/{name}" if name else path)

    per_step(features[STEPS].feature, STEPS)


def _serialized_unknown(field: FieldSpec) -> bool:
    """Whether `_check_serialized` must look at the field's serialized shape.

    The kinds this package writes serialize as their own shape, fully known
    (numbers), or as one string (the rest); inside steps they gain one unknown
    dimension. So only other kinds, and numbers with a zero-sized dimension
    per step, can fail it: the check (and its import of `tree`, a few
    milliseconds of every new writer) is skipped for the rest.
    """
    if field.kind == FALLBACK:
        return True
    return field.in_steps and field.kind in (FLOAT, INT) and 0 in field.shape


def _check_serialized(features: Any) -> None:
    """The serialized-shape half of `_check_readable` (see there)."""
    from tensorflow_datasets.core import utils as tfds_utils

    flat = tfds_utils.flatten_nest_dict(features.get_serialized_info())
    for key, info in flat.items():
        shape = tuple(getattr(info, "shape", ()))
        if shape.count(None) > 1 and getattr(info, "sequence_rank", 0) <= 1:
            raise errors.SpecError(
                f"{key}: TFDS cannot read back a tensor with more than one unknown "
                f"dimension (serialized shape {shape}); a per-step Tensor with an unknown "
                "dimension needs Tensor(..., encoding='zlib') or encoding='bytes'"
            )
        if shape.count(None) == 1 and 0 in shape:
            raise errors.SpecError(
                f"{key}: TFDS cannot read back a tensor with an unknown and a zero-sized "
                f"dimension (serialized shape {shape}; TensorFlow's parser crashes on it); "
                "drop the field or use Tensor(..., encoding='bytes')"
            )


def _encoding_of(feature: Any) -> str:
    """A tensor's encoding, `none`, `bytes` or `zlib` (`none` for other features)."""
    if isinstance(feature, feature_defs.Tensor):
        return feature.encoding
    # TFDS's is an enum member (`Encoding.BYTES`), or missing on other features.
    return str(getattr(feature, "_encoding", "none")).lower().split(".")[-1]


def _check_decodable(field: FieldSpec) -> None:
    """Refuses encoded tensors whose dtype TensorFlow's `decode_raw` lacks (uint32)."""
    encoding = _encoding_of(field.feature)
    if encoding == "none":
        return
    if _tensor_info_dtype(field.feature) == np.uint32:
        raise errors.SpecError(
            f"{field.key}: TFDS cannot read back a uint32 Tensor with encoding "
            f"{encoding!r} through as_dataset (tf.io.decode_raw has no uint32); "
            "use encoding='none', or int64 / uint64"
        )


def _field_spec(node: feature_model.FeatureNode) -> FieldSpec:
    kind, shape, dtype = _classify(node.spec)
    return FieldSpec(
        path=node.path,
        key=node.key,
        feature=node.spec,
        kind=kind,
        in_steps=node.in_steps,
        shape=shape,
        dtype=dtype,
    )


def _classify(feature: Any) -> tuple[str, tuple, np.dtype | None]:
    """Returns (kind, shape, dtype) of a leaf feature."""
    if isinstance(feature, feature_defs.OWN_TYPES):
        return _classify_own(feature)
    import tensorflow_datasets as tfds

    if type(feature) is tfds.features.Text:
        return TEXT, (), None
    # Shapes and dtypes from the leaf's `TensorInfo`: the same as TFDS's `shape`
    # and `np_dtype` of a leaf, without their first use importing `tree` (~1.4 ms).
    info = _leaf_info(feature)
    if info is None:
        return FALLBACK, (), None
    shape = tuple(info.shape)
    dtype = np.dtype(info.np_dtype)
    if type(feature) is tfds.features.Image and _png_compatible(feature, shape, dtype):
        return PNG, shape, dtype
    if type(feature) is tfds.features.Image and _jpeg_compatible(feature, shape, dtype):
        return JPEG, shape, np.dtype(np.uint8)
    if type(feature) in (tfds.features.Tensor, tfds.features.Scalar):
        serialized = feature.get_serialized_info()
        simple = (
            isinstance(serialized, tfds.features.TensorInfo)
            and None not in shape
            and not info.optional
        )
        encoding = _encoding_of(feature)
        if dtype.kind in "SUO":
            if shape == () and simple and encoding == "none":
                return TEXT, (), None
            return FALLBACK, shape, None
        if simple and dtype.kind in "biuf" and dtype.itemsize <= 8:
            if encoding == "bytes":
                return BYTES, shape, dtype
            if encoding == "zlib":
                return ZLIB, shape, dtype
            if encoding == "none" and tuple(serialized.shape) == shape:
                return (FLOAT if dtype.kind == "f" else INT), shape, dtype
    return FALLBACK, shape, None


def _classify_own(feature: Any) -> tuple[str, tuple, np.dtype | None]:
    """`_classify` of a `store.features.feature_defs` leaf: TFDS's rules for the same feature.

    A tensor serializes as its own shape (encoding none) or as one string,
    every dimension known; `feature_defs.natively_written` keeps the kinds
    this table has no row for away from the writer.
    """
    if isinstance(feature, feature_defs.Text):
        return TEXT, (), None
    shape, dtype = feature.shape, feature.dtype
    if isinstance(feature, feature_defs.Image):
        if _png_compatible(feature, shape, dtype):
            return PNG, shape, dtype
        if _jpeg_compatible(feature, shape, dtype):
            return JPEG, shape, np.dtype(np.uint8)
    elif isinstance(feature, feature_defs.Tensor) and dtype.itemsize <= 8:
        kind = {"bytes": BYTES, "zlib": ZLIB}.get(feature.encoding)
        return kind or (FLOAT if dtype.kind == "f" else INT), shape, dtype
    raise errors.SpecError(f"no encoder here for {feature!r}; build it with TFDS's features")


def _png_compatible(feature: Any, shape: tuple, dtype: np.dtype) -> bool:
    """PNG is lossless, so any encoder decodes to the same pixels as TFDS's."""
    if feature.encoding_format != "png" or len(shape) != 3 or None in shape[-1:]:
        return False
    if dtype == np.float32:
        return shape[-1] == 1  # TFDS bitcasts to 4 uint8 channels
    return dtype in (np.uint8, np.uint16) and shape[-1] in (1, 2, 3, 4)


def _jpeg_compatible(feature: Any, shape: tuple, dtype: np.dtype) -> bool:
    return (
        feature.encoding_format == "jpeg"
        and dtype == np.uint8
        and len(shape) == 3
        and shape[-1] in (1, 3)
    )


def shape_fits(shape: tuple[int, ...], spec: tuple[int | None, ...]) -> bool:
    return len(shape) == len(spec) and all(d is None or d == s for s, d in zip(shape, spec))


def jpeg_quality_of(feature: Any) -> int:
    """The JPEG quality to encode a feature with.

    TFDS's `Image` has no quality setting (it uses TensorFlow's default, 95);
    `image_def` in `record.config` keeps the requested quality on the feature
    as `jpeg_quality` (a field of `feature_defs.Image`, an attribute of the
    TFDS `Image` made from one). It is not saved in `features.json`.
    """
    quality = getattr(feature, "jpeg_quality", None)
    return DEFAULT_JPEG_QUALITY if quality is None else int(quality)


def warn_float64(fields: list[FieldSpec]) -> list[str]:
    """Logs one warning if float64 fields would be stored as float32.

    Args:
      fields: the compiled fields.

    Returns:
      The keys of the affected fields.
    """
    lossy = [f.key for f in fields if f.kind == FLOAT and f.dtype == np.float64]
    if lossy:
        _log.warning(
            "float64 features %s are stored by TFDS as float32 (tf.train.Example has "
            "no double list) and lose precision; use tfds.features.Tensor(..., "
            "encoding='bytes') to keep all 64 bits.",
            ", ".join(lossy),
        )
    return lossy
