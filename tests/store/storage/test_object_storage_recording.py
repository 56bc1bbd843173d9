"""Recording to S3 (moto) and GCS (emulator) keeps the local guarantees, object for object.

One scenario per store, run the same way into a local directory: a real
recording process is SIGKILLed mid-episode, the dataset is recovered,
appended to, merged (copy and move, within the store, into it from a local
directory and out of it to one). Then every object has the name and the bytes
of the local file, and TFDS loads a download of the objects as it loads the
local dataset.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import rlds_writer
from rlds_writer.store.storage.storage import storage_for

_CHILD = r"""
import sys, time
import rlds_writer

path = sys.argv[1]
env = rlds_writer.EnvLogger(
    rlds_writer.Catch(seed=0), data_directory=path, max_episodes_per_file=2
)
for i in range(3):
    ts = env.reset()
    while not ts.last():
        ts = env.step(i % 3)
env.flush()  # closes the open shard: three episodes are in objects now
env.reset()
env.step(1)  # an episode under way when the process is killed
print("ready", flush=True)
time.sleep(600)
"""


def _record_and_kill(path: str, env: dict[str, str]) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, path],
        stdout=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == b"ready", line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL


def _record(path: str, episodes: int, seed: int, mode: str = "error") -> None:
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=seed), data_directory=path, mode=mode)
    for i in range(episodes):
        ts = env.reset()
        while not ts.last():
            ts = env.step((i + 1) % 3)
    env.close()


def _scenario(root: str, local_root: str, env: dict[str, str]) -> dict[str, str]:
    """Runs the scenario with datasets under `root`; returns the directories made."""
    fs = storage_for(root)
    join = fs.join
    run = join(root, "run")
    _record_and_kill(run, env)
    report = rlds_writer.recover(run)
    assert report.splits == {"train": [2, 1]}
    _record(run, episodes=2, seed=1, mode="append")
    rlds_writer.merge([run], join(root, "copied"))
    _record(join(root, "other"), episodes=2, seed=2)
    rlds_writer.merge([join(root, "other")], join(root, "moved"), move=True)
    assert not fs.exists(join(root, "other", "dataset_info.json"))
    # Into the store from a local directory, and out of it to one (move both ways).
    _record(os.path.join(local_root, "src"), episodes=1, seed=3)
    rlds_writer.merge([os.path.join(local_root, "src")], join(root, "from_local"), move=True)
    assert not os.path.exists(os.path.join(local_root, "src", "dataset_info.json"))
    rlds_writer.merge([join(root, "copied")], os.path.join(local_root, "out"))
    return {
        "run": run,
        "copied": join(root, "copied"),
        "moved": join(root, "moved"),
        "from_local": join(root, "from_local"),
        "out": os.path.join(local_root, "out"),
    }


def _files(path: str) -> dict[str, bytes]:
    fs = storage_for(path)
    return {name: fs.read_bytes(fs.join(path, name)) for name in fs.listdir(path)}


@pytest.mark.slow
def test_object_store_run_equals_local_run(object_store, tmp_path):
    local = _scenario(str(tmp_path / "disk"), str(tmp_path / "disk_side"), {})
    os.makedirs(tmp_path / "store_side")
    remote = _scenario(object_store.path("data"), str(tmp_path / "store_side"), object_store.env)
    for key in local:
        want, got = _files(local[key]), _files(remote[key])
        assert sorted(got) == sorted(want), key
        for name in want:
            assert got[name] == want[name], f"{key}/{name}"
    assert _files(local["copied"])  # the comparison compared something
    assert any(".tfrecord-" in name for name in _files(remote["copied"]))

    # TFDS loads a download of the objects as it loads the local dataset.
    import tensorflow_datasets as tfds

    download = tmp_path / "download"
    fs = storage_for(remote["copied"])
    download.mkdir()
    for name in fs.listdir(remote["copied"]):
        fs.download(fs.join(remote["copied"], name), str(download / name))
    want = _episodes(tfds.builder_from_directory(local["copied"]))
    got = _episodes(tfds.builder_from_directory(str(download)))
    assert len(got) == len(want) == 5
    for a, b in zip(want, got, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def _episodes(builder) -> list[dict[str, np.ndarray]]:
    out = []
    for episode in builder.as_dataset(split="train"):
        steps = list(episode["steps"].as_numpy_iterator())
        out.append(
            {
                "observation": np.stack([s["observation"] for s in steps]),
                "action": np.stack([s["action"] for s in steps]),
                "reward": np.stack([s["reward"] for s in steps]),
                "is_last": np.stack([s["is_last"] for s in steps]),
            }
        )
    return out
