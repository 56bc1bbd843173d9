"""Per-dimension field statistics as an Apache Beam pipeline, for splits too big for one process.

`beam_dataset_statistics(path, split, pipeline_args)` computes what
`rlds_writer.maintain.field_statistics.dataset_statistics` computes, with one
work item per shard file: each worker reads its shard (TF-free read path)
into partial moments, extremes and a reservoir sample; a combiner merges the
partials; the result is written as the split's statistics cache
(`dataset_statistics_<split>.json`, with the same fingerprint), so
`dataset_statistics(path, split)` returns it afterwards without reading the
shards again. Or from a shell, with Beam's standard options:

    python -m rlds_writer.maintain.beam_statistics /data/run1 --split train \\
        --runner=DirectRunner --direct_running_mode=multi_processing --direct_num_workers=8

Compared with the single-process run: `count`, `min`, `max`, the episode
and transition counts and quantiles marked `exact_quantiles` are the same;
`mean` and `std` are the same up to float64 rounding (partials are merged
in the order the runner gives, with Chan's parallel update); quantiles of
fields above `SAMPLE_ROWS` rows come from a uniform sample of the same size
merged from the shards' samples, not the same sample.

Workers import this module from their own install of rlds_writer: the
DirectRunner's processes share the driver's environment; on Dataflow, Flink
or Spark pass `--setup_file=<rlds_writer checkout>/setup.py`. They read the
dataset by its path, so it must be on a file system every worker mounts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from rlds_writer.maintain import field_statistics as fs
from rlds_writer.store.storage import file_io


def _work_items(reader: Any, split: str) -> list[tuple[int, str]]:
    """One `(index, split spec)` per non-empty shard: `train[first:stop]`."""
    items, first = [], 0
    for n in reader.shard_lengths(split):
        if n:
            items.append((len(items), f"{split}[{first}:{first + n}]"))
        first += n
    return items


def shard_partial(item: tuple[int, str], path: str, seed: int) -> dict[str, Any]:
    """One work item: the statistics state of one shard's episodes (runs on a worker)."""
    index, spec = item
    reader = fs._open_split(path, spec.split("[", 1)[0])  # noqa: SLF001
    # A seed per shard: each shard's reservoir is its own uniform sample.
    acc, episodes, transitions = fs.accumulate(reader, spec, np.random.default_rng([seed, index]))
    fields = {}
    for name, a in acc.items():
        fields[name] = {
            "shape": a.shape,
            "count": a.count,
            "mean": a.mean,
            "m2": a.m2,
            "min": a.min,
            "max": a.max,
            "capacity": a.capacity,
            "sample": a.sample[: min(a.count, a.capacity)].copy(),
        }
    return {"episodes": episodes, "transitions": transitions, "fields": fields, "seed": index}


def _merge_field(a: dict[str, Any], b: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if not b["count"]:
        return a
    if not a["count"]:
        return b
    n = a["count"] + b["count"]
    delta = b["mean"] - a["mean"]
    mean = a["mean"] + delta * (b["count"] / n)
    m2 = a["m2"] + b["m2"] + delta**2 * (a["count"] * b["count"] / n)
    cap = a["capacity"]
    if n <= cap:
        sample = np.concatenate([a["sample"], b["sample"]])
    else:
        # A uniform sample of the union: how many rows come from each side is
        # hypergeometric in the sides' counts; each side's rows are uniform.
        take_a = rng.hypergeometric(a["count"], b["count"], cap)
        pick_a = rng.choice(len(a["sample"]), size=min(take_a, len(a["sample"])), replace=False)
        pick_b = rng.choice(
            len(b["sample"]), size=min(cap - len(pick_a), len(b["sample"])), replace=False
        )
        sample = np.concatenate([a["sample"][np.sort(pick_a)], b["sample"][np.sort(pick_b)]])
    return {
        "shape": a["shape"],
        "count": n,
        "mean": mean,
        "m2": m2,
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
        "capacity": cap,
        "sample": sample,
    }


def merge_partials(partials: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Merges shard partials (in any order, any grouping) into one; None for none.

    Beam's `CombineGlobally` calls it on the shards' partials and again on
    merged ones, a few at a time, so memory stays within a few samples.
    """
    partials = sorted((p for p in partials if p is not None), key=lambda p: p["seed"])
    if not partials:
        return None
    out = partials[0]
    for p in partials[1:]:
        rng = np.random.default_rng([out["seed"], p["seed"], 7])
        out = {
            "episodes": out["episodes"] + p["episodes"],
            "transitions": out["transitions"] + p["transitions"],
            "fields": {k: _merge_field(v, p["fields"][k], rng) for k, v in out["fields"].items()},
            "seed": min(out["seed"], p["seed"]),
        }
    return out


def _field_dict(f: dict[str, Any]) -> dict[str, Any]:
    if not f["count"]:
        return {"count": 0}
    out = {
        "count": f["count"],
        "mean": np.asarray(f["mean"]).tolist(),
        "std": np.sqrt(f["m2"] / f["count"]).tolist(),
        "min": np.asarray(f["min"]).tolist(),
        "max": np.asarray(f["max"]).tolist(),
    }
    for name, q in fs.QUANTILES.items():
        out[name] = np.quantile(f["sample"], q, axis=0).tolist()
    out["exact_quantiles"] = f["count"] <= f["capacity"]
    return out


def _finish(partial: dict[str, Any], split: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "split": split,
        "num_trajectories": partial["episodes"],
        "num_transitions": partial["transitions"],
    }
    for name, field in partial["fields"].items():
        out[name] = _field_dict(field)
    return out


def _write(partial: dict[str, Any], split: str, fingerprint: str, output: str) -> None:
    stats = _finish(partial, split)
    stats["fingerprint"] = fingerprint
    file_io.atomic_write_text(output, json.dumps(stats, indent=1))


def beam_dataset_statistics(
    path: os.PathLike | str,
    split: str = "train",
    pipeline_args: Sequence[str] | Any = (),
    *,
    output: os.PathLike | str | None = None,
) -> dict[str, Any]:
    """Per-dimension statistics of a split, computed by an Apache Beam pipeline.

    Args:
      path: the dataset directory, readable by every worker.
      split: the split.
      pipeline_args: Beam's pipeline options, as command-line arguments
        (`["--runner=DirectRunner", "--direct_running_mode=multi_processing",
        "--direct_num_workers=8"]`) or a `PipelineOptions`.
      output: where the workers write the result; by default the split's
        statistics cache in the dataset (`dataset_statistics_<split>.json`),
        which `dataset_statistics` then reads. Give a path the workers can
        write for a read-only dataset.

    Returns:
      See `field_statistics.compute_field_statistics`; with a `fingerprint` key.
    """
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    path = os.fspath(path)
    reader = fs._open_split(path, split)  # noqa: SLF001
    with reader:
        items = _work_items(reader, split)
        fingerprint = fs._fingerprint(reader, split)  # noqa: SLF001
    if not items:
        return {**fs.compute_field_statistics(path, split), "fingerprint": fingerprint}
    target = os.fspath(output) if output else os.path.join(path, fs._CACHE.format(split=split))  # noqa: SLF001
    options = pipeline_args if isinstance(pipeline_args, PipelineOptions) else None
    options = options or PipelineOptions(list(pipeline_args))
    with beam.Pipeline(options=options) as pipeline:
        _ = (
            pipeline
            | "Shards" >> beam.Create(items)
            | "ReadShard" >> beam.Map(shard_partial, path, 0)
            | "Merge" >> beam.CombineGlobally(merge_partials)
            | "Write" >> beam.Map(_write, split, fingerprint, target)
        )
    with open(target, encoding="utf-8") as f:
        return json.load(f)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rlds_writer.maintain.beam_statistics PATH [--split S] [Beam options]`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="the dataset directory")
    parser.add_argument("--split", default="train")
    parser.add_argument("--output", default=None, help="result file (default: the cache)")
    args, beam_args = parser.parse_known_args(argv)
    stats = beam_dataset_statistics(args.path, args.split, beam_args, output=args.output)
    print(fs.format_field_statistics(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
