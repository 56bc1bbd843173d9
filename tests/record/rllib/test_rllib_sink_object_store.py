"""The driver's `EpisodeSink` mirrors runner datasets into a bucket (moto S3), without Ray.

With an object-store output root every EnvRunner ships its closed shards to
the sink (record/rllib/rllib_sink.py), which uploads each shard whole into
`<root>/writer-NNNNN` and writes the JSON files last. Here a real recording
made on local disk plays the runner: its shards go through the sink's
`put`/`seal`/`commit` as Ray would call them, in pieces.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import rlds_writer
from rlds_writer.errors import UnsafePathError
from rlds_writer.record.rllib import rllib_delivery, rllib_sink
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage.storage import storage_for


def _record(path: str, episodes: int, seed: int) -> None:
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=seed), data_directory=path, max_episodes_per_file=2
    )
    for i in range(episodes):
        ts = env.reset()
        while not ts.last():
            ts = env.step((i + 1) % 3)
    env.close()


def _shards(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".tfrecord-" in n)


def _ship(sink: rllib_sink.EpisodeSink, incarnation: str, local: str, piece: int) -> None:
    """What `RunnerDelivery` sends for one runner dataset: shards in pieces, then JSON."""
    for name in _shards(local):
        with open(os.path.join(local, name), "rb") as f:
            data = f.read()
        size = 0
        for start in range(0, len(data), piece):
            size = sink.put(incarnation, "writer-00001", name, data[start : start + piece], start)
        sink.seal(incarnation, "writer-00001", name, size)
    files = {}
    for name in (*rllib_sink.METADATA_FILES, rllib_sink.LISTING):
        if os.path.exists(os.path.join(local, name)):
            with open(os.path.join(local, name), "rb") as f:
                files[name] = f.read()
    sink.commit(incarnation, "writer-00001", files)


def test_the_sink_uploads_a_runner_dataset_whole_into_the_bucket(s3_bucket, tmp_path):
    local = str(tmp_path / "runner")
    _record(local, episodes=5, seed=0)
    root = s3_bucket.path("run")
    fs = storage_for(root)
    sink = rllib_sink.EpisodeSink(root)
    assert not sink.sees("anything")  # runners never write the bucket themselves
    assert sink.mirror("a", "writer-00001") == "writer-00001"

    _ship(sink, "a", local, piece=300)

    mirror = fs.join(root, "writer-00001")
    # The same objects, byte for byte, as the runner's local files; no lock object.
    assert sorted(fs.listdir(mirror)) == sorted(os.listdir(local))
    for name in os.listdir(local):
        with open(os.path.join(local, name), "rb") as f:
            assert fs.read_bytes(fs.join(mirror, name)) == f.read()
    assert layout.LOCK not in fs.listdir(mirror)
    # The sink's local staging files are gone once uploaded.
    assert os.listdir(sink.staging) == []

    sink.report("a", {"worker_index": 1, "counts": {"writer-00001": {"train": 5}}})
    reports = sink.finish()
    assert not os.path.exists(sink.staging)
    rllib_delivery.check_delivered(root, reports)  # raises if an episode is missing

    mirrored = rlds_writer.open_dataset(mirror)
    original = rlds_writer.open_dataset(local)
    assert mirrored.splits == original.splits == {"train": 5}
    for a, b in zip(mirrored.episodes(), original.episodes(), strict=True):
        np.testing.assert_array_equal(a["steps"]["action"], b["steps"]["action"])


def test_a_second_incarnation_or_an_earlier_run_gets_its_own_mirror(s3_bucket, tmp_path):
    local = str(tmp_path / "runner")
    _record(local, episodes=2, seed=1)
    root = s3_bucket.path("run")
    earlier = rllib_sink.EpisodeSink(root)
    earlier.mirror("old", "writer-00001")
    _ship(earlier, "old", local, piece=1 << 20)
    earlier.finish()

    sink = rllib_sink.EpisodeSink(root)
    # An earlier run's objects are never mixed with this run's; a restarted
    # runner (a new incarnation) never shares its predecessor's mirror.
    assert sink.mirror("new", "writer-00001") == "writer-00001.1"
    assert sink.mirror("newer", "writer-00001") == "writer-00001.2"
    _ship(sink, "new", local, piece=1 << 20)
    assert rlds_writer.open_dataset(s3_bucket.path("run", "writer-00001.1")).splits == {"train": 2}
    sink.finish()


@pytest.mark.parametrize("dataset", ["../escape", "/abs", "a/../../b", ""])
def test_the_sink_refuses_a_path_that_leaves_the_root_in_the_bucket(s3_bucket, dataset):
    victim = s3_bucket.path("victim.json")
    fs = storage_for(victim)
    fs.replace_bytes(victim, b"keep")
    sink = rllib_sink.EpisodeSink(s3_bucket.path("run"))
    with pytest.raises(UnsafePathError, match="leaves the output root"):
        sink.commit("a", dataset, {"dataset_info.json": b"{}"})
    with pytest.raises(UnsafePathError):
        sink.commit("a", "writer-00001", {"../victim.json": b"{}"})
    assert fs.read_bytes(victim) == b"keep"
    assert not fs.exists(s3_bucket.path("run", "writer-00001", "dataset_info.json"))
    sink.finish()


@pytest.mark.slow  # the fault proxy and the store's bounds
def test_a_shard_the_sink_cannot_upload_is_kept_for_recover(s3_bucket, tmp_path, monkeypatch):
    """The store stops taking uploads while the sink seals a runner's shard: the
    shard's bytes go to the kept directory (as the writers' own failed uploads do),
    the error says where, and `recover` on the mirror uploads them: no episode lost."""
    from fault_proxy import fault_proxy

    from rlds_writer.errors import UploadFailedError
    from rlds_writer.store.storage import unsaved_shards

    monkeypatch.setenv("RLDS_WRITER_UNSAVED_DIR", str(tmp_path / "unsaved"))
    monkeypatch.setenv("RLDS_WRITER_STORE_ATTEMPTS", "2")
    monkeypatch.setenv("RLDS_WRITER_STORE_TIMEOUT", "20")
    proxy = fault_proxy(s3_bucket, monkeypatch)
    try:
        local = str(tmp_path / "runner")
        _record(local, episodes=5, seed=0)  # shards of 2, 2 and 1 episodes
        root = s3_bucket.path("run")
        sink = rllib_sink.EpisodeSink(root)
        sink.mirror("a", "writer-00001")
        first, second, third = _shards(local)
        for name in (first, second, third):
            with open(os.path.join(local, name), "rb") as f:
                size = sink.put("a", "writer-00001", name, f.read(), 0)
            if name == second:
                monkeypatch.setenv("RLDS_WRITER_STORE_TIMEOUT", "1")
                proxy.fail("blackhole", method="PUT")
                with pytest.raises(UploadFailedError) as raised:
                    sink.seal("a", "writer-00001", name, size)
                proxy.heal()
                monkeypatch.setenv("RLDS_WRITER_STORE_TIMEOUT", "20")
            else:
                sink.seal("a", "writer-00001", name, size)
        mirror = f"{root}/writer-00001"
        kept = unsaved_shards.kept_directory(mirror)
        assert f"its bytes are kept in {kept}" in str(raised.value)
        assert [os.path.basename(p) for p in unsaved_shards.kept_shards(kept)] == [second]
        files = {}
        for name in (*rllib_sink.METADATA_FILES, rllib_sink.LISTING):
            with open(os.path.join(local, name), "rb") as f:
                files[name] = f.read()
        sink.commit("a", "writer-00001", files)
        sink.finish()
        rlds_writer.recover(mirror)
        assert len(rlds_writer.open_dataset(mirror).episodes("train")) == 5
        assert not os.path.exists(kept)
    finally:
        proxy.close()
