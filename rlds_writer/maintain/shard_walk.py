"""The one walk over a dataset's shard files that `info` and `validate` share.

Each shard file is walked by its format (`FileFormat.walk`, `store/formats/shards.py`),
as `recover` and the reader scan it (TFRecord: length and data CRCs,
resynchronising after a damaged header), through the `Dataset` handle. The
walk reports facts (records found, damage, steps); each command words them its
own way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from rlds_writer.errors import CorruptRecordError
from rlds_writer.store.dataset import Dataset
from rlds_writer.store.features import wire
from rlds_writer.store.formats import shards


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

    def add_steps(record: bytes) -> None:
        out.steps = _add_steps(out.steps, record)

    try:
        walk = dataset.shard_format.walk(
            dataset, name, verify_data=verify_data, visit=add_steps, visit_first=count_steps_of or 0
        )
        out.found, out.errors = walk.found, walk.errors
    except Exception as e:  # noqa: BLE001 - an open array_record shard, a link, a lost object
        out.unreadable = str(e)
    return out


def _add_steps(steps: int | None, record: bytes) -> int | None:
    if steps is None:
        return None
    n = record_step_count(record)
    return None if n is None else steps + n
