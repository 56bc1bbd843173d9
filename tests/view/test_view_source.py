"""The viewer's dataset: the episode index (one scan, cached), a dataset being written, TFDS's."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers_viewer import robot_config, robot_episode, serving, write_robot

import rlds_writer
from rlds_writer.view.episode_data import EpisodeCache
from rlds_writer.view.source import ViewerSource


def _metadata(e):
    return {"operator": f"operator-{e % 3}", "success": bool(e % 2)}


def test_index_is_built_in_one_scan_and_cached_beside_the_dataset(tmp_path):
    path = tmp_path / "robot"
    write_robot(path, 7, max_episodes_per_file=3)
    progress = []
    source = ViewerSource(path, progress=lambda *a: progress.append(a))
    assert source.index.scanned == 7
    assert progress[-1] == ("train", 7, 7)
    cache = path / "viewer_index_train.json"
    assert cache.is_file() and sorted(json.loads(cache.read_text())["shards"]) == [
        "robot-train.tfrecord-00000",
        "robot-train.tfrecord-00001",
        "robot-train.tfrecord-00002",
    ]
    rows = source.index.splits["train"].rows
    again = ViewerSource(path, progress=lambda *a: progress.append(a))
    assert again.index.scanned == 0 and again.index.splits["train"].rows == rows
    # Without the cache: the same rows, scanned again, nothing written.
    cache.unlink()
    fresh = ViewerSource(path, index_cache=False)
    assert fresh.index.scanned == 7 and fresh.index.splits["train"].rows == rows
    assert not cache.exists()


def test_a_changed_or_damaged_cache_is_scanned_again(tmp_path, monkeypatch):
    path = tmp_path / "robot"
    write_robot(path, 4, max_episodes_per_file=2)
    ViewerSource(path)
    cache = path / "viewer_index_train.json"
    data = json.loads(cache.read_text())
    first = next(iter(data["shards"].values()))
    first["rows"][0]["length"] = "lots"  # hand-edited
    cache.write_text(json.dumps(data))
    source = ViewerSource(path)
    assert source.index.scanned == 2  # that shard only
    assert source.index.splits["train"].rows[0]["length"] == 12
    cache.write_text("{not json")
    assert ViewerSource(path).index.scanned == 4
    # Larger than its rows can be (a dataset from elsewhere shipping gigabytes of
    # cache): not read, scanned again, replaced. Limits made small to try it.
    from rlds_writer.view import episode_index

    valid = cache.read_text()
    monkeypatch.setattr(episode_index, "CACHE_MIN_BYTES", len(valid) + 10, raising=False)
    monkeypatch.setattr(episode_index, "CACHE_BYTES_PER_EPISODE", 1, raising=False)
    assert ViewerSource(path).index.scanned == 0  # within the limit: read
    cache.write_text(valid + " " * 100)
    assert ViewerSource(path).index.scanned == 4
    assert cache.read_text() == valid


def test_a_linked_cache_is_never_followed(tmp_path):
    path = tmp_path / "robot"
    write_robot(path, 2)
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    os.symlink(target, path / "viewer_index_train.json")
    source = ViewerSource(path)
    assert source.index.scanned == 2
    assert target.read_text() == "keep"  # the link itself was replaced, not its target
    assert not (path / "viewer_index_train.json").is_symlink()


def test_a_dataset_being_written_shows_what_is_committed(tmp_path):
    path = tmp_path / "live"
    writer = rlds_writer.TFDSBackendWriter(path, robot_config(), max_episodes_per_file=2)
    try:
        for e in range(3):
            writer.write_episode(robot_episode(e, 10), episode_metadata=_metadata(e))
        writer.flush()
        with serving(path) as (server, client):
            assert client.json("/api/dataset")["being_written"] is True
            assert client.json("/api/episodes")["total"] == 3
            for e in range(3, 7):
                writer.write_episode(robot_episode(e, 10), episode_metadata=_metadata(e))
            # Written but not committed: not listed, and not asked for.
            server.source.refresh(force=True)
            listed = server.source.reader.splits["train"]
            assert client.json("/api/episodes")["total"] == listed
            writer.flush()
            server.source.refresh(force=True)
            page = client.json("/api/episodes?limit=100")
            assert page["total"] == 7 and [e["id"] for e in page["episodes"]] == list(range(7))
            assert page["episodes"][6]["metadata"] == _metadata(6)
            assert client.get("/api/episodes/6/frames/1/9")[0] == 200
            assert server.source.index.scanned <= 7 + 2  # new shards only (and the open one)
    finally:
        writer.close()


def test_datasets_tfds_wrote_are_shown(tmp_path):
    import tensorflow_datasets as tfds
    from helpers_core import random_episodes, write_with_tfds

    config = rlds_writer.DatasetConfig(
        name="tfds_cams",
        observation_info={
            "image": tfds.features.Image(shape=(8, 8, 3), encoding_format="jpeg"),
            "depth": tfds.features.Image(shape=(8, 8, 1), dtype=np.uint16),
        },
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        reward_info=np.float64,
        step_metadata_info={"instruction": tfds.features.Text()},
        episode_metadata_info={"scene": tfds.features.Text()},
    )
    episodes = random_episodes(config, np.random.default_rng(0), lengths=[5, 3, 4])
    write_with_tfds(tmp_path / "ds", config, episodes, file_format="array_record")
    reader = rlds_writer.open_dataset(tmp_path / "ds")
    with serving(tmp_path / "ds") as (_, client):
        info = client.json("/api/dataset")
        assert info["file_format"] == "array_record"
        assert [(c["name"], c["format"]) for c in info["fields"]["cameras"]] == [
            ("observation/depth", "png"),
            ("observation/image", "jpeg"),
        ]
        page = client.json("/api/episodes")
        assert [e["length"] for e in page["episodes"]] == [5, 3, 4]
        assert [e["ending"] for e in page["episodes"]] == ["terminated", "truncated", "terminated"]
        for e, row in enumerate(page["episodes"]):
            assert row["instruction"] == episodes[e].step_metadata[0]["instruction"]
            assert row["metadata"] == {"scene": episodes[e].episode_metadata["scene"]}
        status, headers, body = client.get("/api/episodes/1/frames/0/2")
        assert status == 200 and headers["Content-Type"] == "image/png"
        decoded = reader.episodes("train")[1]["steps"]["observation"]["depth"][2]
        from rlds_writer.read.images import decode_image

        leaf = next(leaf for leaf in reader.features.step_leaves if leaf.path[-1] == "depth")
        np.testing.assert_array_equal(decode_image(body, leaf), decoded)


def test_recently_viewed_episodes_stay_within_the_memory_budget(tmp_path):
    path = tmp_path / "robot"
    write_robot(path, 6, size=64)
    source = ViewerSource(path, cache_bytes=1)
    one = source.episode("train", 0).nbytes
    source.episodes.budget = int(one * 2.5)
    for e in range(6):
        source.episode("train", e)
    assert source.episodes.nbytes <= source.episodes.budget
    assert len(source.episodes._items) == 2
    with pytest.raises(IndexError):
        source.episode("train", 6)


def test_the_cache_keeps_the_episode_in_use_even_over_budget():
    loads = []

    class Item:
        nbytes = 100

    cache = EpisodeCache(lambda split, e: loads.append(e) or Item(), budget=10)
    first = cache.get("train", 0)
    assert cache.get("train", 0) is first and loads == [0]
    cache.get("train", 1)
    assert list(cache._items) == [("train", 1)]
