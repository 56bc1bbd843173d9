"""Dataset statistics: episode returns and lengths, endings, step metadata.

"Store then log": the recorder stores every step; the statistics an RL logger
would report (`*_mean`, `*_min`, `*_max` of returns, lengths and custom
metrics) are computed afterwards from the dataset.

Reading is streaming and TF-free: the shard files listed in
`dataset_info.json` are read in order through `rlds_writer.read` (the same
path as the reader, recover and info, so damage is reported the same way),
and only the keys that are needed (reward, the RLDS flags, numeric step
metadata) are decoded from the stored `tf.train.Example`s. Means, standard
deviations, minima and maxima are running values (Welford's algorithm). The
exact median of the episode return and length needs every value, so one float
per episode is kept for those two (O(episodes) floats: 16 MB for a million
episodes); nothing per step is kept.

Conventions:

* `length` is the number of RLDS steps of an episode. In data written by
  rlds_writer the final step holds the last observation (with zero action and
  reward), so `length` is the number of environment steps plus one.
* `return` is the sum of `reward` over the episode's steps (summed over all
  elements when the reward is not a scalar).
* an episode is `terminated` when a step has `is_terminal` set, otherwise
  `truncated` (by a time limit); when the dataset has the recorders'
  `end_reason` field, episodes the recorder ended itself (a reset or close
  mid-episode, a refused value, interpreter exit) count as `cut_short`
  instead of `truncated` (`cut_short` is None for datasets without the field).
* standard deviations are population ones (ddof=0), as RL loggers report them.
* a numeric step-metadata field (any step field other than observation,
  action, reward, discount and the flags; bools count as 0/1) is averaged
  within each episode (over all its elements, for non-scalar fields), and the
  per-episode means are aggregated across episodes.
"""

from __future__ import annotations

import array
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import counted, import_optional
from rlds_writer.read.decode import Decoder
from rlds_writer.read.nest import flatten
from rlds_writer.read.reader import open_dataset
from rlds_writer.read.transitions import episode_end
from rlds_writer.store.dataset import Dataset, open_handle
from rlds_writer.store.features import end_reasons
from rlds_writer.store.features import features as features_lib

_CORE_STEP_FIELDS = frozenset(
    {"observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal"}
)


class RunningStats:
    """Count, mean, population std, min and max of a stream of numbers (Welford)."""

    __slots__ = ("count", "_mean", "_m2", "min", "max")

    def __init__(self) -> None:
        self.count = 0
        self._mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        """Adds one value (NaN is skipped: a NaN return says nothing about the others)."""
        value = float(value)
        if math.isnan(value):
            return
        self.count += 1
        delta = value - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (value - self._mean)
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def to_dict(self) -> dict[str, float | None]:
        """Returns `mean`, `std`, `min`, `max` (all None when no value was added)."""
        if not self.count:
            return {"mean": None, "std": None, "min": None, "max": None}
        return {
            "mean": self._mean,
            "std": math.sqrt(self._m2 / self.count),
            "min": self.min,
            "max": self.max,
        }


def _summary(values: array.array, running: RunningStats) -> dict[str, float | None]:
    out = running.to_dict()
    kept = np.frombuffer(values, dtype=np.float64)
    kept = kept[~np.isnan(kept)]  # skipped as by `RunningStats.add`
    out["median"] = float(np.median(kept)) if kept.size else None
    return {k: out[k] for k in ("mean", "std", "min", "median", "max")}


class _SplitAccumulator:
    """Everything `compute_statistics` keeps about one split."""

    def __init__(self, metadata_fields: Sequence[str], has_end_reason: bool):
        self.cut_short: int | None = 0 if has_end_reason else None
        self.episodes = 0
        self.steps = 0
        self.terminated = 0
        self.truncated = 0
        self.returns = array.array("d")
        self.lengths = array.array("d")
        self.return_stats = RunningStats()
        self.length_stats = RunningStats()
        self.metadata = {name: RunningStats() for name in metadata_fields}
        # The first clock field (`timestamp_ns`, ...) dates each episode, for plots.
        self.clock = next((name for name in metadata_fields if is_clock_field(name)), None)
        self.starts = array.array("d")

    def add_episode(self, columns: Mapping[str, np.ndarray]) -> None:
        length = _episode_length(columns)
        episode_return = (
            float(np.sum(columns["reward"], dtype=np.float64)) if ("reward" in columns) else 0.0
        )
        self.episodes += 1
        self.steps += length
        if "is_terminal" in columns and bool(np.any(columns["is_terminal"])):
            self.terminated += 1
        elif episode_end(columns) == end_reasons.CUT_SHORT:
            self.cut_short += 1
        else:
            self.truncated += 1
        self.returns.append(episode_return)
        self.lengths.append(float(length))
        self.return_stats.add(episode_return)
        self.length_stats.add(length)
        for name, stats in self.metadata.items():
            values = columns[name]
            if values.size:
                stats.add(float(np.mean(values, dtype=np.float64)))
        if self.clock is not None:
            values = columns[self.clock]
            self.starts.append(float(values.reshape(-1)[0]) * _clock_unit(self.clock))

    def to_dict(self, per_episode: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "episodes": self.episodes,
            "steps": self.steps,
            "episode_return": _summary(self.returns, self.return_stats),
            "episode_length": _summary(self.lengths, self.length_stats),
            "terminated": self.terminated,
            "truncated": self.truncated,
            "cut_short": self.cut_short,
            "step_metadata": {name: s.to_dict() for name, s in self.metadata.items()},
        }
        if per_episode:
            out["per_episode"] = {
                "return": list(self.returns),
                "length": [int(v) for v in self.lengths],
            }
            if self.clock is not None and len(self.starts) == self.episodes:
                first = min(self.starts) if self.starts else 0.0
                out["per_episode"]["time"] = [t - first for t in self.starts]
                out["per_episode"]["time_field"] = self.clock
        return out


def _episode_length(columns: Mapping[str, np.ndarray]) -> int:
    return int(columns[_LENGTH_KEY].shape[0])


# Kinds of stored values whose decoded numbers statistics are taken of.
_NUMERIC_KINDS = (*features_lib.NUMERIC_KINDS, *features_lib.ENCODED_KINDS)
# Every RLDS dataset has is_first; its row length is the episode's step count.
_LENGTH_KEY = "is_first"


def _selected_leaves(features: features_lib.Features) -> tuple[list[Any], list[str]]:
    """Returns (the step leaves to decode, the names of numeric step-metadata fields)."""
    wanted = []
    metadata = []
    for leaf in features.step_leaves:
        if leaf.kind not in _NUMERIC_KINDS or not leaf.static or leaf.dtype.kind not in "biuf":
            continue
        name = "/".join(leaf.path[1:])
        top = leaf.path[1]
        if top in ("reward", "is_terminal", "is_last", _LENGTH_KEY):
            wanted.append(leaf)
        elif top not in _CORE_STEP_FIELDS:
            wanted.append(leaf)
            metadata.append(name)
    if not any(leaf.path[1:] == (_LENGTH_KEY,) for leaf in wanted):
        raise ValueError("not an RLDS dataset: steps have no is_first field")
    return wanted, sorted(metadata)


def iter_step_columns(reader: Any, split: str, leaves: Sequence[Any]) -> Iterator[dict[str, Any]]:
    """Yields, per episode, `field path -> [steps, *shape]` for the selected leaves.

    The episode's `end_reason`, when selected, comes under its own name.

    Only these keys are decoded (through the TF-free read path, which checks
    every record's CRC): images and other large fields are skipped.
    """
    decoder = Decoder(features_lib.Features(leaves=tuple(leaves), has_steps=True))
    for where, record in reader.episodes(split).records():
        episode = decoder.decode(record, where)
        columns = {"/".join(path): np.asarray(v) for path, v in flatten(episode.get("steps", {}))}
        if end_reasons.END_REASON in episode:
            columns[end_reasons.END_REASON] = episode[end_reasons.END_REASON]
        yield columns


def compute_statistics(
    path: Dataset | os.PathLike | str,
    split: str | Sequence[str] | None = None,
    *,
    progress: bool = False,
    per_episode: bool = False,
) -> dict[str, Any]:
    """Computes per-split statistics of an RLDS dataset, streaming, without TensorFlow.

    Args:
      path: a dataset directory (written by rlds_writer or by TFDS; local or
        object storage), or a `Dataset`.
      split: one split name, a list of them, or None for every split.
      progress: show a tqdm progress bar per split.
      per_episode: also return every episode's return and length (for plots)
        under `splits[<name>]["per_episode"]`.

    Returns:
      A plain dict (JSON-serializable): `path`, `name`, `version`, and
      `splits`, mapping each split name to `episodes`, `steps`,
      `episode_return` and `episode_length` (each `mean`, `std`, `min`,
      `median`, `max`), `terminated`, `truncated`, `cut_short`, and `step_metadata`
      (numeric field path -> `mean`, `std`, `min`, `max` of its per-episode
      means). Values are None for an empty split.

    Raises:
      NotADatasetError: `path` is not a dataset.
      ValueError: if a requested split does not exist.
      CorruptRecordError: a damaged record (file, record, offset; run recover).
    """
    from tqdm import tqdm

    dataset = open_handle(path)
    path = dataset.path
    reader = open_dataset(dataset)
    available = list(reader.splits)
    if split is None:
        names = available
    else:
        names = [split] if isinstance(split, str) else list(split)
        unknown = [s for s in names if s not in available]
        if unknown:
            raise ValueError(f"{path}: no split {unknown}; the dataset has splits {available}")
    leaves, metadata = _selected_leaves(reader.features)
    end_leaf = [f for f in reader.features.episode_leaves if f.path == (end_reasons.END_REASON,)]
    out: dict[str, Any] = {
        "path": os.fspath(path),
        "name": reader.name,
        "version": str(reader.version),
        "splits": {},
    }
    with reader:
        for name in names:
            acc = _SplitAccumulator(metadata, has_end_reason=bool(end_leaf))
            total = reader.splits[name]
            if total:
                bar = tqdm(
                    iter_step_columns(reader, name, leaves + end_leaf),
                    total=total,
                    desc=f"{name}",
                    unit="ep",
                    disable=not progress,
                    leave=False,
                )
                for columns in bar:
                    acc.add_episode(columns)
            out["splits"][name] = acc.to_dict(per_episode)
    return out


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or `MissingDependencyError`."""
    matplotlib = import_optional("matplotlib", "plotting statistics")
    matplotlib.use("Agg")
    return import_optional("matplotlib.pyplot", "plotting statistics")


def plot_statistics(stats: Mapping[str, Any], output: os.PathLike | str) -> None:
    """Draws return and length per episode and their histograms into an image file.

    Args:
      stats: the result of `compute_statistics(..., per_episode=True)`.
      output: the image path (the format follows its suffix, e.g. `.png`).

    Raises:
      ValueError: if `stats` has no per-episode values.
      MissingDependencyError: matplotlib is not installed (the `plot` extra).
    """
    plt = pyplot()
    splits = {name: s for name, s in stats["splits"].items() if s.get("per_episode") is not None}
    if len(splits) != len(stats["splits"]):
        raise ValueError("plot_statistics needs compute_statistics(..., per_episode=True)")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    panels = (("return", "episode return"), ("length", "episode length (steps)"))
    # Recording time on the x axis when every split has a clock field.
    timed = all("time" in s["per_episode"] for s in splits.values())
    for row, (key, label) in enumerate(panels):
        series_ax, hist_ax = axes[row]
        for name, split_stats in splits.items():
            values = np.asarray(split_stats["per_episode"][key], dtype=np.float64)
            x = np.asarray(split_stats["per_episode"]["time"]) if timed else np.arange(len(values))
            series_ax.plot(x, values, lw=0.6, alpha=0.5, label=name)
            window = rolling_window(len(values))
            if window > 1:
                mean = np.convolve(values, np.ones(window) / window, mode="valid")
                series_ax.plot(x[window - 1 :], mean, lw=1.6, label=f"{name} (mean of {window})")
            if len(values):
                hist_ax.hist(values, bins=min(50, max(5, len(values) // 5)), alpha=0.6, label=name)
        series_ax.set_xlabel("recording time (s)" if timed else "episode")
        series_ax.legend(fontsize="small")
        series_ax.set_ylabel(label)
        series_ax.set_title(f"{label} per episode")
        hist_ax.set_xlabel(label)
        hist_ax.set_ylabel("episodes")
        hist_ax.set_title(f"{label} histogram")
        if len(splits) > 1:
            hist_ax.legend()
    fig.suptitle(f"{stats.get('name', '')} {stats.get('version', '')}: {stats.get('path', '')}")
    fig.tight_layout()
    fig.savefig(os.fspath(output), dpi=100)
    plt.close(fig)


# Step metadata that are clocks (timestamps): their means say nothing, so the
# table leaves them out (the JSON keeps them).
_CLOCK = re.compile(r"(^|_)(time|timestamp|ts|clock)(_|$)|_(ns|us|ms)$")


def rolling_window(n: int) -> int:
    """Episodes per point of the plots' rolling mean: about a twentieth, at least 2."""
    return max(2, n // 20) if n >= 4 else 1


def _clock_unit(field: str) -> float:
    """Seconds per unit of a clock field, from its suffix (`_ns`, `_us`, `_ms`; else s)."""
    for suffix, unit in (("_ns", 1e-9), ("_us", 1e-6), ("_ms", 1e-3)):
        if field.lower().endswith(suffix):
            return unit
    return 1.0


def is_clock_field(field: str) -> bool:
    """Whether a step field is a clock (`timestamp_ns`, `wall_time`, ...) by its name."""
    return bool(_CLOCK.search(field.rsplit("/", 1)[-1].lower()))


def format_statistics(stats: Mapping[str, Any]) -> str:
    """Renders `compute_statistics` output as a human-readable table."""

    def num(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    lines = [f"{stats['path']}  ({stats['name']} {stats['version']})"]
    columns = ("mean", "std", "min", "median", "max")
    for name, s in stats["splits"].items():
        rows = [("episode return", s["episode_return"]), ("episode length", s["episode_length"])]
        rows += [
            (f"{field} (episode mean)", row)
            for field, row in s["step_metadata"].items()
            if not is_clock_field(field)
        ]
        width = max(len(label) for label, _ in rows) + 2
        lines.append(
            f"split {name}: {counted(s['episodes'], 'episode')}, {counted(s['steps'], 'step')}, "
            f"{s['terminated']} terminated, {s['truncated']} truncated"
            + (f", {s['cut_short']} cut short" if s.get("cut_short") is not None else "")
        )
        lines.append("  " + " " * width + " ".join(f"{c:>12s}" for c in columns))
        for label, row in rows:
            cells = " ".join(f"{num(row.get(c)) if c in row else '':>12s}" for c in columns)
            lines.append(f"  {label:{width}s}{cells}")
    return "\n".join(lines)
