"""`convert --from` and `export --to` made from the interop registry: flags, help, checks.

`rlds_writer.interop.FORMATS` and `EXPORT_FORMATS` are what the code
dispatches on; the parser takes its choices, its format flags (one per
`Option`, shared by the formats that declare it) and its help from them, and
refuses a flag the chosen format does not take, so a format cannot be added
without showing up in `--help`. `markdown_table` is the format table of
docs/sharing.md (a test keeps the two equal).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping
from typing import Any

from rlds_writer.errors import pip_install

_WIDTH = 78
_NBSP = "\xa0"


def names(formats: Mapping[str, Any] | list[str], last_word: str = "or") -> str:
    """ "minari, d4rl-hdf5 or lerobot"."""
    *first, last = formats
    return f"{', '.join(first)} {last_word} {last}" if first else last


def add_format_options(parser: argparse.ArgumentParser, direction: str) -> None:
    """Adds one flag per format option of `direction` ("convert" or "export").

    The help starts with the formats that take it; a flag left out is absent
    from the parsed arguments, so the format's own default applies.
    """
    from rlds_writer.interop import registry

    for option, formats in registry.options_of(direction):
        kwargs = option.argparse_kwargs()
        if option.action in (None, "append") and "choices" not in kwargs:
            # What argparse would show without our dest: --task-field TASK_FIELD.
            kwargs.setdefault("metavar", option.cli_flag.lstrip("-").replace("-", "_").upper())
        parser.add_argument(
            option.cli_flag,
            dest=_dest(option.cli_flag),
            default=argparse.SUPPRESS,
            help=f"{', '.join(formats)}: {option.help}",
            **kwargs,
        )


def format_options(args: argparse.Namespace, fmt: Any) -> dict[str, Any]:
    """The format options given on the command line, as keywords of `fmt`'s function.

    Raises:
      ValueError: a flag given that `fmt` does not take, naming the formats that do.
    """
    from rlds_writer.interop import registry

    mine = {o.cli_flag for o in fmt.options}
    selector = "--from" if fmt.direction == "convert" else "--to"
    options, foreign = {}, {}
    for option, formats in registry.options_of(fmt.direction):
        dest = _dest(option.cli_flag)
        if dest not in args:
            continue
        if option.cli_flag in mine:
            options[option.name] = getattr(args, dest)
        else:
            foreign.setdefault(tuple(formats), []).append(option.cli_flag)
    if foreign:
        raise ValueError(
            "; ".join(
                f"{names(flags, 'and')} {'applies' if len(flags) == 1 else 'apply'} to "
                f"{selector} {names(list(formats), 'and')} only"
                for formats, flags in foreign.items()
            )
        )
    return options


def _dest(flag: str) -> str:
    # Apart from the common options' attributes (a format's keyword may be `name`).
    return "format_option_" + flag.lstrip("-").replace("-", "_")


def listing(formats: Mapping[str, Any], heading: str, path_name: str) -> str:
    """An indented list, one format per entry: name, what it is, the path, the extra."""
    lines = [heading]
    for name, fmt in formats.items():
        # No-break spaces keep the install command on one line, to copy it whole.
        install = pip_install(fmt.extra).replace(" ", _NBSP) if fmt.extra else ""
        text = f"{fmt.title}; {path_name} is {fmt.path}" + (f"; needs {install}" if install else "")
        wrapped = textwrap.wrap(
            text,
            _WIDTH,
            initial_indent=f"  {name:16s}",
            subsequent_indent=" " * 18,
            break_on_hyphens=False,
        )
        lines.extend(line.replace(_NBSP, " ") for line in wrapped)
    return "\n".join(lines)


def paragraph(text: str) -> str:
    """`text` wrapped for a description that argparse prints as it is."""
    return textwrap.fill(text, _WIDTH)


def markdown_table() -> str:
    """The table of formats in docs/sharing.md: each way, what it is, extra, options."""
    from rlds_writer.errors import pip_install
    from rlds_writer.interop import registry

    rows = [
        "| format | direction | what it is | SRC / DEST | install | options |",
        "|---|---|---|---|---|---|",
    ]
    for command, table in (
        ("convert --from", registry.FORMATS),
        ("export --to", registry.EXPORT_FORMATS),
    ):
        for name, fmt in table.items():
            install = f"`{pip_install(fmt.extra)}`" if fmt.extra else "core"
            flags = ", ".join(f"`{o.cli_flag}`" for o in fmt.options) or "none"
            path = fmt.path.replace("|", "\\|")
            rows.append(f"| `{name}` | `{command}` | {fmt.title} | {path} | {install} | {flags} |")
    return "\n".join(rows)
