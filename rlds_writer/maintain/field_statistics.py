"""Per-dimension statistics of numeric step fields, for normalising observations and actions.

`dataset_statistics(path, split)` reads a split once, streaming, without
TensorFlow, and returns for every numeric step field (observation, action,
reward, discount, step metadata; nested fields by their path, e.g.
`observation/state`) per-dimension `mean`, `std`, `min`, `max`, `q01` and
`q99`, plus `count`, in the form OXE-style training code loads
(`dataset_statistics.json`: `stats["action"]["mean"]`, `num_transitions`,
`num_trajectories`). The result is cached next to the dataset in
`dataset_statistics_<split>.json` with a fingerprint of the split's shard
files and `features.json`; a changed, added or removed shard recomputes it.

Rules:

* transition fields (`action`, `reward`, `discount`) leave out each episode's
  final step: RLDS stores zeros there, which are no action anyone took;
  observations and step metadata use every step.
* mean, std (population), min and max are exact (float64 accumulation,
  Chan's parallel update). Quantiles are exact while a field has at most
  `SAMPLE_ROWS` rows (and `SAMPLE_ELEMENTS` values); above that they come
  from a uniform reservoir sample of that many rows (`exact_quantiles` says
  which).
* images, text and fields of more than `MAX_ELEMENTS` values per step are
  left out (images are normalised per pixel range, not per dimension).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import counted
from rlds_writer.maintain.statistics import iter_step_columns
from rlds_writer.read.reader import open_dataset
from rlds_writer.store.dataset import Dataset, layout
from rlds_writer.store.features import features as features_lib
from rlds_writer.store.storage import file_io

SAMPLE_ROWS = 100_000
SAMPLE_ELEMENTS = 10_000_000
MAX_ELEMENTS = 4096
QUANTILES = {"q01": 0.01, "q99": 0.99}
_TRANSITION = ("action", "reward", "discount")
_FLAGS = ("is_first", "is_last", "is_terminal")
_NUMERIC_KINDS = (*features_lib.NUMERIC_KINDS, *features_lib.ENCODED_KINDS)
_CACHE = "dataset_statistics_{split}.json"


class _Accumulator:
    """Running per-dimension moments, extremes and a reservoir sample of rows."""

    def __init__(self, shape: tuple[int, ...], rng: np.random.Generator):
        self.shape = shape
        self.count = 0
        self.mean = np.zeros(shape, np.float64)
        self.m2 = np.zeros(shape, np.float64)
        self.min = np.full(shape, np.inf)
        self.max = np.full(shape, -np.inf)
        size = max(1, int(np.prod(shape, dtype=np.int64)))
        self.capacity = max(1, min(SAMPLE_ROWS, SAMPLE_ELEMENTS // size))
        self.sample = np.empty((self.capacity, *shape), np.float64)
        self.rng = rng

    def add(self, rows: np.ndarray) -> None:
        k = len(rows)
        if not k:
            return
        x = rows.astype(np.float64, copy=False)
        # Infinite values make NaN moments (inf - inf): the statistics say so, as null
        # in `stats --json`, without a RuntimeWarning on the user's terminal.
        with np.errstate(invalid="ignore", over="ignore"):
            batch_mean = x.mean(axis=0)
            batch_m2 = ((x - batch_mean) ** 2).sum(axis=0)
            n = self.count + k
            delta = batch_mean - self.mean
            self.mean = self.mean + delta * (k / n)
            self.m2 = self.m2 + batch_m2 + delta**2 * (self.count * k / n)
        np.minimum(self.min, x.min(axis=0), out=self.min)
        np.maximum(self.max, x.max(axis=0), out=self.max)
        self._keep(x)
        self.count = n

    def _keep(self, x: np.ndarray) -> None:
        seen, cap = self.count, self.capacity
        free = max(0, cap - seen)
        self.sample[seen : seen + min(free, len(x))] = x[:free]
        rest = x[free:]
        if not len(rest):
            return
        # Reservoir sampling (Algorithm R), vectorised: row j replaces a random slot
        # with probability cap / (j + 1).
        index = np.arange(seen + free, seen + free + len(rest))
        slots = (self.rng.random(len(rest)) * (index + 1)).astype(np.int64)
        taken = slots < cap
        self.sample[slots[taken]] = rest[taken]

    def to_dict(self) -> dict[str, Any]:
        if not self.count:
            return {"count": 0}
        kept = self.sample[: min(self.count, self.capacity)]
        out = {
            "count": self.count,
            "mean": self.mean.tolist(),
            "std": np.sqrt(self.m2 / self.count).tolist(),
            "min": self.min.tolist(),
            "max": self.max.tolist(),
        }
        for name, q in QUANTILES.items():
            out[name] = np.quantile(kept, q, axis=0).tolist()
        out["exact_quantiles"] = self.count <= self.capacity
        return out


def _leaves(features: features_lib.Features) -> list[features_lib.Leaf]:
    """The numeric step leaves that get per-dimension statistics (and the flags)."""
    out = []
    for leaf in features.step_leaves:
        name = leaf.path[1]
        if name in _FLAGS:
            out.append(leaf)
            continue
        if (
            leaf.kind in _NUMERIC_KINDS
            and leaf.static
            and leaf.dtype.kind in "biuf"
            and (leaf.size or 0) <= MAX_ELEMENTS
        ):
            out.append(leaf)
    return out


def _fingerprint(reader: Any, split: str) -> str:
    """Changes when the split's shards, their listing or the features change."""
    digest = hashlib.sha256()
    files = [os.path.join(reader.path, layout.FEATURES)]
    files += [reader.shard_path(split, i) for i in range(len(reader.shard_lengths(split)))]
    for path in files:
        st = os.stat(path)
        digest.update(f"{os.path.basename(path)}:{st.st_size}:{st.st_mtime_ns};".encode())
    digest.update(json.dumps(reader.shard_lengths(split)).encode())
    return digest.hexdigest()


def _complete(cached: Any, reader: Any, split: str, fingerprint: str) -> bool:
    """True if a cache file matches the shards and holds every field's statistics.

    A cache of the right fingerprint can still be damaged or hand-edited: any
    missing field or value of the wrong shape means compute again.
    """
    if not isinstance(cached, Mapping) or cached.get("fingerprint") != fingerprint:
        return False
    if cached.get("split") != split:
        return False
    for key in ("num_trajectories", "num_transitions"):
        if not isinstance(cached.get(key), int) or isinstance(cached.get(key), bool):
            return False
    for leaf in _leaves(reader.features):
        if leaf.path[1] in _FLAGS:
            continue
        field = cached.get("/".join(leaf.path[1:]))
        if not isinstance(field, Mapping) or not isinstance(field.get("count"), int):
            return False
        if not field["count"]:
            continue
        shape = tuple(int(d) for d in leaf.shape)
        for stat in ("mean", "std", "min", "max", *QUANTILES):
            try:
                values = np.asarray(field.get(stat), dtype=np.float64)
            except (TypeError, ValueError):
                return False
            if values.shape != shape:
                return False
    return True


def _open_split(path: Dataset | os.PathLike | str, split: str) -> Any:
    reader = open_dataset(path)
    if split not in reader.splits:
        available = list(reader.splits)
        raise ValueError(f"{reader.path}: no split {split!r}; the dataset has splits {available}")
    return reader


def compute_field_statistics(
    path: Dataset | os.PathLike | str, split: str = "train", *, seed: int = 0
) -> dict[str, Any]:
    """Computes per-dimension statistics of a split (no cache; see `dataset_statistics`).

    Args:
      path: the dataset directory.
      split: the split to read.
      seed: seed of the reservoir sample used for quantiles of large fields.

    Returns:
      `{"num_trajectories", "num_transitions", "split", <field path>: {"count",
      "mean", "std", "min", "max", "q01", "q99", "exact_quantiles"}, ...}`;
      per-dimension values are nested lists in the field's shape.
    """
    return _compute(_open_split(path, split), split, seed)


def accumulate(
    reader: Any, split: str, rng: np.random.Generator
) -> tuple[dict[str, _Accumulator], int, int]:
    """Reads `split` (TFDS split syntax) once: per step field, its running statistics.

    Returns:
      (field name -> accumulator, episodes, transitions); `reader` is closed.
    """
    leaves = _leaves(reader.features)
    stats_leaves = [leaf for leaf in leaves if leaf.path[1] not in _FLAGS]
    acc = {"/".join(leaf.path[1:]): _Accumulator(tuple(leaf.shape), rng) for leaf in stats_leaves}
    episodes = transitions = 0
    with reader:
        for columns in iter_step_columns(reader, split, leaves):
            is_last = columns.get("is_last")
            n = len(next(iter(columns.values()))) if columns else 0
            # Transition fields: every step but an observation-only final one.
            acting = n - 1 if is_last is not None and n and bool(is_last[-1]) else n
            episodes += 1
            transitions += acting
            for leaf in stats_leaves:
                name = "/".join(leaf.path[1:])
                rows = columns[name]
                acc[name].add(rows[:acting] if leaf.path[1] in _TRANSITION else rows)
    return acc, episodes, transitions


def _compute(reader: Any, split: str, seed: int) -> dict[str, Any]:
    acc, episodes, transitions = accumulate(reader, split, np.random.default_rng(seed))
    out: dict[str, Any] = {
        "split": split,
        "num_trajectories": episodes,
        "num_transitions": transitions,
    }
    for name, field in acc.items():
        out[name] = field.to_dict()
    return out


def dataset_statistics(
    path: Dataset | os.PathLike | str, split: str = "train", *, cache: bool = True
) -> dict[str, Any]:
    """Per-dimension statistics of a split, cached next to the dataset.

    Args:
      path: the dataset directory.
      split: the split.
      cache: read `dataset_statistics_<split>.json` when its fingerprint
        matches the shards, and write it after computing. With False, compute
        and write nothing. A dataset in object storage is never written to:
        its statistics are computed each time.

    Returns:
      See `compute_field_statistics`; with a `fingerprint` key.
    """
    reader = _open_split(path, split)
    if not reader.dataset.is_local:
        # Reading tools never write into a bucket; the fingerprint needs local stats.
        return _compute(reader, split, seed=0)
    fingerprint = _fingerprint(reader, split)
    cache_path = os.path.join(reader.path, _CACHE.format(split=split))
    if cache and os.path.isfile(cache_path) and not os.path.islink(cache_path):
        try:
            with open(cache_path, encoding="utf-8") as f:
                cached = json.load(f)
            if _complete(cached, reader, split, fingerprint):
                return dict(cached)
        except (OSError, ValueError):
            pass  # unreadable cache: compute again
    stats = _compute(reader, split, seed=0)
    stats["fingerprint"] = fingerprint
    if cache:
        try:
            # A new temporary file created exclusively (never through a planted
            # link), then os.replace, which swaps a link itself, never its target.
            file_io.atomic_write_text(cache_path, json.dumps(stats, indent=1))
        except OSError:
            pass  # a read-only dataset: the statistics are still returned
    return stats


def format_field_statistics(stats: Mapping[str, Any], max_dims: int = 16) -> str:
    """Renders `dataset_statistics` output as a table, one row per dimension."""
    lines = [
        f"split {stats['split']}: {counted(stats['num_trajectories'], 'episode')}, "
        f"{counted(stats['num_transitions'], 'transition')} (final observation-only steps left out "
        "for action, reward and discount)"
    ]
    columns = ("mean", "std", "min", "max", "q01", "q99")
    lines.append(f"  {'field[dim]':28s}" + " ".join(f"{c:>11s}" for c in columns))
    for name, field in stats.items():
        if not isinstance(field, Mapping) or "mean" not in field:
            continue
        flat = {c: np.ravel(field[c]) for c in columns}
        dims = len(flat["mean"])
        for d in range(min(dims, max_dims)):
            label = name if dims == 1 and not np.ndim(field["mean"]) else f"{name}[{d}]"
            lines.append(f"  {label:28s}" + " ".join(f"{flat[c][d]:11.4g}" for c in columns))
        if dims > max_dims:
            lines.append(f"  {name}: {dims - max_dims} more dimensions (see --json)")
    return "\n".join(lines)
