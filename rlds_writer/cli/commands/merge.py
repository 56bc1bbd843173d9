"""`rlds-writer merge`: combine the directories of parallel writers into one dataset."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "merge",
        help="merge datasets written by parallel writers into one directory",
        description="Merge datasets with the same features, name and version (e.g. the "
        "writer-* subdirectories of parallel writers) into one directory with one "
        "contiguous shard sequence per split. Safe to rerun after an interruption.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC", help="source dataset directories")
    p.add_argument("--output", "-o", required=True, help="destination directory")
    p.add_argument(
        "--move",
        action="store_true",
        help="move the shard files instead of copying them, then remove the sources",
    )
    p.add_argument(
        "--no-recover",
        action="store_true",
        help="do not run recover on the sources first",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.store.repair.merge import merge

    report = merge(args.sources, args.output, move=args.move, recover_sources=not args.no_recover)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for source, summary in report.recovered.items():
            print(f"recovered {source}: {summary}")
        print(report.summary())
    return 0
