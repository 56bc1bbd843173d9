"""The `rlds-writer` command-line tool.

Each subcommand lives in a module of `rlds_writer.commands` that defines
`register(subparsers)`; the parser picks them all up.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys

from rlds_writer import commands as _commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlds-writer",
        description="Record RL rollouts as RLDS episodes in TFDS datasets, and manage them.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the tool; returns the process exit code."""
    # TensorFlow's C++ info lines drown the tool's own output; users can still
    # ask for them by setting the variable themselves.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - one clear line instead of a traceback
        from rlds_writer.errors import RLDSWriterError

        if args.verbose or not isinstance(e, RLDSWriterError | FileNotFoundError | ValueError):
            raise
        print(f"rlds-writer {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
