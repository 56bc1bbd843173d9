"""`rlds-writer convert`: another offline-RL format to RLDS (the formats of `interop.FORMATS`)."""

from __future__ import annotations

import argparse
import json
import sys

from rlds_writer.cli.commands import _beam, _formats
from rlds_writer.interop import FORMATS
from rlds_writer.store.formats import shards


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert",
        help=f"convert another format to RLDS: {_formats.names(FORMATS)}",
        description=_formats.paragraph(
            "Convert another offline-RL format into an RLDS dataset in TFDS format "
            "(every field kept; termination and truncation mapped to is_terminal/is_last). "
            "The result loads with tfds.builder_from_directory(DEST)."
        ),
        epilog=_formats.listing(FORMATS, "source formats (--from FORMAT SRC):", "SRC"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--from",
        dest="source_format",
        required=True,
        choices=list(FORMATS),
        metavar="FORMAT",
        help=f"source format: {_formats.names(FORMATS)} (listed below)",
    )
    p.add_argument("src", help="the source dataset (for each format: below)")
    p.add_argument("dest", help="dataset directory to write")
    p.add_argument("--name", help="dataset name (default: derived from the source)")
    p.add_argument("--split", default="train", help="split to write (default train)")
    p.add_argument("--version", default="1.0.0", help="dataset version (default 1.0.0)")
    p.add_argument(
        "--format",
        dest="file_format",
        choices=shards.names(),
        default=shards.DEFAULT_FILE_FORMAT,
        help=f"shard file format (default {shards.DEFAULT_FILE_FORMAT})",
    )
    p.add_argument(
        "--max-episodes-per-file", type=int, default=1000, help="episodes per shard (default 1000)"
    )
    p.add_argument(
        "--mode",
        choices=("error", "append", "overwrite"),
        default="error",
        help="what to do if DEST already holds a dataset (default error)",
    )
    _formats.add_format_options(p, "convert")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _beam.add_options(p, "each source file or group of episodes is read and encoded by a worker")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer import interop as converters

    options = {
        "name": args.name,
        "split": args.split,
        "version": args.version,
        "file_format": args.file_format,
        "max_episodes_per_file": args.max_episodes_per_file,
        "mode": args.mode,
        "progress": not args.no_progress and sys.stderr.isatty(),
    }
    options.update(_formats.format_options(args, FORMATS[args.source_format]))
    beam_args = _beam.pipeline_args(args)
    if beam_args is not None:
        from rlds_writer.interop import beam_convert

        _beam.import_quietly()

        report = beam_convert.convert(args.source_format, args.src, args.dest, beam_args, **options)
    else:
        report = converters.convert(args.source_format, args.src, args.dest, **options)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
        print(f"Load it with: tfds.builder_from_directory({args.dest!r})")
    return 0
