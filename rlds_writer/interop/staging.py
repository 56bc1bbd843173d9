"""Complete-or-absent exports: every export is built aside and moved into place whole.

An exporter killed halfway (SIGKILL, power loss, a full disk) must not leave
a directory that its consumer loads without complaint with half the episodes
(`pyarrow.dataset`, `minari.load_dataset` and `datasets.load_dataset` read
whatever files they find). So `export(src, dest, to=...)` never lets an
exporter write at `dest`:

1. it resolves the final path, refuses a destination that
   overlaps the source (`store.dataset.names.check_disjoint`) or already holds
   something, all before anything is written;
2. it makes a private staging directory next to it,
   `.<name>.partial-<pid>-<random>` (`tempfile.mkdtemp`: created exclusively,
   mode 0700, so no one can plant links in it), and the exporter writes
   `<staging>/<name>` (a format that writes elsewhere declares its own staging
   built from these parts: Minari's, `formats/minari/staging.py`, makes the
   staging directory the Minari root while the exporter runs);
3. when the exporter returns, the result is renamed to the final path (one
   `rename` on the same file system: a reader sees nothing or everything) and
   the staging directory is removed; on an error it is removed with what it
   holds.

A kill leaves only the hidden staging directory, which no consumer reads;
the next export to the same destination says so in its report (it never
deletes what another live process may be writing).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlds_writer.store.dataset import names
from rlds_writer.store.storage import file_io

_PARTIAL = ".partial-"


def stale_partials(final: Path) -> list[Path]:
    """Staging directories of earlier exports to `final` (killed, or still running)."""
    pattern = re.compile(re.escape(f".{final.name}{_PARTIAL}") + r"\d+-.+")
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir() if pattern.fullmatch(p.name))


@contextlib.contextmanager
def staging_directory(final: Path) -> Iterator[Path]:
    """A private directory next to `final`, removed with its contents on the way out."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{final.name}{_PARTIAL}{os.getpid()}-", dir=final.parent)
    )
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_free(final: Path, directory: bool) -> None:
    """Refuses a destination that holds something (a directory may exist if empty)."""
    if directory and final.is_dir() and not final.is_symlink():
        if any(final.iterdir()):
            raise FileExistsError(
                f"{final}: exists and is not an empty directory; pass a new directory"
            )
    elif os.path.lexists(final):
        raise FileExistsError(f"{final}: exists; pass a new path")


def move_into_place(built: Path, final: Path) -> None:
    """Renames the finished `built` to `final` (one rename: all or nothing).

    A directory replaces an empty directory at `final` (POSIX `rename`); a
    file is linked in, so a file that appeared at `final` meanwhile is never
    overwritten.
    """
    if built.is_dir():
        check_free(final, directory=True)
        os.rename(built, final)
    else:
        try:
            os.link(built, final)
        except FileExistsError:
            raise FileExistsError(f"{final}: appeared during the export; pass a new path") from None
    file_io.fsync_directory(final.parent)


def relabel(report: Any, staged: str, final: str) -> None:
    """Points the report at the final path instead of the staging one."""
    report.destination = final
    report.notes = [note.replace(staged, final) for note in report.notes]


def note_stale(report: Any, stale: list[Path]) -> None:
    """Tells in the report of staging directories earlier exports left behind."""
    if stale:
        shown = ", ".join(str(p) for p in stale[:3])
        report.notes.append(
            f"{len(stale)} unfinished export(s) to this destination were left by killed runs "
            f"(or are still running): {shown}; delete them once no export is running"
        )


def export_staged(
    run: Callable[..., Any], src: os.PathLike | str, dest: os.PathLike | str, *, file: bool
) -> Any:
    """Runs `run(src, staged_dest)` in a staging directory, then moves the result to `dest`.

    Args:
      run: the format's `export` with its options bound.
      src: the RLDS dataset directory.
      dest: the output directory (or, with `file`, the output file).
      file: the export is one file (d3rlpy) rather than a directory.
    """
    final = Path(os.fspath(dest))
    names.check_disjoint(src, final, src_what="source dataset")
    check_free(final, directory=not file)
    stale = stale_partials(final)
    with staging_directory(final) as staging:
        built = staging / final.name
        report = run(src, built)
        move_into_place(built, final)
    relabel(report, os.fspath(built), os.fspath(dest))
    note_stale(report, stale)
    return report
