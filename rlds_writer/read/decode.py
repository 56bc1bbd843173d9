"""Decoding one episode's `tf.train.Example` into numpy, as TFDS decodes it.

`Decoder(features)` turns a record's bytes into a nested dict: `steps` holds
one array per field with a leading time axis; episode-level fields sit next
to it. Values and dtypes match `tfds.as_numpy(builder.as_dataset(...))`.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import DecodeError, UnsupportedFeatureError, pip_install
from rlds_writer.read import png
from rlds_writer.store import wire
from rlds_writer.store.features import IMAGE, NUMERIC, RAW, STRING, ZLIB, Features, Leaf

_log = logging.getLogger(__name__)


_JPEG_WARNED = []


def _decode_jpeg_like_tf(data: bytes, channels: int | None, leaf: Leaf) -> np.ndarray | None:
    """Decodes a JPEG exactly as `tf.image.decode_image` does, or None.

    TensorFlow decodes JPEGs with libjpeg-turbo's fast integer DCT and fancy
    upsampling; `simplejpeg` can do the same, Pillow cannot (it uses the
    accurate DCT, which differs by a few levels per pixel).
    """
    try:
        import simplejpeg
    except ImportError:
        if not _JPEG_WARNED:
            _JPEG_WARNED.append(True)
            _log.warning(
                "simplejpeg is not installed: JPEG images are decoded with Pillow and may "
                "differ from TensorFlow's decoding by a few levels per pixel "
                f"(the reader extra: {pip_install('reader')})"
            )
        return None
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    _check_size(height, width, leaf)
    if channels is None:
        channels = 1 if colorspace == "Gray" else 3
    if channels not in (1, 3):
        return None
    colorspace = "GRAY" if channels == 1 else "RGB"
    arr = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=True, fastupsample=False)
    return arr.reshape(arr.shape[0], arr.shape[1], channels)


def _decode_image(data: bytes, leaf: Leaf) -> np.ndarray:
    """Decodes one PNG/JPEG value; a file no decoder reads is a DecodeError naming the field."""
    try:
        return _decode_image_unchecked(data, leaf)
    except (DecodeError, UnsupportedFeatureError):
        raise
    except Exception as e:  # noqa: BLE001 - PIL and simplejpeg raise many types on bad files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DecodeError(f"{leaf.key}: not a readable image ({reason[:120]})") from e


# An image whose size the feature leaves open may have at most this many pixels
# (PIL's own bomb limit is twice as much, and only warns below it).
_MAX_PIXELS = 1 << 28


def _decode_image_unchecked(data: bytes, leaf: Leaf) -> np.ndarray:
    from PIL import Image

    channels = leaf.shape[-1]
    if data[:2] == b"\xff\xd8" and leaf.dtype == np.uint8:
        arr = _decode_jpeg_like_tf(data, channels, leaf)
        if arr is not None:
            return _check_image(arr, leaf)
    want = 4 if leaf.dtype == np.float32 else channels
    if png.bit_depth(data) == 16:  # Pillow has no 16-bit RGB, grey+alpha or RGBA
        parsed = png.parse(data, leaf.key)
        _check_size(parsed.height, parsed.width, leaf)
        arr = png.decode(parsed, want, leaf.key)
        if leaf.dtype != np.uint16:
            arr = (arr >> 8).astype(np.uint8)  # TensorFlow keeps the high byte
    else:
        with Image.open(io.BytesIO(data)) as img:
            _check_size(img.size[1], img.size[0], leaf)
            mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(want)
            if mode is None and img.mode == "P":
                mode = "RGBA" if "transparency" in img.info else "RGB"
            if mode is not None and img.mode != mode:
                img = img.convert(mode)
            arr = np.asarray(img, dtype=np.uint8)
        if leaf.dtype == np.uint16:
            arr = arr.astype(np.uint16) * 257  # as TensorFlow widens 8-bit samples
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if leaf.dtype == np.float32:  # 4 uint8 channels bitcast to one float32 channel
        if arr.shape[-1] != 4:
            raise DecodeError(f"{leaf.key}: a float32 image needs 4 channels, got {arr.shape}")
        arr = np.ascontiguousarray(arr).view(np.float32)
    return _check_image(arr, leaf)


def _check_size(height: int, width: int, leaf: Leaf) -> None:
    """Refuses an image of the wrong size from its header, before any pixel is decoded."""
    want_h, want_w = leaf.shape[0], leaf.shape[1]
    if (want_h is not None and height != want_h) or (want_w is not None and width != want_w):
        raise DecodeError(
            f"{leaf.key}: image is {height}x{width}, feature expects {leaf.describe()}"
        )
    if height * width > _MAX_PIXELS:
        raise DecodeError(
            f"{leaf.key}: image of {height}x{width} pixels is over the {_MAX_PIXELS} pixel limit"
        )


def _check_image(arr: np.ndarray, leaf: Leaf) -> np.ndarray:
    for want, got in zip(leaf.shape, arr.shape):
        if want is not None and want != got:
            raise DecodeError(
                f"{leaf.key}: image decoded to shape {arr.shape}, feature expects {leaf.shape}"
            )
    return np.array(arr, copy=True) if not arr.flags.writeable else arr


def _stack(key: str, items: list[np.ndarray], shape: tuple, dtype: np.dtype) -> Any:
    """Stacks per-step arrays; a list when their shapes differ."""
    if not items:
        return np.zeros((0,) + tuple(0 if d is None else d for d in shape), dtype)
    first = items[0].shape
    if all(x.shape == first for x in items):
        return np.stack(items)
    return items


class Decoder:
    """Decodes episode records for one dataset's features."""

    def __init__(self, features: Features):
        self.features = features
        self.step_leaves = features.step_leaves
        self.episode_leaves = features.episode_leaves
        self._count_leaf = self._pick_count_leaf()

    def _pick_count_leaf(self) -> Leaf | None:
        def rank(leaf: Leaf) -> int:
            if leaf.kind == NUMERIC:
                return 0 if leaf.wire_type == "float" else 1
            return 2 if leaf.kind == STRING else 3

        def countable(leaf: Leaf) -> bool:
            if leaf.kind in (NUMERIC, STRING):
                return leaf.static and leaf.size > 0
            return not leaf.dynamic  # one bytes entry per step, whatever its shape

        candidates = [leaf for leaf in self.step_leaves if countable(leaf)]
        if not candidates:
            return None
        return min(candidates, key=rank)

    def _per_step(self, leaf: Leaf) -> int:
        return leaf.size if leaf.kind in (NUMERIC, STRING) else 1

    def num_steps(self, buf: bytes, where: str = "") -> int:
        """Counts an episode's steps from one field, without decoding values."""
        leaf = self._count_leaf
        if leaf is None:
            return 0
        located = wire.parse_example(buf).get(leaf.key)
        if located is None:
            return 0
        return wire.count_values(buf, located) // self._per_step(leaf)

    def decode(self, buf: bytes, where: str = "") -> dict[str, Any]:
        """Decodes one serialized episode.

        Args:
          buf: the record bytes.
          where: `file, record i`, for error messages.

        Returns:
          The episode as a nested dict of numpy arrays.

        Raises:
          DecodeError: if the record does not match the features.
        """
        try:
            located = wire.parse_example(buf)
        except wire.WireError as e:
            raise DecodeError(f"{where}: not a tf.train.Example ({e})") from e
        out: dict[str, Any] = {}
        num_steps = None
        for leaf in self.step_leaves:
            try:
                if leaf.dynamic:
                    value = self._decode_dynamic(buf, located, leaf, True)
                else:
                    value = self._decode_steps(buf, located.get(leaf.key), leaf)
            except (wire.WireError, zlib.error, ValueError, IndexError, OverflowError) as e:
                if isinstance(e, DecodeError):
                    raise DecodeError(f"{where}: {e}") from e
                raise DecodeError(f"{where}: {leaf.key}: {e}") from e
            n = len(value)
            if num_steps is None:
                num_steps = n
            elif n != num_steps and leaf.size != 0:
                raise DecodeError(
                    f"{where}: {leaf.key} has {n} steps, other step fields have {num_steps}"
                )
            _put(out, leaf.path, value)
        if self.features.has_steps and "steps" not in out:
            out["steps"] = {}
        for leaf in self.episode_leaves:
            loc = located.get(leaf.key + "/value" if leaf.dynamic else leaf.key)
            if loc is None:
                raise DecodeError(f"{where}: feature {leaf.key!r} ({leaf.describe()}) is missing")
            try:
                if leaf.dynamic:
                    value = self._decode_dynamic(buf, located, leaf, False)
                else:
                    value = self._decode_value(buf, loc, leaf)
            except (wire.WireError, zlib.error, ValueError, IndexError, OverflowError) as e:
                if isinstance(e, DecodeError):
                    raise DecodeError(f"{where}: {e}") from e
                raise DecodeError(f"{where}: {leaf.key}: {e}") from e
            _put(out, leaf.path, value)
        for path in self.features.empty_dicts:
            _put(out, path, {})  # as TFDS gives them back
        return out

    def _numbers(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> np.ndarray:
        """The flat values of a numeric leaf, in its decoded dtype (a fresh array)."""
        if leaf.wire_type == "float":
            if loc is None or loc[0] == 0:
                return np.empty(0, leaf.dtype)
            wire.expect_list(leaf.key, loc, (wire.FLOAT_LIST,))
            flat = wire.float_list(buf, loc[1], loc[2])
            return flat.astype(leaf.dtype)  # astype copies: aligned and writable
        if loc is None or loc[0] == 0:
            return np.empty(0, leaf.dtype)
        wire.expect_list(leaf.key, loc, (wire.INT64_LIST,))
        flat = wire.int64_list(buf, loc[1], loc[2])
        if leaf.dtype == np.uint64:
            return flat.view(np.uint64)
        if leaf.dtype == np.int64:
            return flat
        return flat.astype(leaf.dtype)

    def _strings(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> list[bytes]:
        if loc is None or loc[0] == 0:
            return []
        wire.expect_list(leaf.key, loc, (wire.BYTES_LIST,))
        return wire.bytes_list(buf, loc[1], loc[2])

    def _decode_steps(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> Any:
        kind = leaf.kind
        if kind == NUMERIC:
            flat = self._numbers(buf, loc, leaf)
            return _reshape_steps(leaf, flat)
        if kind == STRING:
            items = self._strings(buf, loc, leaf)
            arr = np.empty(len(items), object)
            arr[:] = items
            return _reshape_steps(leaf, arr)
        if kind == RAW:
            dtype = leaf.dtype.newbyteorder("<")
            if loc is not None and loc[0] == wire.BYTES_LIST and leaf.static:
                rows = wire.fixed_bytes_list(buf, loc[1], loc[2])
                width = leaf.size * dtype.itemsize
                if rows is not None and (rows.shape[0] == 0 or rows.shape[1] == width):
                    out = rows.copy().view(dtype).reshape((rows.shape[0],) + leaf.shape)
                    return out.astype(leaf.dtype, copy=False)
            items = [self._raw(x, leaf) for x in self._strings(buf, loc, leaf)]
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        if kind == ZLIB:
            items = self._strings(buf, loc, leaf)
            if leaf.static:
                width = leaf.size * leaf.dtype.itemsize
                raws = []
                for i, item in enumerate(items):
                    raw = _inflate(item, width, leaf.key)
                    if len(raw) != width:
                        raise DecodeError(
                            f"{leaf.key}: step {i} holds {len(raw)} bytes, "
                            f"{leaf.describe()} needs {width}"
                        )
                    raws.append(raw)
                # Memory follows the data inflated, not the (possibly crafted) shape.
                out = np.frombuffer(b"".join(raws), leaf.dtype.newbyteorder("<"))
                return out.reshape((len(items),) + leaf.shape).astype(leaf.dtype)
            return _stack(
                leaf.key,
                [self._raw(_inflate(x, _bound(leaf, x), leaf.key), leaf) for x in items],
                leaf.shape,
                leaf.dtype,
            )
        if kind == IMAGE:
            items = [_decode_image(x, leaf) for x in self._strings(buf, loc, leaf)]
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        raise UnsupportedFeatureError(f"{leaf.key}: kind {kind}")

    def _decode_dynamic(
        self, buf: bytes, located: Mapping[str, tuple[int, int, int]], leaf: Leaf, in_steps: bool
    ) -> Any:
        """Decodes an encoded tensor stored as `<key>/value` plus `<key>/shape`."""
        values = self._strings(buf, located.get(leaf.key + "/value"), leaf)
        shape_loc = located.get(leaf.key + "/shape")
        rank = len(leaf.shape)
        shapes = np.empty(0, np.int64)
        if shape_loc is not None and shape_loc[0]:
            wire.expect_list(leaf.key + "/shape", shape_loc, (wire.INT64_LIST,))
            shapes = wire.int64_list(buf, shape_loc[1], shape_loc[2])
        if shapes.size != len(values) * rank:
            raise DecodeError(
                f"{leaf.key}: {len(values)} values but {shapes.size} shape entries (rank {rank})"
            )
        dtype = leaf.dtype.newbyteorder("<")
        items = []
        for data, shape in zip(values, shapes.reshape(len(values), rank)):
            expected = int(np.prod(shape, dtype=object)) * leaf.dtype.itemsize
            if any(int(d) < 0 for d in shape):
                raise DecodeError(f"{leaf.key}: stored shape {tuple(shape)} has a negative size")
            raw = _inflate(data, expected, leaf.key) if leaf.kind == ZLIB else data
            arr = np.frombuffer(raw, dtype).copy()
            try:
                items.append(arr.reshape(tuple(int(d) for d in shape)).astype(leaf.dtype))
            except ValueError as e:
                raise DecodeError(
                    f"{leaf.key}: {arr.size} values do not fit the stored shape {tuple(shape)}"
                ) from e
        if in_steps:
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        if len(items) != 1:
            raise DecodeError(f"{leaf.key}: expected one encoded value, got {len(items)}")
        return items[0]

    def _raw(self, data: bytes, leaf: Leaf) -> np.ndarray:
        dtype = leaf.dtype.newbyteorder("<")
        if len(data) % dtype.itemsize:
            raise DecodeError(
                f"{leaf.key}: {len(data)} bytes is not a whole number of {leaf.dtype.name} values"
            )
        arr = np.frombuffer(data, dtype).copy()
        try:
            return arr.reshape([-1 if d is None else d for d in leaf.shape])
        except ValueError as e:
            raise DecodeError(
                f"{leaf.key}: expected {leaf.describe()}, got {arr.size} values"
            ) from e

    def _decode_value(self, buf: bytes, loc: tuple[int, int, int], leaf: Leaf) -> Any:
        """Decodes an episode-level (non-step) value."""
        kind = leaf.kind
        target = [-1 if d is None else d for d in leaf.shape]
        if kind == NUMERIC:
            flat = self._numbers(buf, loc, leaf)
            if not leaf.shape:
                if flat.size != 1:
                    raise DecodeError(f"{leaf.key}: expected one value, got {flat.size}")
                return flat[0]
            return _reshape_value(leaf, flat, target)
        if kind == STRING:
            items = self._strings(buf, loc, leaf)
            if not leaf.shape:
                if len(items) != 1:
                    raise DecodeError(f"{leaf.key}: expected one string, got {len(items)}")
                return items[0]
            arr = np.empty(len(items), object)
            arr[:] = items
            return _reshape_value(leaf, arr, target)
        items = self._strings(buf, loc, leaf)
        if len(items) != 1:
            raise DecodeError(f"{leaf.key}: expected one encoded value, got {len(items)}")
        if kind == RAW:
            return self._raw(items[0], leaf)
        if kind == ZLIB:
            return self._raw(_inflate(items[0], _bound(leaf, items[0]), leaf.key), leaf)
        if kind == IMAGE:
            return _decode_image(items[0], leaf)
        raise UnsupportedFeatureError(f"{leaf.key}: kind {kind}")


# A zlib value whose size the features do not fix may inflate to at most this
# ratio of its stored bytes, or this many bytes: enough for real data (sparse
# masks, blank frames), while a bomb stops at a bounded cost.
_MAX_RATIO = 64
_MIN_BUDGET = 64 << 20
_MAX_INFLATE = 1 << 40


def _bound(leaf: Leaf, data: bytes) -> int:
    """The most bytes a zlib value of `leaf` may inflate to."""
    if leaf.static:
        return leaf.size * leaf.dtype.itemsize
    return max(_MIN_BUDGET, len(data) * _MAX_RATIO)


def _inflate(data: bytes, limit: int, key: str) -> bytes:
    """Decompresses at most `limit` bytes: a bomb costs no more memory than that."""
    if limit > _MAX_INFLATE:
        # A crafted shape may ask for more than zlib can count; no real value is that big.
        raise DecodeError(f"{key}: a zlib value of {limit} bytes is over the {_MAX_INFLATE} limit")
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, limit)
    if inflater.unconsumed_tail or not inflater.eof and inflater.decompress(b"", 1):
        raise DecodeError(f"{key}: a zlib value inflates past the {limit} bytes its feature holds")
    return out


def _reshape_steps(leaf: Leaf, flat: np.ndarray) -> np.ndarray:
    size = leaf.size
    if size == 0:
        return flat.reshape((0,) + leaf.shape)
    if flat.size % size:
        raise DecodeError(
            f"{leaf.key}: {flat.size} values is not a whole number of steps of {leaf.describe()}"
        )
    return flat.reshape((flat.size // size,) + leaf.shape)


def _reshape_value(leaf: Leaf, flat: np.ndarray, target: list[int]) -> np.ndarray:
    try:
        return flat.reshape(target)
    except ValueError as e:
        raise DecodeError(f"{leaf.key}: expected {leaf.describe()}, got {flat.size} values") from e


def drop_final_step(episode: dict[str, Any]) -> dict[str, Any]:
    """The episode without its final RLDS step, if that step is the `is_last` one.

    RLDS's final step holds the last observation with a zero action and
    reward: a training target nobody wants. Episodes whose last step is not
    marked `is_last` (or that have no flags) are returned unchanged.
    """
    steps = episode.get("steps")
    if not steps:
        return episode
    is_last = steps.get("is_last")
    if is_last is None or not len(is_last) or not bool(is_last[-1]):
        return episode
    return {**episode, "steps": map_tree(lambda column: column[:-1], steps)}


def _put(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def flatten(tree: Mapping[str, Any], prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    out = []
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.extend(flatten(v, prefix + (k,)))
        else:
            out.append((prefix + (k,), v))
    return out


def map_tree(fn: Any, tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: map_tree(fn, v) if isinstance(v, Mapping) else fn(v) for k, v in tree.items()}


def rows(tree: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Turns a nested dict of step columns into one nested dict per step."""
    keys = list(tree)
    columns = [rows(v) if isinstance(v, Mapping) else list(v) for v in tree.values()]
    return [dict(zip(keys, values)) for values in zip(*columns)]
