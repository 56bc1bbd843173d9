"""A TFDS package build reads its source shards through their file format's object:
every record of a good shard in order, and a one-line error naming the file at damage."""

from __future__ import annotations

import pytest

from rlds_writer.errors import CorruptRecordError
from rlds_writer.interop import package_sources
from rlds_writer.store.formats import shards

RECORDS = [b"first episode", b"second episode" * 50, b"third"]


def _shard(tmp_path, file_format):
    path = tmp_path / f"ds-train.{file_format}-00000"
    writer = shards.open_writer(path, file_format)
    for record in RECORDS:
        writer.write(record)
    writer.close()
    return package_sources.SourceShard(0, 0, str(path), file_format, len(RECORDS), 0)


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_every_record_of_a_source_shard_is_read_in_order(tmp_path, file_format):
    shard = _shard(tmp_path, file_format)
    assert list(package_sources._read_records(shard)) == list(enumerate(RECORDS))


def test_a_damaged_source_shard_stops_the_build_naming_the_file(tmp_path):
    shard = _shard(tmp_path, "tfrecord")
    data = bytearray(open(shard.path, "rb").read())
    data[12 + 2] ^= 0xFF  # a byte of the first record's data: its CRC fails
    open(shard.path, "wb").write(bytes(data))
    with pytest.raises(CorruptRecordError, match="ds-train.tfrecord-00000"):
        list(package_sources._read_records(shard))
