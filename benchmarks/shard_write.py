"""Benchmark: µs per `TFRecordShardWriter.write` of a Catch-sized record.

A 20.7 KB record (a 100-step Catch episode) written 300 times to each of 15
fresh local shards, zeros written ahead as a recording writes them; prints
the median and the fastest shard's µs a record. Meant for comparing two
checkouts side by side under the same load (interleave the runs):

    PYTHONPATH=/path/to/old/checkout python benchmarks/shard_write.py old
    PYTHONPATH=. python benchmarks/shard_write.py new
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from etils import epath

from rlds_writer.store.formats.tfrecord import tfrecord_shards

SHARDS = 15
RECORDS = 300


def main(label: str) -> None:
    record = b"\x0a" + os.urandom(20700)
    times = []
    with tempfile.TemporaryDirectory() as directory:
        for i in range(SHARDS):
            path = epath.Path(directory) / f"shard{i}"
            writer = tfrecord_shards.TFRecordShardWriter(path)
            start = time.perf_counter()
            for _ in range(RECORDS):
                writer.write(record)
            times.append((time.perf_counter() - start) / RECORDS * 1e6)
            writer.close()
            path.unlink()
    print(f"{label}: {statistics.median(times):.2f} µs/record (fastest shard {min(times):.2f})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this checkout")
