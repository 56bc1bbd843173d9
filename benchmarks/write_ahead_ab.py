"""Benchmark: two checkouts' zeros written ahead, alternated in one process.

On a machine shared with other work, separate runs of `shard_write.py` or
`run.py` move more between runs than a change to `write_ahead` can. This
loads another checkout's `store/formats/tfrecord/write_ahead.py` and its
built `_zero_ahead` extension beside this one's, and alternates them shard
by shard, so both see the same load: 300 writes of a 20.7 KB record into a
fresh shard, then 200 Catch episodes recorded with `EnvLogger`, per side per
round (the rest of the code is this checkout's for both). Prints medians,
ranges and in how many paired rounds this checkout was the slower.

    PYTHONPATH=. python benchmarks/write_ahead_ab.py /path/to/other/checkout [ROUNDS]

With `PURE=1`, both sides write their zeros on the recording thread (as
without the extension).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import rlds_writer
from rlds_writer.envs import Catch
from rlds_writer.store.formats.tfrecord import tfrecord_shards
from rlds_writer.store.formats.tfrecord import write_ahead as this_write_ahead

RECORD = b"\x0a" + os.urandom(20700)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _other_write_ahead(root: str, pure: bool):
    folder = Path(root) / "rlds_writer/store/formats/tfrecord"
    other = _load("other_write_ahead", folder / "write_ahead.py")
    if pure:
        other.ZeroAhead = None
    else:
        (built,) = folder.glob("_zero_ahead.*.so")
        other.ZeroAhead = _load("other_extension._zero_ahead", built).ZeroAhead
    return other


def _shard(directory: str, name: str) -> tuple[float, float]:
    path = Path(directory) / name
    writer = tfrecord_shards.TFRecordShardWriter(path)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(300):
        writer.write(RECORD)
    writer.close()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    path.unlink()
    return wall / 300 * 1e6, cpu / 300 * 1e6


def _recording(directory: str, name: str, episodes: int = 200) -> tuple[float, float]:
    env = rlds_writer.EnvLogger(Catch(seed=0), data_directory=os.path.join(directory, name))
    timestep = env.reset()
    while not timestep.last():  # one episode before the clock: the dataset's creation
        timestep = env.step(1)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(episodes):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(1)
    env.close()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / episodes * 1e6, cpu / episodes * 1e6


def main(other_root: str, rounds: int) -> None:
    pure = bool(os.environ.get("PURE"))
    if pure:
        this_write_ahead.ZeroAhead = None
    elif this_write_ahead.zero_ahead_type() is None:
        raise SystemExit("this checkout's _zero_ahead is not built (setup.py build_ext --inplace)")
    sides = {"other": _other_write_ahead(other_root, pure), "this": this_write_ahead}
    figures = {(m, s): [] for m in ("shard", "shard cpu", "catch", "catch cpu") for s in sides}
    with tempfile.TemporaryDirectory() as directory:
        for r in range(rounds):
            for side in ("other", "this") if r % 2 == 0 else ("this", "other"):
                tfrecord_shards.write_ahead = sides[side]
                wall, cpu = _shard(directory, f"shard-{r}-{side}")
                figures["shard", side].append(wall)
                figures["shard cpu", side].append(cpu)
                wall, cpu = _recording(directory, f"ds-{r}-{side}")
                figures["catch", side].append(wall)
                figures["catch cpu", side].append(cpu)
    tfrecord_shards.write_ahead = this_write_ahead
    units = {"shard": "µs/record wall", "shard cpu": "µs/record CPU", "catch": "µs/episode wall"}
    units["catch cpu"] = "µs/episode CPU"
    for measure, unit in units.items():
        line = []
        for side in sides:
            values = sorted(figures[measure, side])
            median = statistics.median(values)
            line.append(f"{side} {median:.2f} ({values[0]:.2f}-{values[-1]:.2f})")
        slower = sum(t > o for o, t in zip(figures[measure, "other"], figures[measure, "this"]))
        print(f"{measure} ({unit}): {'; '.join(line)}; this slower in {slower} of {rounds} rounds")
    print("load average after:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
