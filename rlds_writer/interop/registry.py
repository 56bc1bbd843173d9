"""The one registry of interop formats: every `convert` source and `export` target.

`FORMATS` (sources, by `--from` name) and `EXPORT_FORMATS` (targets, by
`--to` name) are filled from the declarations of the subpackages of
`rlds_writer.interop.formats` (each sets `FORMATS` to its `plugin.Importer`s
and `plugin.Exporter`s) and from `register` calls. Adding a format is one
subpackage there: dispatch, the CLI's choices, flags and `--help`, and the
docs' format table are all made from here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

from rlds_writer.interop.plugin import Exporter, Format, Importer, Option

FORMATS: dict[str, Importer] = {}
EXPORT_FORMATS: dict[str, Exporter] = {}

_BUILTIN_PACKAGE = "rlds_writer.interop.formats"

# The flags `rlds-writer convert`/`export` give every format (cli/commands/):
# no format option may take one (tests/interop/test_format_plugins.py keeps
# this list equal to the parsers').
COMMON_FLAGS = {
    "convert": (
        "-h",
        "--help",
        "--from",
        "--name",
        "--split",
        "--version",
        "--format",
        "--max-episodes-per-file",
        "--mode",
        "--json",
        "--no-progress",
        # Apache Beam's pipeline options (cli/commands/_beam.py).
        "--runner",
        "--direct_running_mode",
        "--direct_num_workers",
        "--beam_pipeline_options",
    ),
    "export": ("-h", "--help", "--to", "--split", "--cut-short", "--json", "--no-progress"),
}


def _table(fmt: Format) -> dict[str, Format]:
    if isinstance(fmt, Importer):
        return FORMATS  # type: ignore[return-value]
    if isinstance(fmt, Exporter):
        return EXPORT_FORMATS  # type: ignore[return-value]
    raise TypeError(f"expected an interop.plugin.Importer or Exporter, got {fmt!r}")


def register(*formats: Format, replace: bool = False) -> None:
    """Adds formats to `convert` (an `Importer`) or `export` (an `Exporter`).

    Their options' flags join those of the command line; a flag another format
    already declares must mean the same keyword, parsed the same way.

    Args:
      *formats: the declarations.
      replace: replace a format of the same name and direction (else an error).

    Raises:
      ValueError: a name already taken, a flag declared differently, or one of
        the flags every format takes (`COMMON_FLAGS`).
    """
    for fmt in formats:
        table = _table(fmt)
        for option in fmt.options:
            if option.cli_flag in COMMON_FLAGS[fmt.direction]:
                raise ValueError(
                    f"{fmt.name}: option {option.cli_flag} is one every {fmt.direction} format "
                    "takes; give it another name or flag"
                )
        if fmt.name in table and not replace:
            raise ValueError(
                f"{fmt.direction} format {fmt.name!r} is already registered "
                f"({table[fmt.name].code!r}); pick another name or pass replace=True"
            )
        others = [f for f in table.values() if f.name != fmt.name]
        for option in fmt.options:
            for other in others:
                for theirs in other.options:
                    if theirs.cli_flag == option.cli_flag and not theirs.same_flag(option):
                        raise ValueError(
                            f"{fmt.name}: option {option.cli_flag} is declared differently by "
                            f"{other.name} ({theirs.name!r}); use the same Option or another flag"
                        )
        table[fmt.name] = fmt
        ordered = sorted(table.values(), key=lambda f: (f.order, f.name))
        table.clear()
        table.update((f.name, f) for f in ordered)


def unregister(name: str, direction: str) -> None:
    """Removes format `name` from `direction` ("convert" or "export"), if registered."""
    table = {"convert": FORMATS, "export": EXPORT_FORMATS}[direction]
    table.pop(name, None)


def options_of(direction: str) -> list[tuple[Option, list[str]]]:
    """Every format option of a direction, once per flag, with the formats that take it.

    The CLI makes one flag of each, in the order the formats are listed.
    """
    table = {"convert": FORMATS, "export": EXPORT_FORMATS}[direction]
    seen: dict[str, tuple[Option, list[str]]] = {}
    for fmt in table.values():
        for option in fmt.options:
            seen.setdefault(option.cli_flag, (option, []))[1].append(fmt.name)
    return list(seen.values())


def _builtin() -> Iterable[Format]:
    package = importlib.import_module(_BUILTIN_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{_BUILTIN_PACKAGE}.{info.name}")
        yield from getattr(module, "FORMATS", ())


register(*_builtin())
