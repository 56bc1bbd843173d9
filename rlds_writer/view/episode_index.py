"""The episode index: one row per episode (length, return, ending, instruction, metadata).

Built from one scan of each split, decoding only the small fields it needs
(reward, the RLDS flags, `end_reason`, text and episode-level values; never an
image), and kept per shard file: listed shards never change, so a dataset
being written costs a scan of its new shards only. For a local dataset the
rows are cached beside the statistics cache, in `viewer_index_<split>.json`,
each shard's rows under its name, size and modification time; a dataset in
object storage is never written to (its index lives in memory).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import DecodeError
from rlds_writer.read.decode import Decoder
from rlds_writer.read.nest import flatten
from rlds_writer.read.reader import DatasetReader
from rlds_writer.store.features import end_reasons
from rlds_writer.store.features.features import TEXT, Features, Leaf
from rlds_writer.store.storage import file_io
from rlds_writer.view.fields import Layout, field_name

CACHE = "viewer_index_{split}.json"
_VERSION = 1
# A cache larger than this is not read (scanned again and rewritten): a dataset from
# elsewhere may hold a `viewer_index_*.json` of gigabytes that `json.load` would take
# whole. A row is a few KB (texts and metadata are cut); this leaves room for many.
CACHE_MIN_BYTES = 64 << 20
CACHE_BYTES_PER_EPISODE = 256 << 10
# Distinct text values kept per episode for the text filter, and their length.
_MAX_TEXTS = 8
MAX_TEXT = 500
ENDINGS = ("terminated", "truncated", end_reasons.CUT_SHORT, "unknown")

Progress = Callable[[str, int, int], None]


def text_value(value: Any, limit: int = MAX_TEXT) -> str:
    """Stored text as a str for the page (invalid UTF-8 replaced, cut at `limit`)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    value = str(value)
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


def json_number(value: Any) -> Any:
    """A numpy scalar as a JSON number (NaN and infinities as their names)."""
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer | int):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else str(value)


def metadata_value(leaf: Leaf, value: Any, limit: int = 64) -> Any:
    """An episode-level value as JSON: numbers, strings, small lists, else its type."""
    if leaf.kind == TEXT:
        if not leaf.shape:
            return text_value(value)
        flat = np.asarray(value, object).reshape(-1)
        if flat.size > limit:
            return f"{leaf.describe()} ({flat.size} strings)"
        return [text_value(v) for v in flat]
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind not in "biuf":
        return leaf.describe()
    if array.ndim == 0:
        return json_number(array[()])
    if array.size > limit:
        return f"{leaf.describe()} ({array.size} values)"
    return [json_number(v) for v in array.reshape(-1)]


class _Scanner:
    """Turns one episode record into its index row."""

    def __init__(self, features: Features, fields: Layout):
        wanted = {"reward", "is_first", "is_last", "is_terminal"}
        step = [
            leaf
            for leaf in features.step_leaves
            if (leaf.path[1:] in ((w,) for w in wanted) and leaf.static) or leaf in fields.texts
        ]
        self._episode = [
            leaf
            for leaf in fields.episode_fields
            if leaf.kind == TEXT or leaf.size is not None and leaf.size <= 64
        ]
        self._decoder = Decoder(Features(leaves=tuple(step + self._episode), has_steps=True))
        self._counter = Decoder(features)
        self._texts = [field_name(leaf) for leaf in fields.texts]
        self._instruction = fields.instruction

    def row_or_error(self, record: bytes, where: str) -> dict[str, Any]:
        """The episode's row; one that does not decode is listed with its error, not skipped."""
        try:
            return self.row(record, where)
        except DecodeError as e:
            return {
                "length": 0,
                "return": None,
                "ending": "unknown",
                "instruction": "",
                "texts": [],
                "metadata": {},
                "error": text_value(str(e)),
            }

    def row(self, record: bytes, where: str) -> dict[str, Any]:
        episode = self._decoder.decode(record, where)
        steps = {"/".join(path): np.asarray(v) for path, v in flatten(episode.get("steps", {}))}
        if "is_first" in steps:
            length = len(steps["is_first"])
        else:
            length = self._counter.num_steps(record, where)
        reward = steps.get("reward")
        if reward is not None and reward.dtype.kind in "biuf":
            total = float(np.sum(reward, dtype=np.float64))
            episode_return = total if math.isfinite(total) else str(total)
        else:
            episode_return = None
        row: dict[str, Any] = {
            "length": length,
            "return": episode_return,
            "ending": _ending(steps, episode),
        }
        texts, instruction = [], ""
        for name in self._texts:
            # Distinct stored values first (an instruction repeats every step), in order.
            values = list(dict.fromkeys(text_value(v) for v in dict.fromkeys(steps.get(name, ()))))
            if name == self._instruction and values:
                instruction = values[0]
            texts.extend(v for v in values if v not in texts)
        metadata = {}
        for leaf in self._episode:
            value = episode
            for part in leaf.path:
                value = value[part]
            metadata[field_name(leaf)] = metadata_value(leaf, value)
        if self._instruction in metadata and not instruction:
            instruction = str(metadata[self._instruction])
        row["instruction"] = instruction
        row["texts"] = texts[:_MAX_TEXTS]
        row["metadata"] = metadata
        return row


def _ending(steps: Mapping[str, np.ndarray], episode: Mapping[str, Any]) -> str:
    if "is_terminal" in steps and bool(np.any(steps["is_terminal"])):
        return "terminated"
    if text_value(episode.get(end_reasons.END_REASON, b"")) == end_reasons.CUT_SHORT:
        return end_reasons.CUT_SHORT
    is_last = steps.get("is_last")
    if is_last is not None and len(is_last) and bool(is_last[-1]):
        return "truncated"
    return "unknown"


class SplitIndex:
    """The rows of one split, in episode order, with columns for sorting and filtering.

    Attributes:
      split: the split name.
      rows: one dict per episode (`length`, `return`, `ending`, `instruction`,
        `texts`, `metadata`).
    """

    def __init__(self, split: str, shards: list[tuple[str, list[dict[str, Any]]]]):
        self.split = split
        self.shards = shards
        self.rows = [row for _, rows in shards for row in rows]
        self.lengths = np.array([r["length"] for r in self.rows], np.int64)
        self.returns = np.array(
            [r["return"] if isinstance(r["return"], float | int) else np.nan for r in self.rows],
            np.float64,
        )
        self.endings = np.array([ENDINGS.index(r["ending"]) for r in self.rows], np.int8)
        self._search: list[str] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def search_text(self) -> list[str]:
        """Per episode, its instruction and texts in lower case (for the text filter)."""
        if self._search is None:
            self._search = [
                "\n".join([r["instruction"], *r["texts"]]).casefold() for r in self.rows
            ]
        return self._search


class EpisodeIndex:
    """The index of every split of a dataset, updated as the dataset grows.

    Args:
      fields: the dataset's `Layout`.
      progress: called as `(split, episodes done, episodes in the split)` while scanning.
      cache: read and write `viewer_index_<split>.json` beside a local dataset.
    """

    def __init__(self, fields: Layout, progress: Progress | None = None, cache: bool = True):
        self.fields = fields
        self.progress = progress
        self.cache = cache
        self.splits: dict[str, SplitIndex] = {}
        self.scanned = 0  # episodes decoded so far (not taken from a cache)

    def update(self, reader: DatasetReader) -> None:
        """Brings the index up to the listing `reader` was opened on (new shards scanned)."""
        scanner = _Scanner(reader.features, self.fields)
        features_id = hashlib.sha256(
            json.dumps(reader.dataset.features_config, sort_keys=True).encode()
        ).hexdigest()
        splits = {}
        for split in reader.splits:
            splits[split] = self._update_split(reader, split, scanner, features_id)
        self.splits = splits

    def _update_split(
        self, reader: DatasetReader, split: str, scanner: _Scanner, features_id: str
    ) -> SplitIndex:
        local = reader.dataset.is_local and self.cache
        previous = self.splits.get(split)
        known = dict(previous.shards) if previous is not None else {}
        stamps = {}
        cache_path = os.path.join(reader.path, CACHE.format(split=split)) if local else None
        total = reader.splits[split]
        cached = _read_cache(cache_path, features_id, total) if cache_path else {}
        done, changed = 0, False
        shards = []
        listing = reader.dataset.splits[split]
        for episodes in reader.episodes(split).files():
            shard = episodes.segments[0][1]
            name = listing.shard_name(shard)
            count = listing.shard_lengths[shard]
            stamp = _stamp(reader.shard_path(split, shard)) if local else None
            stamps[name] = stamp
            rows = known.get(name)
            if rows is None or len(rows) != count:
                entry = cached.get(name)
                if entry and entry.get("stamp") == stamp and len(entry.get("rows", ())) == count:
                    rows = entry["rows"]
                else:
                    rows = []
                    for where, record in episodes.records():
                        rows.append(scanner.row_or_error(record, where))
                        self.scanned += 1
                        if self.progress and len(rows) % 64 == 0:
                            self.progress(split, done + len(rows), total)
                    changed = True
            shards.append((name, rows))
            done += count
        if self.progress and total and changed:
            self.progress(split, total, total)
        if cache_path and (changed or set(cached) != set(stamps)):
            _write_cache(cache_path, features_id, shards, stamps)
        return SplitIndex(split, shards)


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _read_cache(path: str, features_id: str, episodes: int) -> dict[str, Any]:
    """Shard name -> {stamp, rows} from a cache file, or {} if it is missing, not ours,
    or larger than `episodes` rows can be."""
    if not os.path.isfile(path) or os.path.islink(path):
        return {}
    try:
        if os.path.getsize(path) > max(CACHE_MIN_BYTES, CACHE_BYTES_PER_EPISODE * episodes):
            return {}
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    if data.get("features") != features_id or not isinstance(data.get("shards"), dict):
        return {}
    out = {}
    for name, entry in data["shards"].items():
        if isinstance(entry, dict) and isinstance(entry.get("rows"), list) and _rows_ok(entry):
            out[name] = entry
    return out


def _rows_ok(entry: Mapping[str, Any]) -> bool:
    """A hand-edited or damaged cache entry is scanned again, not trusted."""
    for row in entry["rows"]:
        if not isinstance(row, dict) or not isinstance(row.get("length"), int):
            return False
        if row.get("ending") not in ENDINGS or not isinstance(row.get("instruction"), str):
            return False
        if not isinstance(row.get("texts"), list) or not isinstance(row.get("metadata"), dict):
            return False
        if not (row.get("return") is None or isinstance(row["return"], int | float | str)):
            return False
    return True


def _write_cache(
    path: str, features_id: str, shards: list[tuple[str, list]], stamps: Mapping[str, Any]
) -> None:
    data = {
        "version": _VERSION,
        "features": features_id,
        "shards": {name: {"stamp": stamps.get(name), "rows": rows} for name, rows in shards},
    }
    try:
        # Created exclusively and renamed into place: never written through a planted link.
        file_io.atomic_write_text(path, json.dumps(data, separators=(",", ":")))
    except OSError:
        pass  # a read-only dataset: the index stays in memory
