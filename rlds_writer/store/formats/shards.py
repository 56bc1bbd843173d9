"""The shard file formats, by name: the one registry.

Like TFDS's `file_adapters.ADAPTER_FOR_FORMAT`: `adapter(file_format)` gives
the `FileFormat` object (`store/formats/shard_format.py`) that writes, walks, reads,
checks and repairs shards of that format. Built-in formats are named here by
import path and loaded when first used, so listing the names (`names()`, for
the CLI's choices and the layout's checks) imports no format's code. A third
format is one module with a `FileFormat` subclass and one line in `_BUILT_IN`
(or `register(...)` from outside the package).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlds_writer.store.formats.shard_format import FileFormat, ShardWriter

# Name -> "module:class" of its `FileFormat`, or the object once loaded.
_BUILT_IN = {
    "tfrecord": "rlds_writer.store.formats.tfrecord.tfrecord_shards:TFRecordFormat",
    "array_record": "rlds_writer.store.formats.array_record.array_record_shards:ArrayRecordFormat",
}
_FORMATS: dict[str, Any] = dict(_BUILT_IN)

# What a dataset_info.json without `fileFormat` means (TFDS's default), and what we write.
DEFAULT_FILE_FORMAT = "tfrecord"


def names() -> tuple[str, ...]:
    """The registered file format names, as shard names and `fileFormat` spell them."""
    return tuple(_FORMATS)


def register(file_format: FileFormat | str) -> None:
    """Adds a file format (a `FileFormat` object, or `"module:Class"`) under its name.

    Raises:
      ValueError: the name is taken by another format, or cannot be part of a
        shard's file name.
    """
    if isinstance(file_format, str):
        file_format = _load(file_format)
    name = file_format.name
    if not name or not name.replace("_", "").isalnum() or not name.islower():
        raise ValueError(f"file format name must be lowercase letters, digits and _: {name!r}")
    current = _FORMATS.get(name)
    if current is not None and current is not file_format:
        raise ValueError(f"file format {name!r} is already registered ({current!r})")
    _FORMATS[name] = file_format


def unregister(name: str) -> None:
    """Removes a format added with `register` (built-in formats cannot be removed)."""
    if name in _BUILT_IN:
        raise ValueError(f"{name!r} is a built-in file format")
    _FORMATS.pop(name, None)


def _load(path: str) -> FileFormat:
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)()


def adapter(file_format: str) -> FileFormat:
    """Returns the `FileFormat` of a format name; raises ValueError for an unknown one."""
    try:
        fmt = _FORMATS[file_format]
    except (KeyError, TypeError):
        raise ValueError(f"file_format must be one of {names()}, got {file_format!r}") from None
    if isinstance(fmt, str):
        fmt = _FORMATS[file_format] = _load(fmt)
    return fmt


def formats() -> Iterator[FileFormat]:
    """Every registered `FileFormat` object (loading the built-in ones)."""
    for name in names():
        yield adapter(name)


def open_writer(
    path: Any, file_format: str, fsync: bool = False, max_records: int | None = None
) -> ShardWriter:
    """Opens a new shard file of `file_format` for writing (a `ShardWriter`)."""
    return adapter(file_format).open_writer(path, fsync, max_records)
