"""The `rlds-writer` command line: argument parsing and one-line errors.

Each subcommand lives in a module of `rlds_writer.cli.commands` that defines
`register(subparsers)`; the parser picks them all up. The command modules
import the library lazily, so `--help` stays fast.

A user's mistake (a path that is not a dataset, a missing optional library,
a bad value) is one line on stderr, in the command line's words (`--mode
append`, the command to rerun), and exit code 1; `--verbose` shows the
traceback and lets TensorFlow log.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import shlex
import sys

_COMMANDS_PACKAGE = "rlds_writer.cli.commands"


def _version() -> str:
    from rlds_writer import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlds-writer",
        description="Record RL rollouts as RLDS episodes in TFDS datasets, and manage them.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log progress details; on an error, show the traceback; let TensorFlow log",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for info in sorted(
        pkgutil.iter_modules(importlib.import_module(_COMMANDS_PACKAGE).__path__),
        key=lambda m: m.name,
    ):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_COMMANDS_PACKAGE}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the tool; returns the process exit code."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.verbose:
        import rlds_writer

        rlds_writer._tensorflow.show_tensorflow_logs()
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`rlds-writer info X | head`): not an
        # error. Point stdout at devnull so the interpreter's final flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - one clear line instead of a traceback
        from rlds_writer import errors

        if isinstance(e, ModuleNotFoundError) and not isinstance(e, errors.RLDSWriterError):
            # An optional library missing where no feature named it: say which
            # extra brings it (other missing modules are bugs: traceback).
            if (e.name or "").partition(".")[0] in errors.OPTIONAL_MODULES:
                e = errors.missing_dependency(e.name or "", f"rlds-writer {args.command}")
        # OSError covers what users meet on the command line: a path that is a
        # file or a directory, no permission, a full disk.
        if args.verbose or not isinstance(e, errors.RLDSWriterError | OSError | ValueError):
            raise
        print(f"rlds-writer {args.command}: error: {_in_cli_words(e, args, argv)}", file=sys.stderr)
        return 1


def _in_cli_words(error: Exception, args: argparse.Namespace, argv: list[str]) -> str:
    """The error's message, with advice given as options and commands, not Python arguments."""
    from rlds_writer import errors

    if isinstance(error, errors.DatasetExistsError) and error.directory and "mode" in args:
        return (
            f"{error.directory} already holds a dataset; rerun with --mode append to add "
            "episodes to it or --mode overwrite to replace it"
        )
    if isinstance(error, errors.NotADatasetError) and error.datasets:
        found = errors.counted(len(error.datasets), "dataset")
        if args.command == "merge" and len(error.datasets) <= 10:
            # Sources of a merge: all of them, in one command.
            merge_all = _rerun(argv, error.path, error.datasets)
            return f"{error.message()}; {found} below it, merge them: `{merge_all}`"
        return error.message(lambda dataset: f"`{_rerun(argv, error.path, [dataset])}`")
    return str(error)


def _rerun(argv: list[str], path: str, datasets: list[str]) -> str:
    """The command line the user ran, with `datasets` for `path` (else `info` on the first)."""
    target = os.path.normpath(path)
    for i, arg in enumerate(argv):
        if not arg.startswith("-") and os.path.normpath(arg) == target:
            return "rlds-writer " + shlex.join([*argv[:i], *datasets, *argv[i + 1 :]])
    return "rlds-writer info " + shlex.quote(datasets[0])


if __name__ == "__main__":
    raise SystemExit(main())
