"""One episode for the player: its frames as stored, its numbers for the plots.

`EpisodeData` parses an episode's record once: each camera's frames stay the
stored PNG/JPEG bytes (nothing is decoded: the browser decodes the frames it
shows), the plotted fields, flags and texts are decoded to numpy. The page
gets the numbers twice: `overview()` for drawing, downsampled to at most
`MAX_POINTS` points per series (the min and max of each bucket of steps, so
a spike is never lost), and `steps(start, stop)` exact, for the cursor.

`EpisodeCache` keeps recently used episodes up to a byte budget (at least the
one in use): the server's memory is bounded by it, not by the dataset.
"""

from __future__ import annotations

import collections
import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from rlds_writer.errors import DecodeError
from rlds_writer.read.decode import Decoder
from rlds_writer.read.images import check_image, image_size
from rlds_writer.read.nest import flatten
from rlds_writer.store.features import wire
from rlds_writer.store.features.features import Features
from rlds_writer.view.episode_index import json_number, metadata_value, text_value
from rlds_writer.view.fields import MAX_FRAME_PIXELS, Layout, field_name

# Steps drawn per series as they are; longer episodes are drawn as bucket envelopes.
MAX_POINTS = 2000
BUCKETS = 1000
# Exact values per `steps` request, and text changes listed per field.
MAX_STEPS = 1000
MAX_CHANGES = 2000
_TYPES = {"png": "image/png", "jpeg": "image/jpeg"}


class EpisodeData:
    """One decoded episode (frames kept encoded).

    Args:
      record: the episode's record bytes.
      where: `file, record i`, for errors.
      features: the dataset's features.
      fields: what the page shows of them.

    Attributes:
      length: the number of steps.
      nbytes: about what it holds in memory.
    """

    def __init__(self, record: bytes, where: str, features: Features, fields: Layout):
        self.fields = fields
        self.where = where
        located = wire.parse_example(record)
        # Each frame is a stretch of the record, kept once: (offset, length) into it.
        self._record = record
        self.frames: list[list[tuple[int, int]]] = []
        raw = tuple(c for c in fields.cameras if not c.is_image)
        arrays = {}
        if raw:
            decoded_raw = Decoder(Features(leaves=raw, has_steps=True)).decode(record, where)
            arrays = {"/".join(p): v for p, v in flatten(decoded_raw["steps"])}
        self._arrays: dict[int, np.ndarray] = {}
        for i, leaf in enumerate(fields.cameras):
            if not leaf.is_image:  # an array: frames are its rows, encoded when served
                self._arrays[i] = np.asarray(arrays[field_name(leaf)])
                self.frames.append([(t, 0) for t in range(len(self._arrays[i]))])
                continue
            loc = located.get(leaf.key)
            if loc is None or loc[0] == 0:
                self.frames.append([])
                continue
            wire.expect_list(leaf.key, loc, (wire.BYTES_LIST,))
            self.frames.append(_stretches(record, loc[1], loc[2], f"{where}: {leaf.key}"))
        leaves = fields.plots + fields.flags + fields.texts + fields.episode_fields
        decoded = Decoder(Features(leaves=leaves, has_steps=True)).decode(record, where)
        steps = {"/".join(p): v for p, v in flatten(decoded.get("steps", {}))}
        self.plots = [
            np.asarray(steps[field_name(leaf)], np.float64).reshape(
                len(steps[field_name(leaf)]), -1
            )
            for leaf in fields.plots
        ]
        self.raw_plots = [np.asarray(steps[field_name(leaf)]) for leaf in fields.plots]
        self.flags = {
            field_name(leaf): np.asarray(steps[field_name(leaf)]) for leaf in fields.flags
        }
        self.texts = {field_name(leaf): steps[field_name(leaf)] for leaf in fields.texts}
        self.metadata = {}
        for leaf in fields.episode_fields:
            value = decoded
            for part in leaf.path:
                value = value[part]
            self.metadata[field_name(leaf)] = metadata_value(leaf, value, limit=256)
        counts = [len(c) for c in self.frames] + [len(c) for c in self.plots]
        counts += [len(c) for c in self.flags.values()] + [len(c) for c in self.texts.values()]
        if not counts:
            counts = [Decoder(features).num_steps(record, where)]
        self.length = max(counts)
        self.nbytes = len(record) + sum(a.nbytes * 2 for a in self.plots)
        self.nbytes += sum(a.nbytes for a in self._arrays.values())
        self.nbytes += 1024 * len(self.texts)
        self._formats: dict[tuple[int, int], str] = {}

    def overview(self) -> dict[str, Any]:
        """The episode for the page: length, plots (downsampled), flags, texts, metadata."""
        return {
            "length": self.length,
            "cameras": [
                {"id": i, "name": field_name(leaf), "frames": len(self.frames[i])}
                for i, leaf in enumerate(self.fields.cameras)
            ],
            "plots": [
                {"id": i, "name": field_name(leaf), **_downsample(values)}
                for i, (leaf, values) in enumerate(zip(self.fields.plots, self.plots))
            ],
            "flags": {
                name: np.flatnonzero(values.reshape(len(values), -1).any(axis=1))[
                    :MAX_CHANGES
                ].tolist()
                for name, values in self.flags.items()
            },
            "texts": {name: _changes(values) for name, values in self.texts.items()},
            "metadata": self.metadata,
        }

    def steps(self, start: int, stop: int) -> dict[str, Any]:
        """Exact values of steps [start, stop) (at most `MAX_STEPS`) of every shown field."""
        start = max(0, min(start, self.length))
        stop = max(start, min(stop, self.length, start + MAX_STEPS))
        return {
            "start": start,
            "stop": stop,
            "plots": [
                [
                    [json_number(v) for v in row]
                    for row in raw[start:stop].reshape(stop - start, int(np.prod(raw.shape[1:])))
                ]
                for raw in self.raw_plots
            ],
            "flags": {
                name: [bool(np.any(v)) for v in values[start:stop]]
                for name, values in self.flags.items()
            },
            "texts": {
                name: [text_value(v, 10_000) for v in values[start:stop]]
                for name, values in self.texts.items()
            },
        }

    def frame(self, camera: int, step: int) -> tuple[bytes, str]:
        """The stored bytes of a camera's frame and their media type.

        Raises:
          IndexError: no such camera or step.
          DecodeError: the stored value is not a PNG or JPEG the feature holds
            (checked from its header, with the reader's limits), or has more than
            `MAX_FRAME_PIXELS`.
        """
        offset, length = self.frames[camera][step]
        if camera in self._arrays:
            return _png(self._arrays[camera][step]), _TYPES["png"]
        data = bytes(self._record[offset : offset + length])
        key = (camera, step)
        fmt = self._formats.get(key)
        if fmt is None:
            leaf = self.fields.cameras[camera]
            fmt = check_image(data, leaf)
            height, width = image_size(data, leaf)  # an open size: the feature fixes none
            if height * width > MAX_FRAME_PIXELS:
                raise DecodeError(
                    f"{self.where}: {leaf.key}, step {step}: a {height}x{width} frame, over the "
                    f"{MAX_FRAME_PIXELS:,} pixels the page shows (it decodes frames whole)"
                )
            self._formats[key] = fmt
        return data, _TYPES[fmt]


def _png(frame: np.ndarray) -> bytes:
    """One uint8 frame as a lossless PNG (fast compression: it is made per request)."""
    import io

    from PIL import Image

    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[:, :, 0]
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _stretches(buf: bytes, start: int, end: int, where: str) -> list[tuple[int, int]]:
    """(offset, length) of each value of a `BytesList` payload, nothing copied."""
    out = []
    pos = start
    while pos < end:
        tag, pos = wire.read_varint(buf, pos)
        if tag != 0x0A:
            raise DecodeError(f"{where}: not a list of stored images (field tag {tag})")
        n, pos = wire.read_varint(buf, pos)
        if pos + n > end:
            raise DecodeError(f"{where}: a stored image runs past its list")
        out.append((pos, n))
        pos += n
    return out


def _finite(values: np.ndarray) -> list[Any]:
    return [float(v) if math.isfinite(v) else None for v in values.tolist()]


def _downsample(values: np.ndarray) -> dict[str, Any]:
    """A field's series for drawing: exact up to `MAX_POINTS` steps, else bucket min/max."""
    n = len(values)
    if n <= MAX_POINTS:
        return {"bucket": 1, "values": [_finite(values[:, s]) for s in range(values.shape[1])]}
    bucket = -(-n // BUCKETS)
    count = -(-n // bucket)
    padded = np.full((count * bucket, values.shape[1]), np.nan)
    padded[:n] = np.where(np.isfinite(values), values, np.nan)
    groups = padded.reshape(count, bucket, values.shape[1])
    with warnings.catch_warnings():  # an all-NaN bucket is a gap, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanmin(groups, axis=1), np.nanmax(groups, axis=1)
    return {
        "bucket": bucket,
        "min": [_finite(low[:, s]) for s in range(values.shape[1])],
        "max": [_finite(high[:, s]) for s in range(values.shape[1])],
    }


def _changes(values: Any) -> list[list[Any]]:
    """[[step, text], ...] where a per-step text takes a new value (the first step included)."""
    out: list[list[Any]] = []
    last = None
    for step, value in enumerate(values):
        if value != last:
            out.append([step, text_value(value, 10_000)])
            last = value
            if len(out) >= MAX_CHANGES:
                break
    return out


def _give_back_memory() -> None:
    """Returns the freed pages of evicted episodes to the OS (glibc keeps them otherwise).

    A record is tens of MB read on a handler thread; glibc holds such freed
    memory in that thread's arena, and the server's size would drift to a few
    times the cache. Elsewhere (no glibc), nothing happens.
    """
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class EpisodeCache:
    """Recently used episodes, up to `budget` bytes (the newest is always kept).

    Args:
      load: `(split, episode id) -> EpisodeData`.
      budget: bytes of episodes kept.
    """

    def __init__(self, load: Callable[[str, int], EpisodeData], budget: int):
        self._load = load
        self.budget = budget
        self._items: collections.OrderedDict[tuple[str, int], EpisodeData] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self._loading: dict[tuple[str, int], threading.Lock] = {}

    def get(self, split: str, episode: int) -> EpisodeData:
        key = (split, episode)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:  # one load per episode, however many frames ask at once
            with self._lock:
                if key in self._items:
                    return self._items[key]
            try:
                data = self._load(split, episode)
            finally:
                with self._lock:
                    self._loading.pop(key, None)
            with self._lock:
                self._items[key] = data
                evicted = False
                while len(self._items) > 1 and self.nbytes > self.budget:
                    self._items.popitem(last=False)
                    evicted = True
            if evicted:
                _give_back_memory()
            return data

    @property
    def nbytes(self) -> int:
        return sum(item.nbytes for item in self._items.values())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
