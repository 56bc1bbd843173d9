"""Names that become file or directory names: the one check every tool uses.

Field names (LeRobot video files), PettingZoo agent ids and agent groups,
RLlib module ids (dataset directories), dataset and split names (shard files)
and the parts of path templates read from other formats' metadata all become
one component of a path. Each is checked here before anything is opened or
created with it: a name with a separator, `..`, a leading dot, a NUL or an
absolute path could otherwise make a recorder, importer or exporter write or
read outside the directory it was given.

A safe name is 1-255 characters of ASCII letters, digits and `_.+-`, starts
with a letter, digit or `_` (no hidden files, nothing an argument parser takes
for an option) and has no `..`.

`check_disjoint` refuses a destination that is, is inside or contains its
source (symbolic links resolved), before a converter or exporter writes.
"""

from __future__ import annotations

import os
import re
from typing import Any

from rlds_writer.errors import UnsafePathError

ALLOWED = "1-255 ASCII letters, digits and _.+-, starting with a letter, digit or _, without '..'"
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")


def is_safe_name(value: Any) -> bool:
    """True if `value` is a str that can be one path component (see the module doc)."""
    return isinstance(value, str) and bool(_SAFE.fullmatch(value)) and ".." not in value


def check_name(
    value: Any,
    what: str,
    *,
    where: str = "",
    fix: str = "rename it",
    error: type[Exception] = UnsafePathError,
) -> str:
    """Returns `value` if it can be one file or directory name; raises otherwise.

    Args:
      value: the name (anything; only a str can pass).
      what: what the name is, for the message (e.g. "agent id").
      where: the file or object it came from, prefixed to the message.
      fix: advice that fixes it, the end of the message.
      error: the error class (an `RLDSWriterError` subclass).

    Raises:
      `error` (by default `UnsafePathError`): a one-line message naming the
      value, what it is and what is allowed.
    """
    if is_safe_name(value):
        return value
    prefix = f"{where}: " if where else ""
    raise error(
        f"{prefix}{what} {value!r} cannot be a file or directory name (expected {ALLOWED}); {fix}"
    )


def check_relative_path(
    value: Any,
    what: str,
    *,
    where: str = "",
    fix: str = "fix the file",
    error: type[Exception] = UnsafePathError,
) -> str:
    """Returns `value` if it is a relative path of safe names joined by `/`.

    Used for paths read from another format's metadata once their template
    fields are filled in: no absolute path, no `..`, no empty or hidden part.
    """
    parts = value.split("/") if isinstance(value, str) else [value]
    if not all(is_safe_name(part) for part in parts):
        prefix = f"{where}: " if where else ""
        raise error(
            f"{prefix}{what} {value!r} is not a relative path inside the dataset (expected "
            f"names of {ALLOWED}, joined by '/'); {fix}"
        )
    return value


def check_disjoint(src: Any, dest: Any, *, src_what: str = "source") -> None:
    """Refuses a destination that is, is inside or contains the source path.

    Both paths are resolved first (symbolic links, `..`, relative paths), so
    a link to the source counts as the source. Remote paths (`scheme://`) are
    compared as written.

    Raises:
      UnsafePathError: naming both paths; nothing has been written.
    """
    src_s, dest_s = os.fspath(src), os.fspath(dest)
    if "://" in src_s or "://" in dest_s:
        a, b = src_s.rstrip("/"), dest_s.rstrip("/")
        sep = "/"
    else:
        a, b = os.path.realpath(src_s), os.path.realpath(dest_s)
        sep = os.sep
    if a == b:
        relation = "is"
    elif b.startswith(a.rstrip(sep) + sep):
        relation = "is inside"
    elif a.startswith(b.rstrip(sep) + sep):
        relation = "contains"
    else:
        return
    shown = f" ({b} and {a})" if (a, b) != (src_s, dest_s) else ""
    raise UnsafePathError(
        f"{dest_s}: the destination {relation} the {src_what} {src_s}{shown}; writing there "
        "would destroy the source. Pass a destination outside the source"
    )
