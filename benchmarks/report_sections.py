"""Writing one benchmark's section into benchmarks/REPORT.md, leaving the others as they are."""

from __future__ import annotations

import argparse
import os
import re

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "REPORT.md")


def add_report_argument(parser: argparse.ArgumentParser) -> None:
    """`--report [PATH]`: write the section into PATH (default benchmarks/REPORT.md)."""
    parser.add_argument(
        "--report",
        nargs="?",
        const=REPORT,
        help="write the table into this report (default benchmarks/REPORT.md)",
    )


TITLE = "# rlds_writer benchmark report"


def write_section(path: str, heading: str, text: str) -> None:
    """Replaces the `heading` section of the report at `path` with `text` (or appends it)."""
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else TITLE + "\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(old):
        # A callable replacement: `text` is inserted as it is (no backslash escapes).
        new = pattern.sub(lambda _: text.rstrip() + "\n\n", old, count=1)
    else:
        new = old.rstrip() + "\n\n" + text
    with open(path, "w", encoding="utf-8") as f:
        f.write(new.rstrip() + "\n")


def write_sections(path: str, text: str) -> None:
    """Writes every `## ` section of `text` into the report, keeping the report's others."""
    for match in re.finditer(r"^## .*?(?=^## |\Z)", text, re.S | re.M):
        section = match.group(0).rstrip()
        write_section(path, section.splitlines()[0], section)
