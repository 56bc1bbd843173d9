"""Help text for `convert --from` and `export --to`, built from the interop registry.

`rlds_writer.interop.FORMATS` and `EXPORT_FORMATS` are what the code
dispatches on; the parser takes its choices and help from them, so a format
cannot be added without showing up in `--help`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from rlds_writer.errors import pip_install

_WIDTH = 78
_NBSP = "\xa0"


def names(formats: Mapping[str, Any]) -> str:
    """ "minari, d4rl-hdf5 or lerobot"."""
    *first, last = formats
    return f"{', '.join(first)} or {last}" if first else last


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
