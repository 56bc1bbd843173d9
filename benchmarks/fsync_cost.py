"""What `fsync=True` costs: the same episodes recorded with and without it.

    python benchmarks/fsync_cost.py [--episodes 300] [--repeats 3] [--dir /tmp]

Records Catch-like episodes (float32 (10, 5) observations, 100 steps) and
image episodes (uint8 (84, 84, 3), 100 steps) through `DatasetWriter`, each
followed by `flush()` (the durability point of the contract), and prints the
median wall time per episode for `fsync=False` and `fsync=True`. Quoted in
docs/durability.md; never asserted by the tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time


def _config(kind: str):
    import numpy as np
    import tensorflow_datasets as tfds

    import rlds_writer

    if kind == "catch":
        obs = tfds.features.Tensor(shape=(10, 5), dtype=np.float32)
    else:
        obs = tfds.features.Tensor(shape=(84, 84, 3), dtype=np.uint8, encoding="bytes")
    return rlds_writer.DatasetConfig(
        name=f"fsync_{kind}",
        observation_info=obs,
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
    )


def _run(kind: str, episodes: int, fsync: bool, root: str, flush_each: bool) -> float:
    import numpy as np

    from rlds_writer.record.episode import StepFields
    from rlds_writer.store.writing.writer import DatasetWriter

    directory = tempfile.mkdtemp(dir=root)
    rng = np.random.default_rng(0)
    shape, dtype = ((10, 5), np.float32) if kind == "catch" else ((84, 84, 3), np.uint8)
    frames = [rng.integers(0, 255, size=shape).astype(dtype) for _ in range(101)]
    writer = DatasetWriter(
        os.path.join(directory, "ds"),
        _config(kind),
        max_episodes_per_file=100,
        fsync=fsync,
    )
    buffer = StepFields(writer.encoder.fields).new_buffer()
    start = time.perf_counter()
    for _ in range(episodes):
        buffer.start(frames[0])
        for t in range(100):
            buffer.add(t % 3, 0.0, 1.0, frames[t + 1])
        writer.write(buffer.finish(terminated=True))
        if flush_each:
            writer.flush()
    writer.close()
    elapsed = time.perf_counter() - start
    shutil.rmtree(directory)
    return elapsed / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs; directory {args.dir}")
    for kind in ("catch", "image"):
        for flush_each in (False, True):
            row = []
            for fsync in (False, True):
                times = [
                    _run(kind, args.episodes, fsync, args.dir, flush_each)
                    for _ in range(args.repeats)
                ]
                row.append(statistics.median(times) * 1e3)
            label = "write+flush" if flush_each else "write only"
            print(
                f"{kind:6s} {label:12s} fsync=False {row[0]:8.3f} ms/episode   "
                f"fsync=True {row[1]:8.3f} ms/episode   (+{row[1] - row[0]:.3f} ms)"
            )


if __name__ == "__main__":
    main()
