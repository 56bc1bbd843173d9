"""Encodes finished episodes into `tf.train.Example` wire bytes.

The dataset's `FeaturesDict` is compiled once into a list of leaf fields.
Common kinds (numeric `Tensor`s and scalars, `Tensor` with `BYTES`/`ZLIB`
encoding, `Text`) are written straight from numpy columns to protobuf wire
format; every other kind (images, class labels, ragged tensors, ...) goes
through TFDS's own `encode_example` and `ExampleSerializer`, and the two
halves are joined into one `Example`. Both halves decode, through TFDS, to the
values TFDS's own encoder would have produced.

Wire format reminder (tensorflow/core/example/{example,feature}.proto):
`Example{1: Features{1: map<string, Feature>}}`, where a map entry is
`{1: key, 2: value}` and `Feature` is one of `1: BytesList`, `2: FloatList`,
`3: Int64List`, each a `repeated ... value = 1` (packed for numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer import errors
from rlds_writer.store import image_processes
from rlds_writer.store.image_codecs import (
    DEFAULT_JPEG_QUALITY,
    encode_jpeg,
    encode_png,
    yield_cpu_to_caller,
)
from rlds_writer.store.wire import bytes_entries, bytes_entry_head, read_varint
from rlds_writer.store.wire import varint as _varint

_log = logging.getLogger(__name__)

# Kinds of leaf fields.
FLOAT = "float"  # Tensor of a float dtype, stored as float_list.
INT = "int"  # Tensor of an integer or bool dtype, stored as int64_list.
BYTES = "bytes"  # Tensor(encoding=BYTES): one bytes entry per value.
ZLIB = "zlib"  # Tensor(encoding=ZLIB): zlib-compressed raw bytes per value.
TEXT = "text"  # Text or string scalar: one utf-8 bytes entry per value.
PNG = "png"  # Image(encoding_format="png"), uint8/uint16/float32: PNG-encoded by us.
JPEG = "jpeg"  # Image(encoding_format="jpeg") of uint8: JPEG-encoded by us (Pillow).

FALLBACK = "fallback"  # Anything else: TFDS's own encoder.

STEPS = "steps"


class RowBytes:
    """A per-step tensor column kept as one raw-bytes row per step.

    Bytes-encoded tensors are stored exactly as these rows, so the encoder
    writes them without stacking them into one array first.

    Attributes:
      rows: one `bytes` per step (C order, the field's dtype).
      shape: the shape of one step's value.
      dtype: the field's dtype.
    """

    __slots__ = ("rows", "shape", "dtype")

    def __init__(self, rows: list[bytes], shape: tuple[int, ...], dtype: np.dtype):
        self.rows = rows
        self.shape = shape
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.rows)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        flat = np.frombuffer(b"".join(self.rows), dtype=self.dtype)
        arr = flat.reshape((len(self.rows),) + tuple(self.shape))
        return arr if dtype is None else arr.astype(dtype)


class ChunkedRows:
    """A column of large rows kept in fixed-size chunks (the recorder grows by chunks).

    Growing by chunks never copies rows already recorded, so no step stalls on
    a reallocation; the encoder takes the rows chunk by chunk, and only
    `__array__` (on the writer thread) joins them into one array.

    Attributes:
      chunks: arrays of shape `(rows, *shape)`; the last may be partly used.
      n: number of rows.
    """

    __slots__ = ("chunks", "n")

    def __init__(self, chunks: list[np.ndarray], n: int):
        self.chunks = chunks
        self.n = n

    def __len__(self) -> int:
        return self.n

    def parts(self) -> list[np.ndarray]:
        """The used part of each chunk, in order."""
        out, left = [], self.n
        for chunk in self.chunks:
            if left <= 0:
                break
            out.append(chunk[:left])
            left -= len(out[-1])
        return out

    def __getitem__(self, i: int) -> np.ndarray:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        i %= self.n
        rows = len(self.chunks[0])
        return self.chunks[i // rows][i % rows]

    def __iter__(self) -> Any:
        for part in self.parts():
            yield from part

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        parts = self.parts()
        arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return arr if dtype is None else arr.astype(dtype)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One leaf of the dataset's features.

    Attributes:
      path: path of the leaf inside the episode, e.g. `('steps', 'observation')`.
      key: the flat `tf.train.Example` key, e.g. `'steps/observation'`.
      feature: the TFDS feature connector of the leaf.
      kind: how it is encoded (one of the module-level kind constants).
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

    def zero(self) -> Any:
        """Returns the zero value of the field: used for the final step's action."""
        return zero_value(self.feature)


def zero_value(feature: Any) -> Any:
    """Returns a zero value for a TFDS feature, built from its spec.

    Args:
      feature: a TFDS feature connector (`FeaturesDict`, `Tensor`, `Text`, ...).

    Returns:
      A nested dict of numpy zeros of the feature's dtype and shape; an empty
      string for text; unknown dimensions are given length 0.
    """
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.FeaturesDict):
        return {k: zero_value(v) for k, v in feature.items()}
    if isinstance(feature, tfds.features.Text):
        return ""
    info = feature.get_tensor_info()
    if isinstance(info, Mapping):
        raise errors.SpecError(f"cannot build a zero value for feature {feature!r}")
    shape = tuple(0 if d is None else d for d in info.shape)
    dtype = info.np_dtype
    if dtype == np.object_ or np.dtype(dtype).kind in "SUO":
        if shape == ():
            return b""
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=dtype)


def _tensor_info_dtype(feature: Any) -> np.dtype:
    info = feature.get_tensor_info()
    if isinstance(info, Mapping):
        return np.dtype(object)
    return np.dtype(info.np_dtype)


def compile_fields(features: Any) -> list[FieldSpec]:
    """Compiles an RLDS `FeaturesDict` into its leaf fields.

    Args:
      features: the dataset's top-level `tfds.features.FeaturesDict` with a
        `steps` `Dataset` feature.

    Returns:
      The leaf fields, per-step fields first, in the features' own order.

    Raises:
      SpecError: if the features have no `steps` dataset.
    """
    import tensorflow_datasets as tfds

    if STEPS not in features or not isinstance(features[STEPS], tfds.features.Dataset):
        raise errors.SpecError(
            "RLDS features need a 'steps' tfds.features.Dataset at the top level, "
            f"got keys {sorted(features.keys())}"
        )
    _check_readable(features)
    fields: list[FieldSpec] = []
    _walk(features[STEPS].feature, (STEPS,), True, fields)
    for name, sub in features.items():
        if name != STEPS:
            _walk(sub, (name,), False, fields)
    for field in fields:
        _check_decodable(field)
    return fields


def empty_dict_paths(features: Any) -> list[tuple[str, ...]]:
    """Paths of empty `FeaturesDict`s (such as OXE's `episode_metadata: {}`).

    They have no leaf, so nothing is stored for them, but TFDS expects `{}`
    in the example and gives `{}` back: recorders accept that value there.
    """
    import tensorflow_datasets as tfds

    out: list[tuple[str, ...]] = []

    def walk(feature: Any, path: tuple[str, ...]) -> None:
        if isinstance(feature, tfds.features.FeaturesDict):
            if not feature.keys():
                out.append(path)
            for name, sub in feature.items():
                walk(sub, path + (name,))

    for name, sub in features.items():
        walk(sub.feature if name == STEPS else sub, (name,))
    return out


def _check_readable(features: Any) -> None:
    """Refuses features that TFDS would write but `as_dataset` could not read back.

    TFDS's reader (`example_parser`) handles at most one unknown dimension per
    serialized tensor unless it is a nested (ragged) sequence; a per-step
    `Tensor(shape=(None,))` becomes `(None, None)` inside `steps` and fails.
    A per-step tensor with a zero-sized dimension becomes a
    `FixedLenSequenceFeature` of empty elements, on which TensorFlow's parser
    dies with SIGFPE. A fixed-length `Sequence` or an empty `FeaturesDict` per
    step does not load either.
    """
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import utils as tfds_utils

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


def _check_decodable(field: FieldSpec) -> None:
    """Refuses encoded tensors whose dtype TensorFlow's `decode_raw` lacks (uint32)."""
    encoding = str(getattr(field.feature, "_encoding", "none")).lower()
    if encoding.endswith("none"):
        return
    if _tensor_info_dtype(field.feature) == np.uint32:
        raise errors.SpecError(
            f"{field.key}: TFDS cannot read back a uint32 Tensor with encoding "
            f"{encoding.split('.')[-1]!r} through as_dataset (tf.io.decode_raw has no uint32); "
            "use encoding='none', or int64 / uint64"
        )


def _walk(feature: Any, path: tuple[str, ...], in_steps: bool, out: list[FieldSpec]) -> None:
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.FeaturesDict):
        for name, sub in feature.items():
            _walk(sub, path + (name,), in_steps, out)
        return
    kind, shape, dtype = _classify(feature)
    out.append(
        FieldSpec(
            path=path,
            key="/".join(path),
            feature=feature,
            kind=kind,
            in_steps=in_steps,
            shape=shape,
            dtype=dtype,
        )
    )


def _classify(feature: Any) -> tuple[str, tuple, np.dtype | None]:
    """Returns (kind, shape, dtype) of a leaf feature."""
    import tensorflow_datasets as tfds

    if type(feature) is tfds.features.Text:
        return TEXT, (), None
    if type(feature) is tfds.features.Image and _png_compatible(feature):
        return PNG, tuple(feature.shape), np.dtype(feature.np_dtype)
    if type(feature) is tfds.features.Image and _jpeg_compatible(feature):
        return JPEG, tuple(feature.shape), np.dtype(np.uint8)
    if type(feature) in (tfds.features.Tensor, tfds.features.Scalar):
        shape = tuple(feature.shape)
        info = feature.get_tensor_info()
        dtype = np.dtype(info.np_dtype)
        serialized = feature.get_serialized_info()
        simple = not isinstance(serialized, Mapping) and None not in shape and not info.optional
        encoding = str(getattr(feature, "_encoding", "none")).lower()
        if dtype.kind in "SUO":
            if shape == () and simple and encoding.endswith("none"):
                return TEXT, (), None
            return FALLBACK, shape, None
        if simple and dtype.kind in "biuf" and dtype.itemsize <= 8:
            if encoding.endswith("bytes"):
                return BYTES, shape, dtype
            if encoding.endswith("zlib"):
                return ZLIB, shape, dtype
            if encoding.endswith("none") and tuple(serialized.shape) == shape:
                return (FLOAT if dtype.kind == "f" else INT), shape, dtype
    info = feature.get_tensor_info()
    if isinstance(info, Mapping):
        return FALLBACK, (), None
    return FALLBACK, tuple(info.shape), None


def _png_compatible(feature: Any) -> bool:
    """PNG is lossless, so any encoder decodes to the same pixels as TFDS's."""
    shape = tuple(feature.shape)
    if feature.encoding_format != "png" or len(shape) != 3 or None in shape[-1:]:
        return False
    dtype = np.dtype(feature.np_dtype)
    if dtype == np.float32:
        return shape[-1] == 1  # TFDS bitcasts to 4 uint8 channels
    return dtype in (np.uint8, np.uint16) and shape[-1] in (1, 2, 3, 4)


def _jpeg_compatible(feature: Any) -> bool:
    shape = tuple(feature.shape)
    return (
        feature.encoding_format == "jpeg"
        and np.dtype(feature.np_dtype) == np.uint8
        and len(shape) == 3
        and shape[-1] in (1, 3)
    )


def _shape_fits(shape: tuple[int, ...], spec: tuple[int | None, ...]) -> bool:
    return len(shape) == len(spec) and all(d is None or d == s for s, d in zip(shape, spec))


def jpeg_quality_of(feature: Any) -> int:
    """The JPEG quality to encode a feature with.

    TFDS's `Image` has no quality setting (it uses TensorFlow's default, 95);
    `image_feature` in `record.spaces` stores the requested quality on the
    feature object as `jpeg_quality`. It is not saved in `features.json`.
    """
    return int(getattr(feature, "jpeg_quality", DEFAULT_JPEG_QUALITY))


# --------------------------------------------------------------------------
# Protobuf wire primitives.


_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_POSITIONS = np.arange(10)


def encode_varints(values: np.ndarray) -> bytes:
    """Encodes int64 values as concatenated protobuf varints, vectorised.

    Negative values take 10 bytes (two's complement), as protobuf does.

    Args:
      values: an integer array (any shape); it is read as int64.

    Returns:
      The packed varint bytes.
    """
    if isinstance(values, np.ndarray) and values.dtype == np.bool_:
        # 0 and 1 are one-byte varints: the bools' own bytes (tobytes is C order).
        return values.tobytes()
    u = np.ascontiguousarray(values, dtype=np.int64).reshape(-1).view(np.uint64)
    if u.size == 0:
        return b""
    if int(u.max()) < 0x80:
        return u.astype(np.uint8).tobytes()
    groups = (u[:, None] >> _SHIFTS[None, :]) & np.uint64(0x7F)
    nonzero = groups != 0
    length = 10 - np.argmax(nonzero[:, ::-1], axis=1)
    length[~nonzero.any(axis=1)] = 1
    cont = _POSITIONS[None, :] < (length[:, None] - 1)
    out = (groups | (cont.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
    return out[_POSITIONS[None, :] < length[:, None]].tobytes()


def _len_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def bytes_feature(items: list[bytes]) -> bytes:
    """Returns serialized `Feature{bytes_list}` bytes for the items."""
    inner = bytes_entries(items)
    return _len_delimited(b"\x0a", inner)


def _bytes_list_of_entries(pieces: list[bytes]) -> tuple[list[Any], int]:
    """`Feature{bytes_list}` around `BytesList` entries given in pieces: (parts, length)."""
    inner = sum(map(len, pieces))
    head = b"\x0a" + _varint(inner)
    return [head, *pieces], len(head) + inner


def bytes_list_parts(items: list[bytes]) -> tuple[list[Any], int]:
    """`bytes_feature` as parts, without copying large items: (parts, total length)."""
    if items and sum(map(len, items)) < _ROW_PARTS_MIN * len(items):
        out = bytes_feature(items)
        return [out], len(out)
    pieces = []
    for item in items:
        pieces.append(bytes_entry_head(len(item)))
        pieces.append(item)
    return _bytes_list_of_entries(pieces)


def _read_only(arr: np.ndarray) -> np.ndarray:
    """A read-only view: parts are hashed by CRC32C, which takes read-only buffers."""
    view = arr.view()
    view.setflags(write=False)
    return view


# Rows at least this large are written as separate parts (no interleave copy).
_ROW_PARTS_MIN = 4096


def _row_bytes_parts(rows: list[bytes]) -> tuple[list[Any], int]:
    """`bytes_feature` of equal-length rows given as bytes, without copying them."""
    if not rows:
        out = _len_delimited(b"\x0a", b"")
        return [out], len(out)
    width = len(rows[0])
    row_header = b"\x0a" + _varint(width)
    inner_len = len(rows) * (len(row_header) + width)
    head = b"\x0a" + _varint(inner_len)
    if width < _ROW_PARTS_MIN:
        body = row_header + row_header.join(rows)
        return [head, body], len(head) + inner_len
    parts: list[Any] = [head]
    for row in rows:
        parts.append(row_header)
        parts.append(row)
    return parts, len(head) + inner_len


def _fixed_bytes_parts(rows: np.ndarray | ChunkedRows) -> tuple[list[Any], int]:
    """`bytes_feature` for equal-length rows, as parts: (parts, total length)."""
    if isinstance(rows, ChunkedRows):
        chunks = rows.parts()
        if len(chunks) > 1 and chunks[0][0].nbytes >= _ROW_PARTS_MIN:
            return _row_bytes_parts([_read_only(r.reshape(-1).view(np.uint8)) for r in rows])
        rows = np.asarray(rows)
    n = rows.shape[0]
    width = int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.dtype.itemsize
    if n == 0:
        out = _len_delimited(b"\x0a", b"")
        return [out], len(out)
    row_header = b"\x0a" + _varint(width)
    inner_len = n * (len(row_header) + width)
    head = b"\x0a" + _varint(inner_len)
    flat = np.ascontiguousarray(rows).reshape(n, -1).view(np.uint8)  # (n, width) bytes
    if width >= _ROW_PARTS_MIN:
        parts: list[Any] = [head]
        rows_ro = _read_only(flat)
        for i in range(n):
            parts.append(row_header)
            parts.append(rows_ro[i])
        return parts, len(head) + inner_len
    header = np.frombuffer(row_header, dtype=np.uint8)
    out = np.empty((n, header.size + width), dtype=np.uint8)
    out[:, : header.size] = header
    out[:, header.size :] = flat
    return [head, out.tobytes()], len(head) + inner_len


@functools.lru_cache(maxsize=4096)
def _map_entry_header(key: bytes, feature_len: int) -> bytes:
    """The bytes of a map entry that precede its `Feature` value.

    Cached: with fixed-shape fields and recurring episode lengths, the same
    (key, length) pairs come back episode after episode.
    """
    key_part = _len_delimited(b"\x0a", key)
    value_head = b"\x12" + _varint(feature_len)
    entry_len = len(key_part) + len(value_head) + feature_len
    return b"\x0a" + _varint(entry_len) + key_part + value_head


def example_entries(example_bytes: bytes) -> bytes:
    """Strips the `Example` and `Features` headers, leaving the map entries."""
    if not example_bytes:
        return b""
    if example_bytes[0] != 0x0A:
        raise errors.EncodingError("unexpected tf.train.Example layout from TFDS serializer")
    length, pos = read_varint(example_bytes, 1)
    if pos + length != len(example_bytes):
        raise errors.EncodingError("unexpected tf.train.Example layout from TFDS serializer")
    return example_bytes[pos:]


# --------------------------------------------------------------------------
# Encoding one field.


def _as_text_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8")


@functools.lru_cache(maxsize=4096)
def _packed_head(tag: bytes, payload_len: int) -> bytes:
    """The bytes of `Feature{<tag>: List{packed}}` before a payload of `payload_len` bytes.

    Cached like `_map_entry_header`: a fixed-shape field's payload length
    recurs with the episode length.
    """
    inner_head = b"\x0a" + _varint(payload_len)
    return tag + _varint(len(inner_head) + payload_len) + inner_head


def _packed_parts(tag: bytes, payload: Any, payload_len: int) -> tuple[list[Any], int]:
    """Parts of `Feature{<tag>: List{packed payload}}`."""
    if payload_len == 0:
        out = tag + b"\x00"
        return [out], len(out)
    head = _packed_head(tag, payload_len)
    return [head, payload], len(head) + payload_len


def encode_field_parts(field: FieldSpec, values: Any) -> tuple[list[Any], int]:
    """Encodes a column (per-step field) or a single value (episode field).

    Args:
      field: the field.
      values: for a fast-path per-step field, an array with a leading step axis
        of the field's dtype (a list of str/bytes for text); for an episode-level
        field, one value already cast to the field's dtype.

    Returns:
      The serialized `Feature` (without the map entry around it) as a list of
      bytes-like parts, and its total length.
    """
    kind = field.kind
    if kind == FLOAT:
        payload = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        return _packed_parts(b"\x12", _read_only(payload.view(np.uint8)), payload.nbytes)
    if kind == INT:
        arr = np.asarray(values)
        if arr.dtype == np.uint64:
            arr = arr.view(np.int64)
        payload = encode_varints(arr)
        return _packed_parts(b"\x1a", payload, len(payload))
    if kind == BYTES and field.in_steps:
        if isinstance(values, RowBytes):
            return _row_bytes_parts(values.rows)
        return _fixed_bytes_parts(np.asarray(values))
    if kind == TEXT:
        items = [_as_text_bytes(v) for v in values] if field.in_steps else [_as_text_bytes(values)]
    elif kind == BYTES:
        items = [np.asarray(values).tobytes()]
    elif kind == ZLIB:
        arr = np.asarray(values)
        items = (
            [zlib.compress(row.tobytes()) for row in arr]
            if field.in_steps
            else [zlib.compress(arr.tobytes())]
        )
    else:
        raise errors.EncodingError(f"{field.key}: kind {kind} has no direct encoder")
    out = bytes_feature(items)
    return [out], len(out)


class EpisodeEncoder:
    """Turns finished episodes into serialized `tf.train.Example` bytes.

    Args:
      features: the dataset's `tfds.features.FeaturesDict` (RLDS layout).
      image_workers: PNG/JPEG frames are encoded in this many processes (on
        Linux; elsewhere, or if a process is lost, in this many threads), and
        other TFDS-encoded fields in this many threads; 0 encodes everything
        on the calling thread.
    """

    def __init__(self, features: Any, image_workers: int = 0):
        self.features = features
        self.fields = compile_fields(features)
        self.empty_dicts = empty_dict_paths(features)
        self.step_fields = [f for f in self.fields if f.in_steps]
        self.episode_fields = [f for f in self.fields if not f.in_steps]
        self._keys = {f.key: f.key.encode("utf-8") for f in self.fields}
        self._fallback = [f for f in self.fields if f.kind == FALLBACK]
        self._fallback_serializers: dict[str, Any] = {}
        self._pool = None
        self._processes: image_processes.ImageProcessPool | None = None
        if (
            image_workers
            and any(f.in_steps and f.kind in (PNG, JPEG) for f in self.fields)
            and image_processes.supported()
        ):
            self._processes = image_processes.ImageProcessPool(image_workers)
        if image_workers and any(
            f.in_steps and f.kind in (FALLBACK, PNG, JPEG) for f in self.fields
        ):
            from concurrent.futures import ThreadPoolExecutor

            self._workers = image_workers
            self._pool = ThreadPoolExecutor(
                image_workers,
                thread_name_prefix="rlds_writer_encode",
                initializer=yield_cpu_to_caller,
            )

    def close(self) -> None:
        if self._processes is not None:
            self._processes.close()
            self._processes = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def encode(self, columns: Mapping[str, Any], episode_values: Mapping[str, Any]) -> bytes:
        """Encodes one episode.

        Args:
          columns: per-step field key -> column (array with a leading step axis,
            or a list of values for text and fallback fields).
          episode_values: episode-level field key -> value.

        Returns:
          The serialized `tf.train.Example`.
        """
        parts, _ = self.encode_parts(columns, episode_values)
        return b"".join(parts)

    def encode_parts(
        self, columns: Mapping[str, Any], episode_values: Mapping[str, Any]
    ) -> tuple[list[Any], int]:
        """Like `encode`, as bytes-like parts (no large copies) and their total length."""
        entries: list[Any] = []
        total = 0
        images = self._encode_images_in_processes(columns) if self._processes else {}
        for field in self.fields:
            values = columns[field.key] if field.in_steps else episode_values[field.key]
            if field.kind == FALLBACK:
                entry = self._encode_fallback(field, values)
                entries.append(entry)
                total += len(entry)
                continue
            try:
                if field.key in images:
                    feature_parts, feature_len = _bytes_list_of_entries(images[field.key])
                elif field.kind in (PNG, JPEG):
                    feature_parts, feature_len = self._encode_image_field(field, values)
                else:
                    feature_parts, feature_len = encode_field_parts(field, values)
            except Exception as e:  # noqa: BLE001
                raise errors.EncodingError(f"{field.key}: could not encode ({e})") from e
            header = _map_entry_header(self._keys[field.key], feature_len)
            entries.append(header)
            entries.extend(feature_parts)
            total += len(header) + feature_len
        head = b"\x0a" + _varint(total)
        return [head, *entries], len(head) + total

    def _encode_images_in_processes(self, columns: Mapping[str, Any]) -> dict[str, list[bytes]]:
        """Encodes the frame columns of every image field at once, in the worker processes.

        Returns:
          Field key -> its frames as `BytesList` entries in pieces, for the
          fields whose column is frames of the field's dtype and shape (others,
          such as paths or encoded bytes, are left to `_encode_image_field`);
          {} if the workers are lost.
        """
        keys, jobs = [], []
        for field in self.step_fields:
            if field.kind not in (PNG, JPEG):
                continue
            values = columns[field.key]
            parts = values.parts() if isinstance(values, ChunkedRows) else [values]
            if sum(map(len, parts)) < 2 or not all(
                isinstance(p, np.ndarray)
                and p.dtype == field.dtype
                and _shape_fits(p.shape[1:], field.shape)
                for p in parts
            ):
                continue
            quality = jpeg_quality_of(field.feature) if field.kind == JPEG else 0
            keys.append(field.key)
            jobs.append((field.kind, quality, parts))
        if not jobs:
            return {}
        try:
            encoded = self._processes.encode(jobs)
        except image_processes.BatchFailed as e:
            raise errors.EncodingError(f"{keys[e.job]}: could not encode ({e})") from e
        except image_processes.WorkersLost as e:
            # The episode is not lost: encode it (and the next ones) here.
            _log.warning("%s; encoding images in the recording process from now on", e)
            self._processes.close()
            self._processes = None
            return {}
        return dict(zip(keys, encoded))

    def _encode_image_field(self, field: FieldSpec, values: Any) -> tuple[list[Any], int]:
        if field.kind == JPEG:
            quality = jpeg_quality_of(field.feature)

            def encode_array(value: np.ndarray) -> bytes:
                return encode_jpeg(value, quality)
        else:
            encode_array = encode_png

        def encode_one(value: Any) -> bytes:
            if isinstance(value, np.ndarray):
                if value.dtype != field.dtype or not _shape_fits(value.shape, field.shape):
                    raise ValueError(
                        f"expected an image {field.describe()}, got "
                        f"{value.dtype.name}[{','.join(map(str, value.shape))}]"
                    )
                return encode_array(value)
            return field.feature.encode_example(value)  # a path, file or encoded bytes

        items = values if field.in_steps else [values]
        if self._pool is not None and len(items) > 1:
            # Batches, not one task per image: a task's hand-over holds the GIL
            # for about as long as encoding a small image takes without it.
            rows = list(items)
            size = max(1, len(rows) // (4 * self._workers))
            batches = [rows[i : i + size] for i in range(0, len(rows), size)]
            encoded = [
                data
                for batch in self._pool.map(lambda b: [encode_one(v) for v in b], batches)
                for data in batch
            ]
        else:
            encoded = [encode_one(v) for v in items]
        return bytes_list_parts(encoded)

    def _sequence_info(self, field: FieldSpec) -> Any:
        import tensorflow_datasets as tfds

        return tfds.features.Sequence(field.feature).get_serialized_info()

    def _encode_fallback(self, field: FieldSpec, values: Any) -> bytes:
        """Encodes one field through TFDS's own encoder and serializer."""
        import tree
        from tensorflow_datasets.core import example_serializer
        from tensorflow_datasets.core.features import sequence_feature

        feature = field.feature
        try:
            if field.in_steps:
                if self._pool is not None and len(values) > 1:
                    encoded = list(self._pool.map(feature.encode_example, values))
                else:
                    encoded = [feature.encode_example(v) for v in values]
                info = self._sequence_info(field)
                if encoded:
                    encoded = sequence_feature.stack_nested(encoded)
                else:
                    encoded = tree.map_structure(sequence_feature.build_empty_np, info)
            else:
                encoded = feature.encode_example(values)
                info = feature.get_serialized_info()
        except Exception as e:  # noqa: BLE001
            raise errors.EncodingError(f"{field.key}: TFDS could not encode the value ({e})") from e
        serializer = self._fallback_serializers.get(field.key)
        if serializer is None:
            serializer = example_serializer.ExampleSerializer(_nest(field.path, info))
            self._fallback_serializers[field.key] = serializer
        return example_entries(serializer.serialize_example(_nest(field.path, encoded)))


def _nest(path: tuple[str, ...], value: Any) -> Any:
    for name in reversed(path):
        value = {name: value}
    return value


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
