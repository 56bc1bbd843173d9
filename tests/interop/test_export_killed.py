"""A killed export leaves nothing a consumer loads; the next run succeeds.

Each export runs in a real subprocess (tests/export_kill_child.py) that stops
after half of the episodes have been handed to the format's writer, and is
killed there with SIGKILL. Then the real consumer is asked for the
destination: `pyarrow.dataset` (RLlib's Parquet), `datasets.load_dataset`,
`minari.load_dataset`, h5py (d3rlpy's file), LeRobot's `meta/info.json`; it
must find nothing. Running the same export again must succeed and hold every
episode, and its report points at the killed run's leftover staging directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import crash_child
import pytest
from helpers_core import skip_without_format

import rlds_writer

EPISODES = 6
CHILD = Path(__file__).resolve().parents[1] / "export_kill_child.py"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("killed_export") / "catch"
    crash_child.write_dataset(path, range(EPISODES))
    return path


def _child(src, dest, target, marker, after, env):
    argv = [sys.executable, str(CHILD), str(src), str(dest), target, str(marker), str(after)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kill_halfway(src, dest, target, tmp_path, env) -> None:
    marker = tmp_path / f"{target}.halfway"
    proc = _child(src, dest, target, marker, EPISODES // 2, env)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"the export ended before halfway: {err.decode()[-2000:]}")
            assert time.monotonic() < deadline, "the export never reached halfway"
            time.sleep(0.05)
    finally:
        proc.kill()  # SIGKILL
        proc.wait()


def _loaded_episodes(target, dest, cache):
    """What the format's own consumer finds at `dest` (raises if nothing)."""
    if target == "minari":
        import minari

        return minari.load_dataset(dest).total_episodes
    path = Path(dest)
    if target == "rllib-episodes":
        import pyarrow.dataset as ds

        return ds.dataset(path, format="parquet").to_table().num_rows
    if target == "hf":
        if not path.exists():  # datasets would look the name up on the Hub
            raise FileNotFoundError(path)
        datasets = pytest.importorskip("datasets")
        steps = datasets.load_dataset(str(path), split="train", cache_dir=str(cache))
        return len(set(steps["episode_index"]))
    if target == "d3rlpy":
        import h5py

        with h5py.File(path, "r") as f:
            return int(f["num_episodes"][()])
    if target == "lerobot":
        import json

        return json.loads((path / "meta" / "info.json").read_text())["total_episodes"]
    raise AssertionError(target)


@pytest.mark.parametrize("target", ["rllib-episodes", "minari", "hf", "d3rlpy", "lerobot"])
def test_a_killed_export_leaves_nothing_that_loads_and_a_rerun_succeeds(
    source, tmp_path, monkeypatch, target
):
    skip_without_format("export", target)
    root = tmp_path / "minari_root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if target == "minari":
        dest = "ns/catch-v0"
        final = root / "ns" / "catch-v0"
    else:
        final = tmp_path / "out" / ("catch.h5" if target == "d3rlpy" else "catch")
        dest = str(final)

    _kill_halfway(source, dest, target, tmp_path, env)

    assert not os.path.lexists(final), sorted(os.listdir(final))
    with pytest.raises((FileNotFoundError, OSError)):
        _loaded_episodes(target, dest, tmp_path / "hf_cache")
    if target == "minari":
        import minari

        assert "ns/catch-v0" not in minari.list_local_datasets()
    leftovers = [p for p in final.parent.iterdir() if p.name.startswith(f".{final.name}.partial-")]
    assert len(leftovers) == 1, leftovers

    report = rlds_writer.export(source, dest, to=target)
    assert report.episodes == EPISODES and report.destination == dest
    assert any("unfinished export" in note for note in report.notes), report.notes
    assert not any(".partial-" in note for note in report.notes[:-1]), report.notes
    assert _loaded_episodes(target, dest, tmp_path / "hf_cache") == EPISODES
