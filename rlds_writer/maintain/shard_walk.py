"""The one walk over a dataset's shard files that `info` and `validate` share.

Each shard file is scanned as `recover` and the reader scan it
(`store.tfrecord.scan`: length and data CRCs, resynchronising after a damaged
header), through the `Dataset` handle: a local file is mapped, an object in
storage is read by ranges. The walk reports facts (records found, damage,
steps); each command words them its own way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from rlds_writer.errors import CorruptRecordError
from rlds_writer.store import shards, tfrecord, wire
from rlds_writer.store.dataset import Dataset


def iter_shard_records(path: str, file_format: str) -> Iterator[bytes]:
    """Yields the complete records of one local shard file, in file order, skipping damage."""
    return shards.adapter(file_format).records(path)


def record_step_count(record: bytes, key: str = "steps/is_first") -> int | None:
    """Returns how many values feature `key` of a serialized tf.train.Example holds.

    For an RLDS episode `steps/is_first` holds one value per step. None if the
    key is absent.
    """
    located = wire.parse_example(record).get(key)
    return None if located is None else wire.count_values(record, located)


@dataclasses.dataclass
class ShardScan:
    """What one shard file holds.

    Attributes:
      name: the file name.
      found: complete records in it.
      errors: the damage found, as every tool reports it (empty for array_record).
      unreadable: why the file could not be read at all, or None.
      steps: steps of its first `count_steps_of` records (None when not
        counted, or when a record has no `steps/is_first`).
    """

    name: str
    found: int = 0
    errors: list[CorruptRecordError] = dataclasses.field(default_factory=list)
    unreadable: str | None = None
    steps: int | None = None


def scan_shard(
    dataset: Dataset, name: str, *, verify_data: bool, count_steps_of: int | None = None
) -> ShardScan:
    """Scans shard file `name` of `dataset`.

    Args:
      dataset: the dataset.
      name: the shard's file name.
      verify_data: check every record's data CRC (tfrecord).
      count_steps_of: count the steps of the first this many records (the
        listed ones); None counts nothing.

    Returns:
      A `ShardScan`.
    """
    out = ShardScan(name, steps=None if count_steps_of is None else 0)
    try:
        if dataset.file_format == "tfrecord":
            _scan_tfrecord(dataset, out, verify_data, count_steps_of)
        else:
            _scan_array_record(dataset, out, count_steps_of)
    except Exception as e:  # noqa: BLE001 - an open array_record shard, a link, a lost object
        out.unreadable = str(e)
    return out


def _scan_tfrecord(
    dataset: Dataset, out: ShardScan, verify_data: bool, count_steps_of: int | None
) -> None:
    source = dataset.open_file(out.name)
    try:
        if dataset.is_local:
            # A mapped file: the fastest walk (the same scan as recover's).
            scan = tfrecord.scan(dataset.file(out.name), verify_data=verify_data, resync=True)
        else:
            scan = tfrecord.scan_random(source, verify_data=verify_data, resync=True)
        out.errors = scan.errors(dataset.file(out.name))
        out.found = len(scan.spans)
        for offset, length in scan.spans[: count_steps_of or 0]:
            record = source.read_at(offset + tfrecord.HEADER_SIZE, length)
            out.steps = _add_steps(out.steps, record)
    finally:
        source.close()


def _scan_array_record(dataset: Dataset, out: ShardScan, count_steps_of: int | None) -> None:
    # array_record's reader opens paths: a shard in object storage is copied (that shard only).
    local = dataset.local_file(out.name)
    for index, record in enumerate(iter_shard_records(local, "array_record")):
        out.found += 1
        if count_steps_of is not None and index < count_steps_of:
            out.steps = _add_steps(out.steps, record)


def _add_steps(steps: int | None, record: bytes) -> int | None:
    if steps is None:
        return None
    n = record_step_count(record)
    return None if n is None else steps + n
