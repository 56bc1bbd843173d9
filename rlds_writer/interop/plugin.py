"""What a format plugin declares: its importer, its exporter and their options.

A format is a subpackage of `rlds_writer.interop.formats` whose `__init__`
sets `FORMATS` to its `Importer` and/or `Exporter` (a package may declare
several, e.g. `npz-dir` and `hdf5-episodes`), or one registered at run time
with `rlds_writer.interop.register`. The declarations are plain data, cheap to
import: the code they name is imported only when the format runs, so
`rlds-writer convert --help` stays fast and needs no optional library.

From the declarations the registry (`interop.registry`) builds everything
else: `convert(...)`/`export(...)` dispatch, the CLI's `--from`/`--to`
choices, one flag per `Option` (shared by every format declaring it), the
check that a flag applies to the chosen format, `--help`, and the format table
in docs/sharing.md.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from rlds_writer.errors import optional_dependencies


@dataclasses.dataclass(frozen=True)
class Option:
    """A format-specific option: a keyword of the format's function and its CLI flag.

    Attributes:
      name: the keyword argument of the format's `convert`/`export` ("drop_partial").
      help: what it does, for `--help` (the CLI prefixes the formats that take it).
      flag: the command-line flag (default `--` + name with dashes).
      type: argparse's `type` (int, float; default str).
      choices: the values allowed, if a fixed set.
      action: argparse's action: "store_true" for a switch, "append" for a
        repeatable flag (a list), or None to take one value.
      metavar: argparse's metavar for the value.
    """

    name: str
    help: str
    flag: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    action: str | None = None
    metavar: str | None = None

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def argparse_kwargs(self) -> dict[str, Any]:
        """argparse's `add_argument` keywords for the flag (its help and default excepted)."""
        fields = {"type": self.type, "choices": self.choices, "action": self.action}
        fields["metavar"] = self.metavar
        return {k: v for k, v in fields.items() if v is not None}

    def same_flag(self, other: Option) -> bool:
        """Whether `other` may share this option's flag (same keyword, same parsing)."""
        return (self.name, self.argparse_kwargs()) == (other.name, other.argparse_kwargs())


@dataclasses.dataclass(frozen=True)
class Format:
    """One direction of a format: what `convert` reads or what `export` writes.

    Attributes:
      name: the format's name (`--from NAME` / `--to NAME`).
      code: "module:function" (or the function itself): `convert(src, dest,
        **options)` returning a `ConversionReport`, or `export(src, dest,
        **options)` returning an `ExportReport`.
      title: what it is, in a user's words ("Minari datasets").
      path: what SRC (convert) or DEST (export) is for it.
      extra: the setup.py extra(s) that install its libraries ("rllib,convert"),
        or None if the core install has them.
      options: its own options, beyond those every format takes.
      order: its place in listings (lower first; then by name).
    """

    name: str
    code: str | Callable[..., Any]
    title: str
    path: str
    extra: str | None = None
    options: tuple[Option, ...] = ()
    order: int = 100

    direction = ""  # "convert" or "export", set by the subclasses

    @property
    def feature(self) -> str:
        """The feature a missing library is named after ("converting Minari datasets")."""
        verb = "converting" if self.direction == "convert" else "exporting to"
        return f"{verb} {self.title}"

    def function(self) -> Callable[..., Any]:
        """Imports and returns the format's function."""
        return _load(self.code)

    def run(self, *args: Any, **options: Any) -> Any:
        """Calls the format's function with `args`, `options`.

        A missing optional library is a `MissingDependencyError` naming the
        feature ("converting Minari datasets") and the extra to install.
        """
        with optional_dependencies(self.feature, self.extra):
            return self.function()(*args, **options)


@dataclasses.dataclass(frozen=True)
class Importer(Format):
    """A format `convert` reads.

    Attributes:
      source_path: "module:function" (or the function) giving the local path
        a SRC is read from, when it is not SRC itself (a Minari dataset id is a
        directory of the Minari root): the destination is checked against it.
    """

    source_path: str | Callable[[str], str] | None = None
    direction = "convert"

    def resolve_source(self, src: str) -> str:
        """The local path the source is read from (checked against the destination)."""
        if self.source_path is None:
            return src
        return _load(self.source_path)(src)


@dataclasses.dataclass(frozen=True)
class Exporter(Format):
    """A format `export` writes.

    Attributes:
      writes: what DEST is: "directory" (the default) or "file"; both are
        built in a staging directory and renamed into place
        (`interop.staging.export_staged`).
      staging: "module:function" (or the function) replacing that staging,
        called as `staging(run, src, dest)` where `run(src, where)` runs the
        export (Minari writes into its root, so it stages a root).
    """

    writes: str = "directory"
    staging: str | Callable[..., Any] | None = None
    direction = "export"

    def staged(self, run: Callable[..., Any], src: Any, dest: Any) -> Any:
        """Runs `run(src, where)` so that the result appears at `dest` complete or not at all."""
        if self.staging is not None:
            return _load(self.staging)(run, src, dest)
        from rlds_writer.interop import staging

        return staging.export_staged(run, src, dest, file=self.writes == "file")


def _load(code: str | Callable[..., Any]) -> Callable[..., Any]:
    """The function `code` names ("module:function"), imported; a callable as it is."""
    if callable(code):
        return code
    module, _, name = code.partition(":")
    return getattr(importlib.import_module(module), name)


# Options more than one format takes: declared once, so their flags agree.
MAX_INFLATION = Option(
    "max_inflation",
    "the arrays read from a file may declare at most RATIO times its size (default 100; "
    "beyond, a forged size or a decompression bomb is refused); raise it for a genuine, very "
    "compressible file",
    type=float,
    metavar="RATIO",
)
OBSERVATION_SPACE = Option(
    "observation_space",
    'the observation space as Gymnasium prints it, e.g. "Box(0, 255, (64, 64, 3), uint8)" '
    "(default: the dataset's)",
    metavar="SPACE",
)
ACTION_SPACE = Option(
    "action_space",
    'the action space, e.g. "Discrete(4)" (default: the dataset\'s)',
    metavar="SPACE",
)
EPISODES_PER_FILE = Option(
    "episodes_per_file", "episodes per Parquet file (default 1000)", type=int
)
