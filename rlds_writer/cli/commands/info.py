"""`rlds-writer info`: what a dataset holds (splits, episodes, steps, features, metadata)."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "info",
        help="summarize a dataset: splits, episodes, steps, bytes, shards, features, metadata",
        description="Summarize a dataset directory without TensorFlow: splits, episodes, "
        "steps, bytes, shards, the features as a tree, metadata.json, and anything "
        "`recover` would fix.",
    )
    p.add_argument("path", help="dataset directory (local, or s3://, gs://, ...)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--no-steps",
        action="store_true",
        help="do not read the shards to count steps (faster on large datasets)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.maintain.summary import info, render_info

    summary = info(args.path, count_steps=not args.no_steps)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(render_info(summary))
    return 0
