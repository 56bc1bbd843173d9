"""Beam's standard pipeline options on `convert` and `stats --per-dimension`.

Any of them runs the command as an Apache Beam pipeline: `--runner` and
the DirectRunner's `--direct_running_mode` / `--direct_num_workers` as Beam
spells them, and every other pipeline option through
`--beam_pipeline_options "project=p,region=r,setup_file=./setup.py"` (as
`tfds build` takes them).
"""

from __future__ import annotations

import argparse
import logging


def add_options(parser: argparse.ArgumentParser, what: str) -> None:
    """Adds the Beam options to a command's parser; `what` says what runs on the workers."""
    group = parser.add_argument_group(
        "Apache Beam (any of these runs the command as a Beam pipeline: " + what + ")"
    )
    group.add_argument(
        "--runner",
        metavar="RUNNER",
        help="Beam runner: DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, ...",
    )
    group.add_argument(
        "--direct_running_mode",
        choices=("in_memory", "multi_threading", "multi_processing"),
        help="DirectRunner: run the workers in this process, threads or processes",
    )
    group.add_argument(
        "--direct_num_workers", type=int, metavar="N", help="DirectRunner: number of workers"
    )
    group.add_argument(
        "--beam_pipeline_options",
        metavar="K=V,...",
        help="more pipeline options, comma-separated (e.g. project=p,region=r,temp_location="
        "gs://b/tmp,setup_file=./setup.py: the workers need rlds_writer installed)",
    )


def pipeline_args(args: argparse.Namespace) -> list[str] | None:
    """Beam's command-line arguments from the options given, or None for none (no Beam)."""
    out = []
    for name in ("runner", "direct_running_mode", "direct_num_workers"):
        value = getattr(args, name, None)
        if value is not None:
            out.append(f"--{name}={value}")
    for option in (args.beam_pipeline_options or "").split(","):
        option = option.strip()
        if not option:
            continue
        key, sep, value = option.partition("=")
        if not key.strip():
            raise ValueError(
                f"--beam_pipeline_options: {option!r} is not KEY=VALUE (e.g. project=my-project)"
            )
        out.append(f"--{key.strip().lstrip('-')}={value.strip()}" if sep else f"--{key.strip()}")
    if not out:
        return None
    if getattr(args, "runner", None) is None and not any(a.startswith("--runner=") for a in out):
        out.insert(0, "--runner=DirectRunner")
    return out


class _DropApitoolsNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


def import_quietly() -> None:
    """Imports Beam without its notice about Google Cloud client libraries on stderr.

    Beam logs it at import whenever the `gcp` extra is absent, which it need
    not be for these commands (a Dataflow user installs `apache-beam[gcp]`).
    """
    from rlds_writer.errors import import_optional

    notice = _DropApitoolsNotice()
    root = logging.getLogger()
    root.addFilter(notice)
    try:
        import_optional("apache_beam", "running as a Beam pipeline")
    finally:
        root.removeFilter(notice)
