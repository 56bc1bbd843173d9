"""`rlds-writer export`: an RLDS dataset to another format (those of `interop.EXPORT_FORMATS`)."""

from __future__ import annotations

import argparse
import json
import sys

from rlds_writer.cli.commands import _formats
from rlds_writer.interop import EXPORT_FORMATS


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help=f"export an RLDS dataset to {_formats.names(EXPORT_FORMATS)}",
        description=_formats.paragraph(
            "Export an RLDS dataset (streamed, one episode at a time) for an offline-RL library."
        ),
        epilog=_formats.listing(EXPORT_FORMATS, "target formats (--to FORMAT DEST):", "DEST"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--to",
        dest="target",
        required=True,
        choices=list(EXPORT_FORMATS),
        metavar="FORMAT",
        help=f"target format: {_formats.names(EXPORT_FORMATS)} (listed below)",
    )
    p.add_argument("src", help="RLDS dataset directory")
    p.add_argument("dest", help="what to write (for each format: below)")
    p.add_argument("--split", default="train", help="split to export (default train)")
    p.add_argument(
        "--cut-short",
        choices=("truncated", "drop"),
        default="truncated",
        help="episodes the recorder cut short (close/reset mid-episode): export them as "
        "truncated (default) or drop them",
    )
    _formats.add_format_options(p, "export")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.interop import export as exporters

    options = {
        "split": args.split,
        "cut_short": args.cut_short,
        "progress": not args.no_progress and sys.stderr.isatty(),
    }
    options.update(_formats.format_options(args, EXPORT_FORMATS[args.target]))
    report = exporters.export(args.src, args.dest, to=args.target, **options)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    return 0
