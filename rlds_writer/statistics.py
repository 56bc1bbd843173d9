"""Dataset statistics: episode returns and lengths, endings, step metadata.

"Store then log": the recorder stores every step; the statistics an RL logger
would report (`*_mean`, `*_min`, `*_max` of returns, lengths and custom
metrics) are computed afterwards from the dataset.

Reading is streaming: episodes are read one at a time through
`tfds.builder_from_directory(...).as_dataset(...)`, and only the fields that
are needed (reward, the RLDS flags, numeric step metadata) leave the input
pipeline. Means, standard deviations, minima and maxima are running values
(Welford's algorithm). The exact median of the episode return and length needs
every value, so one float per episode is kept for those two (O(episodes)
floats: 16 MB for a million episodes); nothing per step is kept.

Conventions:

* `length` is the number of RLDS steps of an episode. In data written by
  rlds_writer the final step holds the last observation (with zero action and
  reward), so `length` is the number of environment steps plus one.
* `return` is the sum of `reward` over the episode's steps (summed over all
  elements when the reward is not a scalar).
* an episode is `terminated` when a step has `is_terminal` set, otherwise
  `truncated` (cut short by a time limit, a reset or a close).
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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

_CORE_STEP_FIELDS = frozenset(
    {"observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal"}
)
# Batch size used if an episode's step count is unknown (never for TFDS's own datasets).
_UNKNOWN_BATCH = np.int64(1 << 16)


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
    out["median"] = float(np.median(np.frombuffer(values, dtype=np.float64))) if values else None
    return {k: out[k] for k in ("mean", "std", "min", "median", "max")}


class _SplitAccumulator:
    """Everything `compute_statistics` keeps about one split."""

    def __init__(self, metadata_fields: Sequence[str]):
        self.episodes = 0
        self.steps = 0
        self.terminated = 0
        self.truncated = 0
        self.returns = array.array("d")
        self.lengths = array.array("d")
        self.return_stats = RunningStats()
        self.length_stats = RunningStats()
        self.metadata = {name: RunningStats() for name in metadata_fields}

    def add_episode(self, columns: Mapping[str, np.ndarray]) -> None:
        length = _episode_length(columns)
        episode_return = (
            float(np.sum(columns["reward"], dtype=np.float64)) if ("reward" in columns) else 0.0
        )
        self.episodes += 1
        self.steps += length
        if "is_terminal" in columns and bool(np.any(columns["is_terminal"])):
            self.terminated += 1
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

    def to_dict(self, per_episode: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "episodes": self.episodes,
            "steps": self.steps,
            "episode_return": _summary(self.returns, self.return_stats),
            "episode_length": _summary(self.lengths, self.length_stats),
            "terminated": self.terminated,
            "truncated": self.truncated,
            "step_metadata": {name: s.to_dict() for name, s in self.metadata.items()},
        }
        if per_episode:
            out["per_episode"] = {
                "return": list(self.returns),
                "length": [int(v) for v in self.lengths],
            }
        return out


def _episode_length(columns: Mapping[str, np.ndarray]) -> int:
    for values in columns.values():
        return int(values.shape[0])
    return 0


def _flatten_steps_spec(spec: Any, prefix: str = "") -> dict[str, Any]:
    """Flattens the nested `steps` element spec into `path -> TensorSpec`."""
    if isinstance(spec, Mapping):
        out = {}
        for key, sub in spec.items():
            out.update(_flatten_steps_spec(sub, f"{prefix}{key}/"))
        return out
    return {prefix.rstrip("/"): spec}


def _is_numeric(tensor_spec: Any) -> bool:
    dtype = tensor_spec.dtype
    return bool(dtype.is_floating or dtype.is_integer or dtype.is_bool)


def _selected_fields(steps_spec: Any) -> tuple[list[str], list[str]]:
    """Returns (core fields to read, numeric step-metadata fields), as flat paths."""
    flat = _flatten_steps_spec(steps_spec)
    core = [k for k in ("reward", "is_terminal", "is_last") if k in flat]
    metadata = sorted(
        k for k, s in flat.items() if k.split("/")[0] not in _CORE_STEP_FIELDS and _is_numeric(s)
    )
    if not core and not metadata:
        # Episode length still needs one column; is_first is in every RLDS dataset.
        core = [next(iter(flat))]
    return core, metadata


def _get(nested: Mapping[str, Any], path: str) -> Any:
    for key in path.split("/"):
        nested = nested[key]
    return nested


def _episode_columns(ds: Any, fields: Sequence[str]) -> Any:
    """Maps a dataset of episodes to one dict of `[num_steps, ...]` tensors each."""
    import tensorflow as tf

    def select(step: Mapping[str, Any]) -> dict[str, Any]:
        return {path: _get(step, path) for path in fields}

    def to_columns(episode: Mapping[str, Any]) -> dict[str, Any]:
        steps = episode["steps"]
        # TFDS builds `steps` from tensor slices, so its cardinality is known; a
        # batch of exactly that size holds the episode (a huge constant batch
        # size would make tf.data reserve memory for it).
        count = steps.cardinality()
        fallback = tf.where(count == 0, tf.constant(1, tf.int64), _UNKNOWN_BATCH)
        size = tf.where(count > 0, count, fallback)
        batched = steps.map(select).batch(size)
        # An episode with no steps yields no batch: append an empty one, take the first.
        empty = tf.data.Dataset.from_tensors(
            {
                k: tf.zeros([0, *spec.shape[1:]], spec.dtype)
                for k, spec in batched.element_spec.items()
            }
        )
        return batched.concatenate(empty).take(1).get_single_element()

    return ds.map(to_columns, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _iter_split(builder: Any, split: str, fields: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
    import tensorflow_datasets as tfds

    file_format = builder.info.file_format
    if getattr(file_format, "value", file_format) == "array_record":
        # TFDS has no as_dataset() for ArrayRecord files: use its random-access data source.
        yield from _iter_data_source(builder.as_data_source(split=split), fields)
        return
    ds = builder.as_dataset(split=split, shuffle_files=False)
    ds = _episode_columns(ds, fields).prefetch(2)
    yield from tfds.as_numpy(ds)


def _iter_data_source(source: Any, fields: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
    for index in range(len(source)):
        steps = source[index]["steps"]
        rows = [steps[j] for j in range(len(steps))]
        yield {path: np.asarray([_get(row, path) for row in rows]) for path in fields}


def compute_statistics(
    path: os.PathLike | str,
    split: str | Sequence[str] | None = None,
    *,
    progress: bool = False,
    per_episode: bool = False,
) -> dict[str, Any]:
    """Computes per-split statistics of an RLDS dataset, streaming.

    Args:
      path: a dataset directory (anything `tfds.builder_from_directory` opens).
      split: one split name, a list of them, or None for every split.
      progress: show a tqdm progress bar per split.
      per_episode: also return every episode's return and length (for plots)
        under `splits[<name>]["per_episode"]`.

    Returns:
      A plain dict (JSON-serializable): `path`, `name`, `version`, and
      `splits`, mapping each split name to `episodes`, `steps`,
      `episode_return` and `episode_length` (each `mean`, `std`, `min`,
      `median`, `max`), `terminated`, `truncated`, and `step_metadata`
      (numeric field path -> `mean`, `std`, `min`, `max` of its per-episode
      means). Values are None for an empty split.

    Raises:
      FileNotFoundError: if `path` holds no dataset.
      ValueError: if a requested split does not exist.
    """
    import tensorflow_datasets as tfds
    from tqdm import tqdm

    if not _has_info(path):
        raise FileNotFoundError(f"{path} holds no dataset (no dataset_info.json)")
    builder = tfds.builder_from_directory(os.fspath(path))
    available = list(builder.info.splits.keys())
    if split is None:
        names = available
    else:
        names = [split] if isinstance(split, str) else list(split)
        unknown = [s for s in names if s not in available]
        if unknown:
            raise ValueError(f"{path}: no split {unknown}; the dataset has splits {available}")
    steps_spec = builder.info.features["steps"].get_tensor_spec().element_spec
    core, metadata = _selected_fields(steps_spec)
    out: dict[str, Any] = {
        "path": os.fspath(path),
        "name": builder.info.name,
        "version": str(builder.info.version),
        "splits": {},
    }
    for name in names:
        acc = _SplitAccumulator(metadata)
        total = builder.info.splits[name].num_examples
        if total:
            bar = tqdm(
                _iter_split(builder, name, core + metadata),
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


def _has_info(path: os.PathLike | str) -> bool:
    from etils import epath

    return (epath.Path(path) / "dataset_info.json").exists()


def plot_statistics(stats: Mapping[str, Any], output: os.PathLike | str) -> None:
    """Draws return and length per episode and their histograms into an image file.

    Args:
      stats: the result of `compute_statistics(..., per_episode=True)`.
      output: the image path (the format follows its suffix, e.g. `.png`).

    Raises:
      ValueError: if `stats` has no per-episode values.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = {name: s for name, s in stats["splits"].items() if s.get("per_episode") is not None}
    if len(splits) != len(stats["splits"]):
        raise ValueError("plot_statistics needs compute_statistics(..., per_episode=True)")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), squeeze=False)
    panels = (("return", "episode return"), ("length", "episode length (steps)"))
    for row, (key, label) in enumerate(panels):
        series_ax, hist_ax = axes[row]
        for name, split_stats in splits.items():
            values = np.asarray(split_stats["per_episode"][key], dtype=np.float64)
            series_ax.plot(np.arange(len(values)), values, lw=0.8, label=name)
            if len(values):
                hist_ax.hist(values, bins=min(50, max(5, len(values) // 5)), alpha=0.6, label=name)
        series_ax.set_xlabel("episode")
        series_ax.set_ylabel(label)
        series_ax.set_title(f"{label} per episode")
        hist_ax.set_xlabel(label)
        hist_ax.set_ylabel("episodes")
        hist_ax.set_title(f"{label} histogram")
        if len(splits) > 1:
            series_ax.legend()
            hist_ax.legend()
    fig.suptitle(f"{stats.get('name', '')} {stats.get('version', '')}: {stats.get('path', '')}")
    fig.tight_layout()
    fig.savefig(os.fspath(output), dpi=100)
    plt.close(fig)


def format_statistics(stats: Mapping[str, Any]) -> str:
    """Renders `compute_statistics` output as a human-readable table."""

    def num(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    lines = [f"{stats['path']}  ({stats['name']} {stats['version']})"]
    for name, s in stats["splits"].items():
        lines.append(
            f"split {name}: {s['episodes']} episodes, {s['steps']} steps, "
            f"{s['terminated']} terminated, {s['truncated']} truncated"
        )
        lines.append(
            f"  {'':28s} {'mean':>12s} {'std':>12s} {'min':>12s} {'median':>12s} {'max':>12s}"
        )
        for label, key in (
            ("episode return", "episode_return"),
            ("episode length", "episode_length"),
        ):
            row = s[key]
            lines.append(
                f"  {label:28s} "
                + " ".join(f"{num(row[k]):>12s}" for k in ("mean", "std", "min", "median", "max"))
            )
        for field, row in s["step_metadata"].items():
            label = f"{field} (episode mean)"
            lines.append(
                f"  {label:28s} "
                + " ".join(
                    f"{num(row.get(k)) if k != 'median' else '':>12s}"
                    for k in ("mean", "std", "min", "median", "max")
                )
            )
    return "\n".join(lines)
