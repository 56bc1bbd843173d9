"""Reading an HDF5 source file without leaving it or trusting its sizes.

HDF5 lets a file take data from other files: external links
(`h5py.ExternalLink`), external raw storage (`create_dataset(...,
external=[...])`) and virtual datasets. Converting such a file would copy
data from files the user never named into the RLDS dataset, so they are
refused, naming the link or dataset, before anything is read (the fix is to
store the data in the file itself, e.g. `h5repack` or a copy with h5py).

`walk` lists the datasets and groups of a file, each object once, without
recursion (a deep file cannot exhaust the stack) and refusing a group that
links back to one of its ancestors (a cycle). `Budget` (in
`source_limits`) bounds the bytes the datasets read may declare, so a
dataset of 2**36 unallocated rows is an error, not an allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from rlds_writer.errors import SourceError
from rlds_writer.interop.source_limits import (
    Budget,
    declared_nbytes,
    describe,
    size_text,
    source_errors,
)

_FIX = "store the data in the file itself (e.g. rewrite it with h5repack, or copy it with h5py)"


@contextlib.contextmanager
def open_file(path: os.PathLike | str, expected: str) -> Iterator[Any]:
    """Opens an HDF5 source read-only; read errors become one-line `SourceError`s.

    Args:
      path: the file.
      expected: what the file should be, for the message when it is not a file.
    """
    import h5py

    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "nothing"
        raise SourceError(f"{path}: expected {expected}, found {what}; pass the file")
    with source_errors(path):
        with h5py.File(path, "r") as f:
            refuse_external_links(f, path)
            yield f


def refuse_external_links(f: Any, path: str) -> None:
    """Refuses an external link anywhere in the file (soft links may lead to any of them)."""
    import h5py

    found: list[bytes] = []

    def visit(name: bytes, info: Any) -> Any:
        # The link's type comes with the visit: no path is resolved (a deep file
        # would cost its depth per link).
        if info.type == h5py.h5l.TYPE_EXTERNAL:
            found.append(name)
            return True  # stop the walk
        return None

    f.id.links.visit(visit, info=True)
    if found:
        name = found[0].decode("utf-8", "replace")
        link = f.get(name, getlink=True)
        raise SourceError(
            f"{path}: /{name} is an external link to {link.path} in {link.filename}; "
            f"an importer reads only the file it is given: {_FIX}"
        )


@dataclasses.dataclass
class Contents:
    """What `walk` found: datasets and groups by path (no leading `/`), each object once."""

    datasets: dict[str, Any]
    groups: dict[str, Any]


def walk(root: Any, path: str) -> Contents:
    """Every dataset and group under `root`, refusing links out of the file and cycles.

    Args:
      root: an open `h5py.Group` (or `File`).
      path: the file, for messages.

    Raises:
      SourceError: for an external link, a dataset stored in other files, a
        virtual dataset, or a group that links back to an ancestor.
    """
    import h5py

    datasets: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    seen: dict[Any, str] = {root.id: ""}
    parent: dict[Any, Any] = {root.id: None}
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        group, prefix = stack.pop()
        for name in sorted(group.keys(), reverse=True):
            key = f"{prefix}{name}"
            item = group.get(name)  # external links are refused when the file is opened
            if isinstance(item, h5py.Group):
                if item.id in seen:
                    # A second name for a group already listed, or a cycle.
                    node = group.id
                    while node is not None and node != item.id:
                        node = parent[node]
                    if node is not None:
                        base = root.name.rstrip("/")
                        target = f"{base}/{seen[item.id]}".rstrip("/") or "/"
                        raise SourceError(
                            f"{path}: group {base}/{key} links back to {target}, which holds "
                            "it (a cycle); remove the link"
                        )
                    continue
                seen[item.id] = key
                parent[item.id] = group.id
                groups[key] = item
                stack.append((item, f"{key}/"))
            elif isinstance(item, h5py.Dataset):
                if item.id in seen:
                    continue
                seen[item.id] = key
                check_dataset(item, key, path)
                datasets[key] = item
    return Contents(datasets, groups)


def check_dataset(ds: Any, key: str, path: str) -> None:
    """Refuses a dataset whose data lives in other files."""
    if ds.is_virtual:
        sources = sorted({s.file_name for s in ds.virtual_sources()})
        raise SourceError(
            f"{path}: /{key} is a virtual dataset reading {sources}; an importer reads only the "
            f"file it is given: {_FIX}"
        )
    external = ds.external
    if external:
        names = sorted({os.fsdecode(e[0]) for e in external})
        raise SourceError(
            f"{path}: /{key} keeps its data in external files {names}; an importer reads only "
            f"the file it is given: {_FIX}"
        )


def dataset(group: Any, key: str, path: str) -> Any:
    """`group[key]` if it is a dataset of this file (soft links followed), else None."""
    import h5py

    try:
        item = group.get(key)
    except (KeyError, ValueError):
        return None
    if not isinstance(item, h5py.Dataset):
        return None
    check_dataset(item, item.name.lstrip("/"), path)
    return item


def take(budget: Budget, ds: Any, key: str, rows: int | None = None) -> None:
    """Counts the bytes reading `ds` (or its first `rows` rows) declares against `budget`."""
    shape = tuple(ds.shape or ())
    if rows is not None and shape:
        shape = (min(int(rows), int(shape[0])), *shape[1:])
    nbytes = declared_nbytes(shape, ds.dtype.itemsize)
    budget.take(nbytes, key, describe(ds.dtype.name, tuple(ds.shape or ())))


def attributes(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """The attributes of `obj` whose declared size its file can hold (others are skipped)."""
    import h5py

    limit = os.path.getsize(path)
    for name in obj.attrs:
        with source_errors(path, f"attribute {name!r} of {obj.name}"):
            attr = h5py.h5a.open(obj.id, name.encode() if isinstance(name, str) else name)
            shape = attr.shape or ()
            nbytes = declared_nbytes(tuple(shape), attr.dtype.itemsize)
            if nbytes > limit:
                raise SourceError(
                    f"{path}: attribute {name!r} of {obj.name} declares "
                    f"{describe(attr.dtype.name, tuple(shape))} ({size_text(nbytes)}), more than "
                    f"the whole file ({size_text(limit)})"
                )
            yield name, obj.attrs[name]


def read_all(ds: Any, key: str, path: str) -> np.ndarray:
    """`ds[()]`, its read errors one line naming `key`."""
    with source_errors(path, key):
        return ds[()]
