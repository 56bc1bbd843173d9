"""Decoding one episode's `tf.train.Example` into numpy, as TFDS decodes it.

`Decoder(features)` turns a record's bytes into a nested dict: `steps` holds
one array per field with a leading time axis; episode-level fields sit next
to it. Values and dtypes match `tfds.as_numpy(builder.as_dataset(...))`.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Container, Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import DecodeError, UnsupportedFeatureError
from rlds_writer.read.images import check_field, check_stored, decode_image
from rlds_writer.read.lazy_steps import LazySteps
from rlds_writer.read.nest import map_tree, put
from rlds_writer.store.features import wire
from rlds_writer.store.features.features import BYTES, TEXT, ZLIB, Features, Leaf


def wanted_by(key: str, field: str) -> bool:
    """Whether the leaf `key` is `field` or lies below it."""
    return key == field or key.startswith(field + "/")


def _stack(key: str, items: list[np.ndarray], shape: tuple, dtype: np.dtype) -> Any:
    """Stacks per-step arrays; a list when their shapes differ."""
    if not items:
        return np.zeros((0,) + tuple(0 if d is None else d for d in shape), dtype)
    first = items[0].shape
    if all(x.shape == first for x in items):
        return np.stack(items)
    return items


class Decoder:
    """Decodes episode records for one dataset's features.

    Args:
      features: the dataset's features.
      fields: the keys to decode (`steps/observation`, `episode_metadata/seed`; a
        key also selects the leaves below it), or None for every field. The
        others are never decoded: an image left out costs nothing.

    Raises:
      ValueError: a key in `fields` that names no feature.
    """

    def __init__(self, features: Features, fields: Collection[str] | None = None):
        self.features = features
        self.step_leaves = features.step_leaves
        self.episode_leaves = features.episode_leaves
        self._empty_dicts = list(features.empty_dicts)
        if fields is not None:
            self._select(set(fields))
        self._count_leaf = self._pick_count_leaf()

    def _select(self, fields: set[str]) -> None:
        def wanted(key: str) -> bool:
            return any(wanted_by(key, f) for f in fields)

        leaves = self.step_leaves + self.episode_leaves
        unknown = sorted(f for f in fields if not any(wanted_by(leaf.key, f) for leaf in leaves))
        if unknown:
            known = ", ".join(leaf.key for leaf in leaves)
            raise ValueError(
                f"field {unknown[0]!r} is not in the dataset's features (it has {known}); "
                "name fields by their path, e.g. 'steps/observation'"
            )
        self.step_leaves = [leaf for leaf in self.step_leaves if wanted(leaf.key)]
        self.episode_leaves = [leaf for leaf in self.episode_leaves if wanted(leaf.key)]
        self._empty_dicts = [p for p in self._empty_dicts if wanted("/".join(p))]

    def _pick_count_leaf(self) -> Leaf | None:
        def rank(leaf: Leaf) -> int:
            if leaf.is_numeric:
                return 0 if leaf.wire_type == "float" else 1
            return 2 if leaf.kind == TEXT else 3

        def countable(leaf: Leaf) -> bool:
            if leaf.is_numeric or leaf.kind == TEXT:
                return leaf.static and leaf.size > 0
            return not leaf.dynamic  # one bytes entry per step, whatever its shape

        candidates = [leaf for leaf in self.step_leaves if countable(leaf)]
        if not candidates:
            return None
        return min(candidates, key=rank)

    def _per_step(self, leaf: Leaf) -> int:
        return leaf.size if leaf.is_numeric or leaf.kind == TEXT else 1

    def num_steps(self, buf: bytes, where: str = "") -> int:
        """Counts an episode's steps from one field, without decoding values."""
        leaf = self._count_leaf
        if leaf is None:
            return 0
        located = wire.parse_example(buf).get(leaf.key)
        if located is None:
            return 0
        return wire.count_values(buf, located) // self._per_step(leaf)

    def decode(
        self,
        buf: bytes,
        where: str = "",
        lazy: Container[str] = (),
        encoded: Container[str] = (),
    ) -> dict[str, Any]:
        """Decodes one serialized episode.

        Args:
          buf: the record bytes.
          where: `file, record i`, for error messages.
          lazy: keys of step fields to give as `LazySteps` (each step decoded
            when it is asked for, nothing kept) instead of whole arrays.
          encoded: keys of `Image` step fields to give as their stored PNG/JPEG
            bytes (an object array, one value per step), each checked from its
            header as `decode_image` checks it, nothing decoded.

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
                if leaf.key in encoded and leaf.is_image and not leaf.dynamic:
                    value = self._encoded_images(buf, located.get(leaf.key), leaf)
                elif leaf.key in lazy and not leaf.dynamic:
                    value = self._lazy_steps(buf, located.get(leaf.key), leaf, where)
                elif leaf.dynamic:
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
            put(out, leaf.path, value)
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
            put(out, leaf.path, value)
        for path in self._empty_dicts:
            put(out, path, {})  # as TFDS gives them back
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
        if leaf.is_numeric:
            flat = self._numbers(buf, loc, leaf)
            return _reshape_steps(leaf, flat)
        if kind == TEXT:
            items = self._strings(buf, loc, leaf)
            arr = np.empty(len(items), object)
            arr[:] = items
            return _reshape_steps(leaf, arr)
        if kind == BYTES:
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
        if leaf.is_image:
            values = self._strings(buf, loc, leaf)
            if leaf.shape[0] is None or leaf.shape[1] is None:
                check_field(values, leaf)  # what they cost together, before decoding any
            items = [decode_image(x, leaf) for x in values]
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        raise UnsupportedFeatureError(f"{leaf.key}: kind {kind}")

    def _encoded_images(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> Any:
        values = self._strings(buf, loc, leaf)
        if leaf.shape[0] is None or leaf.shape[1] is None:
            check_field(values, leaf)
        for value in values:
            check_stored(value, leaf)
        column = np.empty(len(values), object)
        column[:] = values
        return column

    def _lazy_steps(
        self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf, where: str
    ) -> LazySteps:
        """A step field whose values are decoded one at a time.

        Images of open size are checked one by one, not against the episode's
        `check_field` limit: none is kept.
        """
        kind = leaf.kind
        if leaf.is_image:
            items = self._strings(buf, loc, leaf)
            return LazySteps(leaf, len(items), lambda i: decode_image(items[i], leaf), where)
        if kind == BYTES:
            items = self._strings(buf, loc, leaf)
            return LazySteps(leaf, len(items), lambda i: self._raw(items[i], leaf), where)
        if kind == ZLIB:
            items = self._strings(buf, loc, leaf)

            def inflated(i: int) -> np.ndarray:
                return self._raw(_inflate(items[i], _bound(leaf, items[i]), leaf.key), leaf)

            return LazySteps(leaf, len(items), inflated, where)
        if leaf.is_numeric:
            lazy = self._lazy_numbers(buf, loc, leaf, where)
            if lazy is not None:
                return lazy
        column = self._decode_steps(buf, loc, leaf)  # strings, or lists in pieces
        return LazySteps(leaf, len(column), column.__getitem__, where)

    def _lazy_numbers(
        self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf, where: str
    ) -> LazySteps | None:
        """Steps of a numeric field stored as one packed run, each decoded when asked for.

        None when the list is empty or not one packed run (the whole column is
        then decoded, and any error raised, as `decode` does).
        """
        size = leaf.size
        if loc is None or loc[0] == 0 or size == 0:
            return None
        start, end = loc[1], loc[2]
        if leaf.wire_type == "float":
            wire.expect_list(leaf.key, loc, (wire.FLOAT_LIST,))
            flat = wire.float_list(buf, start, end)  # a view of the record when packed
            if flat.size % size:
                return None

            def floats(i: int) -> np.ndarray:
                return flat[i * size : (i + 1) * size].astype(leaf.dtype).reshape(leaf.shape)

            return LazySteps(leaf, flat.size // size, floats, where)
        wire.expect_list(leaf.key, loc, (wire.INT64_LIST,))
        if buf[start] != 0x0A:
            return None
        length, pos = wire.read_varint(buf, start + 1)
        if pos + length != end:
            return None
        data = np.frombuffer(buf, np.uint8, length, pos)
        # Where each step's varints start, found a block of bytes at a time: the
        # whole column's int64 values (8 bytes each) are never held at once.
        bounds, count, block = [np.zeros(1, np.int64)], 0, 1 << 18
        for a in range(0, length, block):
            ends = np.flatnonzero(data[a : a + block] < 0x80) + (a + 1)
            bounds.append(ends[(size - 1 - count) % size :: size].copy())  # not a view of all
            count += len(ends)
        offsets = np.concatenate(bounds)
        if count % size or offsets[-1] != length:
            return None

        def numbers(i: int) -> np.ndarray:
            flat = wire.decode_varints(data[offsets[i] : offsets[i + 1]])
            if leaf.dtype == np.uint64:
                flat = flat.view(np.uint64)
            return flat.astype(leaf.dtype, copy=False).reshape(leaf.shape)

        return LazySteps(leaf, count // size, numbers, where)

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
        if leaf.is_numeric:
            flat = self._numbers(buf, loc, leaf)
            if not leaf.shape:
                if flat.size != 1:
                    raise DecodeError(f"{leaf.key}: expected one value, got {flat.size}")
                return flat[0]
            return _reshape_value(leaf, flat, target)
        if kind == TEXT:
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
        if kind == BYTES:
            return self._raw(items[0], leaf)
        if kind == ZLIB:
            return self._raw(_inflate(items[0], _bound(leaf, items[0]), leaf.key), leaf)
        if leaf.is_image:
            return decode_image(items[0], leaf)
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
