"""LeRobot's per-feature statistics: per episode, then aggregated over the dataset.

What LeRobot (`lerobot.datasets.compute_stats`, v3.0) stores for every
non-text feature, in `meta/stats.json` and as `stats/<feature>/<stat>` columns
of `meta/episodes`: `min`, `max`, `mean`, `std` (population), `count` (shape
`(1,)`) and the quantiles `q01`, `q10`, `q50`, `q90`, `q99` (used by its
QUANTILES normalisation).

* numeric features: per element of the feature (shape `(n,)` for a vector,
  `(1,)` for a scalar), over the episode's frames;
* images: per channel, scaled to [0, 1], shape `(C, 1, 1)`, over up to 100
  frames of each episode taken evenly (LeRobot samples images too; `count`
  is the number of frames used).

Per-episode quantiles are exact; the dataset's are their count-weighted mean
(LeRobot's own aggregation), means and deviations are combined exactly
(parallel algorithm), extremes are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.interop.formats.lerobot.layout import QUANTILES

MAX_IMAGE_FRAMES = 100


def feature_stats(values: np.ndarray, image: bool) -> dict[str, np.ndarray]:
    """The statistics of one feature over one episode's frames (first axis)."""
    values = np.asarray(values)
    if image:
        pick = np.unique(np.linspace(0, len(values) - 1, min(len(values), MAX_IMAGE_FRAMES)))
        frames = values[pick.astype(int)]
        data = frames.reshape(-1, frames.shape[-1]).astype(np.float64) / 255.0
        count = len(frames)
    else:
        data = values.reshape(len(values), -1).astype(np.float64)
        count = len(values)
    stats = {
        "min": data.min(axis=0),
        "max": data.max(axis=0),
        "mean": data.mean(axis=0),
        "std": data.std(axis=0),
    }
    for name, q in QUANTILES.items():
        stats[name] = np.quantile(data, q, axis=0)
    if image:
        stats = {k: v.reshape(-1, 1, 1) for k, v in stats.items()}
    elif values.ndim > 2:
        stats = {k: v.reshape(values.shape[1:]) for k, v in stats.items()}
    stats["count"] = np.array([count], dtype=np.int64)
    return stats


class Aggregate:
    """Combines per-episode statistics into the dataset's, one episode at a time."""

    def __init__(self) -> None:
        self.totals: dict[str, dict[str, Any]] = {}

    def add(self, episode_stats: dict[str, dict[str, np.ndarray]]) -> None:
        for key, stats in episode_stats.items():
            n = float(stats["count"][0])
            total = self.totals.get(key)
            if total is None:
                self.totals[key] = {
                    "n": n,
                    "min": stats["min"],
                    "max": stats["max"],
                    "mean": stats["mean"],
                    "m2": stats["std"] ** 2 * n,
                    **{q: stats[q] * n for q in QUANTILES},
                }
                continue
            combined = total["n"] + n
            delta = stats["mean"] - total["mean"]
            total["m2"] = total["m2"] + stats["std"] ** 2 * n + delta**2 * total["n"] * n / combined
            total["mean"] = total["mean"] + delta * n / combined
            total["min"] = np.minimum(total["min"], stats["min"])
            total["max"] = np.maximum(total["max"], stats["max"])
            for q in QUANTILES:
                total[q] = total[q] + stats[q] * n
            total["n"] = combined

    def result(self) -> dict[str, dict[str, Any]]:
        """The dataset's statistics, as JSON-ready lists."""
        out: dict[str, dict[str, Any]] = {}
        for key, total in self.totals.items():
            n = total["n"]
            stats = {
                "min": total["min"],
                "max": total["max"],
                "mean": total["mean"],
                "std": np.sqrt(np.maximum(total["m2"] / n, 0.0)),
                "count": np.array([int(n)]),
                **{q: total[q] / n for q in QUANTILES},
            }
            out[key] = {k: np.asarray(v).tolist() for k, v in stats.items()}
        return out


def flat_columns(episode_stats: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """`stats/<feature>/<stat>` values for one `meta/episodes` row."""
    return {
        f"stats/{key}/{name}": np.asarray(value).tolist()
        for key, stats in episode_stats.items()
        for name, value in stats.items()
    }


def arrow_types(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The Arrow types of the `stats/...` columns for features of the given stats shapes."""
    import pyarrow as pa

    types: dict[str, Any] = {}
    for key, shape in shapes.items():
        value: Any = pa.float64()
        for _ in shape:
            value = pa.list_(value)
        for name in ("min", "max", "mean", "std", *QUANTILES):
            types[f"stats/{key}/{name}"] = value
        types[f"stats/{key}/count"] = pa.list_(pa.int64())
    return types


def stats_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one statistic of a feature (`(C, 1, 1)` for images, `(1,)` for scalars)."""
    if kind == "image":
        return (shape[-1], 1, 1)
    return tuple(shape) or (1,)
