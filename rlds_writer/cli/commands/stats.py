"""`rlds-writer stats`: episode returns, lengths, endings and step metadata per split."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rlds_writer.cli.commands import _beam


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stats",
        help="per-split statistics: returns, lengths, terminations, step metadata",
        description="Read a dataset one episode at a time and report, per split, the number "
        "of episodes and steps, episode return and length (mean, std, min, median, max), "
        "terminated vs truncated episodes, and for every numeric step-metadata field the "
        "mean/std/min/max across episodes of its per-episode mean.",
    )
    p.add_argument("path", help="dataset directory (local, or s3://, gs://, ...)")
    p.add_argument(
        "--split", action="append", help="split to read (repeatable; default: every split)"
    )
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument(
        "--plot", metavar="OUT.png", help="also draw return/length per episode and histograms"
    )
    p.add_argument(
        "--per-dimension",
        action="store_true",
        help="per-dimension mean/std/min/max/q01/q99 of every numeric step field (for "
        "normalisation), cached as dataset_statistics_<split>.json next to the dataset",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _beam.add_options(p, "--per-dimension only; each shard is read by a worker")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.maintain import statistics

    if args.per_dimension:
        return _per_dimension(args)
    if _beam.pipeline_args(args) is not None:
        raise ValueError("the Beam options (--runner, ...) apply to stats --per-dimension only")
    if args.plot:
        statistics.pyplot()  # without matplotlib, say so before reading the dataset
    stats = statistics.compute_statistics(
        args.path,
        split=args.split,
        progress=not args.no_progress and sys.stderr.isatty(),
        per_episode=bool(args.plot),
    )
    if args.plot:
        statistics.plot_statistics(stats, args.plot)
        for split_stats in stats["splits"].values():
            split_stats.pop("per_episode", None)
    if args.json:
        print(_json(stats))
    else:
        print(statistics.format_statistics(stats))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def _per_dimension(args: argparse.Namespace) -> int:
    from rlds_writer.maintain import field_statistics
    from rlds_writer.store.dataset import Dataset

    dataset = Dataset.open(args.path)  # opened once for every split
    splits = args.split or list(dataset.splits)
    beam_args = _beam.pipeline_args(args)
    if beam_args is not None:
        from rlds_writer.maintain import beam_statistics

        _beam.import_quietly()

        out = {
            split: beam_statistics.beam_dataset_statistics(args.path, split, beam_args)
            for split in splits
        }
    else:
        out = {split: field_statistics.dataset_statistics(dataset, split) for split in splits}
    if args.json:
        print(_json(out if len(out) > 1 else out[splits[0]]))
    else:
        print("\n".join(field_statistics.format_field_statistics(s) for s in out.values()))
    return 0


def _finite(value: Any) -> Any:
    """`value` with NaN and infinite numbers as None: standard JSON has no NaN or Infinity."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json(value: Any) -> str:
    """Statistics as standard JSON (non-finite numbers null), which jq and JSON.parse read."""
    return json.dumps(_finite(value), indent=2, allow_nan=False)
