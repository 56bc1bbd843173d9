"""What a shard file format is: the `FileFormat` interface every format implements.

A format (`store/formats/tfrecord/tfrecord_shards.py`,
`store/formats/array_record/array_record_shards.py`) is one object that
names its files (`name`, as in shard names and `fileFormat`),
writes a new shard (`open_writer`), walks a whole shard (`records`, `walk`),
gives random access to its records (`open_reader`), and checks and repairs a
shard for `recover` (`check`, `rewrite`, `cut`). `store/formats/shards.py` registers
the formats by name; nothing else branches on the file format.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from etils import epath


# Records smaller than this are joined into one bytes object before writing.
_JOIN_BELOW = 1 << 18
# A damaged file is set aside under a hidden name with this prefix, never deleted
# (listings skip it; `info` counts it).
QUARANTINE_PREFIX = ".corrupt-"


def quarantine_name(name: str) -> str:
    """Returns the hidden name a damaged file is set aside under (never deleted)."""
    return f"{QUARANTINE_PREFIX}{name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


class ShardWriter(Protocol):
    """A shard being written: records in, `flush` to the OS, `close`."""

    file_format: str
    path: epath.Path
    num_records: int
    num_bytes: int

    def write(self, record: bytes | list[Any], length: int | None = None) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class ShardReader(Protocol):
    """Random and sequential access to the records of one shard.

    Readers pickle without their open handles (DataLoader workers reopen them)
    and keep a per-record step-count cache for the reader's episode lengths.
    """

    path: str
    num_records: int

    def read(self, i: int) -> bytes: ...
    def iter(self, start: int, stop: int, skip: bool) -> Iterator[tuple[int, bytes]]: ...
    def close(self) -> None: ...
    @property
    def cached_steps(self) -> Any: ...
    def store_steps(self, steps: Any) -> None: ...


def join_parts(record: bytes | list[Any], length: int | None) -> tuple[list[Any], int]:
    """A record given whole or as parts: its parts (small ones joined) and its length."""
    parts = [record] if isinstance(record, bytes | bytearray | memoryview) else record
    if length is None:
        length = sum(len(p) for p in parts)
    if len(parts) > 1 and length < _JOIN_BELOW:
        # Small record: one join beats per-part CRC and iovec handling.
        parts = [b"".join(parts)]
    return parts, length


class PerProcess:
    """A reader that pickles without its open handle and lock (DataLoader workers reopen)."""

    _HANDLE = ""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state[self._HANDLE] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


@dataclasses.dataclass
class ShardCheck:
    """What checking one shard file found, and the repair it needs.

    Attributes:
      records: complete, valid records kept.
      num_bytes: their data bytes.
      file_size: the file's size.
      detail: what was wrong, one line each.
      removable: no record and only a crash's torn start: the file may be deleted
        (otherwise a file without records is set aside).
      rewrite: damage between records: rewrite the shard with its good records
        (the original set aside first).
      cut_to: a crash's torn tail: cut the file to this size.
      scan: the format's own scan, for `rewrite`.
    """

    records: int
    num_bytes: int
    file_size: int
    detail: list[str] = dataclasses.field(default_factory=list)
    removable: bool = False
    rewrite: bool = False
    cut_to: int | None = None
    scan: Any = None


@dataclasses.dataclass
class ShardWalk:
    """What a walk over a whole shard found (`FileFormat.walk`).

    Attributes:
      found: complete records in the file.
      errors: the damage found, as `CorruptRecordError`s (formats that cannot
        tell damaged records apart report none and raise for an unreadable file).
    """

    found: int = 0
    errors: list[Any] = dataclasses.field(default_factory=list)


class FileFormat:
    """One shard file format: its name, writing, reading, walking, checking and
    repairing a shard.

    Attributes:
      name: the format's name in shard file names and in `fileFormat`
        (`tfrecord`, `array_record`).
      tfds_reader: the `tfds` builder method that reads this format
        (`as_dataset` through tf.data, or `as_data_source` for random access only).
      opens_paths: its random-access reader opens a local file by name (a shard
        in object storage is read from a local copy) instead of range reads.
    """

    name = ""
    tfds_reader = "as_dataset"
    opens_paths = False

    # The classes `open_writer` and `open_reader` construct, or "module:Class"
    # to import on first use (a reader that loads what writing never needs).
    writer_class: type[ShardWriter] | str | None = None
    reader_class: type[ShardReader] | str | None = None

    def open_writer(
        self, path: epath.Path, fsync: bool = False, max_records: int | None = None
    ) -> ShardWriter:
        """Creates the new shard `path` (never through a link) for writing.

        Args:
          path: the new shard.
          fsync: whether each record is synced to the disk.
          max_records: the most records the shard will take, where its writer
            knows (`max_episodes_per_file`). A format that plans by it
            (TFRecord: no zeros written ahead for the last few records)
            overrides this method; the default ignores it.
        """
        del max_records  # only a format that plans by it takes it
        return _resolve(self.writer_class, self, "writer_class")(path, fsync)

    def open_reader(
        self,
        path: str,
        num_records: int,
        verify: bool,
        cache_path: str | None,
        skip: bool = False,
        opener: Callable[[], Any] | None = None,
    ) -> ShardReader:
        """A random-access reader of shard `path`, listed with `num_records` records.

        Args:
          path: the file (for messages and caches).
          num_records: records listed for it in dataset_info.json.
          verify: check data checksums where the format has them.
          cache_path: where to keep an index of the records, or None.
          skip: index the records before a damaged one (with a warning) instead of raising.
          opener: returns the file opened for range reads (`Dataset.open_file`) or,
            if `opens_paths`, a local path (`Dataset.local_file`).
        """
        reader = _resolve(self.reader_class, self, "reader_class")
        return reader(path, num_records, verify, cache_path, skip, opener)

    def records(self, path: epath.PathLike, *, strict: bool = False) -> Iterator[bytes]:
        """The good records of a whole shard, in order (`strict`: raise at damage)."""
        raise NotImplementedError

    def walk(
        self,
        dataset: Any,
        name: str,
        *,
        verify_data: bool,
        visit: Callable[[bytes], None] | None = None,
        visit_first: int = 0,
    ) -> ShardWalk:
        """Walks shard file `name` of `dataset` (a `store.dataset.Dataset`).

        Args:
          dataset: the dataset.
          name: the shard's file name.
          verify_data: check every record's data checksum.
          visit: called with each of the first `visit_first` records.
          visit_first: how many records to hand to `visit`.
        """
        raise NotImplementedError

    def check(self, path: Any, *, listed: int | None, last: bool, full: bool) -> ShardCheck:
        """Checks a shard (`last`: the end of its split, where a crash tears;
        `full`: check every record's data too)."""
        raise NotImplementedError

    def rewrite(self, path: Any, check: ShardCheck) -> str:
        """Rewrites a damaged shard with its good records; returns the name the
        original is kept under."""
        raise NotImplementedError

    def cut(self, path: Any, size: int) -> None:
        """Cuts a crash's torn tail off the shard."""
        raise NotImplementedError


def _resolve(cls: type | str | None, fmt: FileFormat, attribute: str) -> Any:
    """`cls`, imported first if given as "module:Class"."""
    if cls is None:
        raise NotImplementedError(f"shard format {fmt.name!r} sets no {attribute}")
    if isinstance(cls, str):
        module, _, name = cls.partition(":")
        return getattr(importlib.import_module(module), name)
    return cls
