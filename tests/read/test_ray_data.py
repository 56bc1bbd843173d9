"""RLDS datasets read as Ray Data datasets (`rlds_writer.read.ray_data`), on a real local Ray.

The read tasks run in Ray's worker processes; every row is compared with the
TF-free reader's own read of the same episode, and every selected episode
must come out exactly once.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import numpy as np
import pytest
from byte_relay import CountingProxy, relay, upload
from helpers_core import assert_same
from object_store_data import EPISODES, PER_SHARD, STEPS, write_camera_dataset

import rlds_writer

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from rlds_writer.read import ray_data  # noqa: E402

_ENDPOINTS = ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST")


@pytest.fixture(scope="module")
def cameras(tmp_path_factory):
    """12 episodes over 3 shard files: a 24x24 PNG camera and a 32 KB state per step."""
    return write_camera_dataset(tmp_path_factory.mktemp("ray") / "cameras")


def _rows_by_index(ds) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for row in ds.iter_rows():
        index = int(row["episode_index"])
        assert index not in out, f"episode {index} read twice"
        out[index] = row
    return out


def test_episode_rows_are_the_readers_episodes_each_read_once(ray_session, cameras):
    # Small read tasks: several per shard file, each on a worker.
    ds = ray_data.read_rlds(cameras, "train", bytes_per_task=400_000)
    rows = _rows_by_index(ds)
    episodes = rlds_writer.open_dataset(cameras).episodes("train")
    assert sorted(rows) == list(range(EPISODES))
    for i, episode in enumerate(episodes):
        row = rows[i]
        steps = episode["steps"]
        assert_same(np.asarray(row["steps/observation/image"]), steps["observation"]["image"])
        assert_same(np.asarray(row["steps/observation/state"]), steps["observation"]["state"])
        assert_same(np.asarray(row["steps/action"]), steps["action"])
        assert np.array_equal(row["steps/reward"], steps["reward"])
        assert np.array_equal(row["steps/is_last"], steps["is_last"])


def test_read_tasks_hold_whole_episodes_sized_by_bytes(cameras):
    source = ray_data.RLDSDatasource(cameras, "train[2:11]", bytes_per_task=700_000)
    shard_bytes = os.path.getsize(cameras / "rlds_dataset-train.tfrecord-00000")
    tasks = source.get_read_tasks(parallelism=1)
    episodes = [t.metadata.num_rows for t in tasks]
    assert sum(episodes) == 9  # the selection, once
    assert len(tasks) > 3  # more than one per shard file: sized by bytes
    per_episode = shard_bytes / PER_SHARD
    assert all(
        n >= 1 and t.metadata.size_bytes <= max(700_000, per_episode * 1.01)
        for n, t in zip(episodes, tasks)
    )
    # Ray's parallelism cuts a large task budget into as many tasks as asked, not tinier.
    assert len(ray_data.RLDSDatasource(cameras, "train").get_read_tasks(parallelism=2)) == 2
    # Run in this process: the tasks give the episodes of the selection in order.
    indices = []
    for task in tasks:
        for block in task():
            indices.extend(block.column("episode_index").to_pylist())
    assert indices == list(range(9))
    assert source.num_tasks() == len(tasks)
    # A task yields a block each time its rows reach block_bytes, and at its end.
    many = ray_data.RLDSDatasource(cameras, "train[2:5]", bytes_per_task=1 << 30, block_bytes=1)
    (task,) = many.get_read_tasks(parallelism=1)
    assert [block.num_rows for block in task()] == [1, 1, 1]
    (task,) = ray_data.RLDSDatasource(cameras, "train[2:5]").get_read_tasks(parallelism=1)
    assert [block.num_rows for block in task()] == [3]


def test_a_listing_declaring_huge_episode_counts_plans_few_tasks_and_fails_reading(
    cameras, tmp_path
):
    # 10**10 episodes declared over a shard's few KB: planning cut them into runs of
    # a MiB "of them", ~10**4 runs (10**14 hung the driver, growing one list); the
    # listing's lie shows when a task reads.
    import json
    import shutil

    from rlds_writer.errors import CorruptRecordError

    hostile = tmp_path / "hostile"
    shutil.copytree(cameras, hostile)
    info = json.loads((hostile / "dataset_info.json").read_text())
    info["splits"][0]["shardLengths"][-1] = str(10**10)
    (hostile / "dataset_info.json").write_text(json.dumps(info))

    def runs(source):
        return sum(len(runs) for runs, _, _ in source._groups(1 << 20))

    source = ray_data.RLDSDatasource(hostile, "train")
    assert runs(source) <= runs(ray_data.RLDSDatasource(cameras, "train")) + 1
    tasks = source.get_read_tasks(parallelism=2)
    with pytest.raises(CorruptRecordError, match="tfrecord-00002"):
        for task in tasks:
            for _ in task():
                pass


def test_transition_rows_follow_the_transition_rules(ray_session, cameras):
    ds = ray_data.read_rlds(cameras, "train[1:5]", rows="transitions")
    reader = rlds_writer.open_dataset(cameras)
    expected = list(reader.episodes("train[1:5]").transitions())
    got = sorted(ds.take_all(), key=lambda r: (r["episode_index"], r["step"]))
    assert len(got) == len(expected) == 4 * (STEPS - 1)
    for row, transition in zip(got, expected, strict=True):
        assert_same(row["observation/image"], transition["observation"]["image"])
        assert_same(row["next_observation/state"], transition["next_observation"]["state"])
        assert_same(row["action"], transition["action"])
        assert row["reward"] == transition["reward"]
        assert row["terminated"] == transition["terminated"]
        assert row["truncated"] == transition["truncated"]
    ends = [r for r in got if r["step"] == STEPS - 2]
    assert len(ends) == 4 and all(r["terminated"] and not r["truncated"] for r in ends)


def test_only_the_columns_asked_for_are_decoded(cameras, monkeypatch):
    # A camera never decoded cannot fail to decode: run a task here with decoding
    # images made to fail.
    from rlds_writer.read import decode

    def refuse(*args, **kwargs):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(decode, "decode_image", refuse)
    source = ray_data.RLDSDatasource(
        cameras, "train[:3]", rows="transitions", columns=["observation/state", "reward"]
    )
    (task,) = source.get_read_tasks(parallelism=1)
    (block,) = list(task())
    assert sorted(block.column_names) == ["observation/state", "reward"]
    assert block.num_rows == 3 * (STEPS - 1)
    # Ray's select_columns is pushed down into the read the same way.
    pushed = ray_data.RLDSDatasource(cameras, "train[:1]").apply_projection(
        {"steps/reward": "steps/reward", "episode_index": "episode_index"}
    )
    (task,) = pushed.get_read_tasks(parallelism=1)
    (block,) = list(task())
    assert sorted(block.column_names) == ["episode_index", "steps/reward"]
    # Renamed as the blocks are made (RLlib's names), projection in either name.
    renamed = ray_data.RLDSDatasource(
        cameras, "train[:1]", rows="transitions", names={"reward": "rewards"}
    ).apply_projection({"rewards": "rewards"})
    (task,) = renamed.get_read_tasks(parallelism=1)
    (block,) = list(task())
    assert block.column_names == ["rewards"] and block.num_rows == STEPS - 1
    with pytest.raises(ValueError, match="'steps/pixels'.*it has steps/action"):
        ray_data.RLDSDatasource(cameras, columns=["steps/pixels"])


def test_count_counts_rows_without_decoding_them(ray_session, cameras):
    # Ray pushes an empty projection into the read for count().
    assert ray_data.read_rlds(cameras, "train[:5]").count() == 5
    transitions = ray_data.read_rlds(cameras, "train[:5]", rows="transitions")
    assert transitions.count() == 5 * (STEPS - 1)


def test_select_columns_reads_only_those(ray_session, cameras):
    ds = ray_data.read_rlds(cameras, "train[:2]").select_columns(["episode_index", "steps/action"])
    rows = ds.take_all()
    assert sorted(rows[0]) == ["episode_index", "steps/action"]
    assert sorted(int(r["episode_index"]) for r in rows) == [0, 1]


def test_a_bad_split_or_option_fails_on_the_driver(cameras):
    with pytest.raises(ValueError, match="Unknown split 'valid'"):
        ray_data.RLDSDatasource(cameras, "valid")
    with pytest.raises(ValueError, match="rows must be one of"):
        ray_data.RLDSDatasource(cameras, rows="steps")
    with pytest.raises(ValueError, match="block_bytes must be >= 1"):
        ray_data.RLDSDatasource(cameras, block_bytes=0)


def test_workers_read_the_bucket_once_and_the_driver_only_the_listing(
    ray_session, cameras, object_store, monkeypatch
):
    url = object_store.path("cameras")
    upload(cameras, url)
    proxy = relay(object_store, monkeypatch)  # the driver's requests go through it
    # The workers reach the server through a relay of their own (in the environment
    # a cluster would set): the same workers serve both reads.
    (variable,) = [k for k in _ENDPOINTS if k in object_store.env]
    workers = CountingProxy(urlsplit(object_store.env[variable]).port)
    try:
        proxy.reset()
        env = dict(object_store.env, PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        env[variable] = f"http://127.0.0.1:{workers.port}"
        ds = ray_data.read_rlds(
            url,
            "train",
            rows="transitions",
            columns=["episode_index", "step", "reward"],
            bytes_per_task=1_000_000,
            runtime_env={"env_vars": env},
        )
        counts = ds.groupby("episode_index").count().take_all()
        driver = proxy.reset()
        workers.reset()
        # Ray's own parallelism (~1 MB tasks; the shard files are ~1.1 MB): the tasks
        # hold whole files, so none walks a file's record headers to find its first
        # episode (a request per record), and the workers fetch each byte once.
        ds = ray_data.read_rlds(url, "train", runtime_env={"env_vars": env})
        episodes = sorted(
            int(i) for i in ds.select_columns(["episode_index"]).to_pandas()["episode_index"]
        )
        fetched = workers.reset()
    finally:
        proxy.close()
        workers.close()
    assert sorted(int(c["episode_index"]) for c in counts) == list(range(EPISODES))
    assert all(c["count()"] == STEPS - 1 for c in counts)
    total = sum(os.path.getsize(cameras / n) for n in os.listdir(cameras))
    assert driver < total / 50, (driver, total)  # the JSON files, never a shard
    assert episodes == list(range(EPISODES))
    shards = sum(os.path.getsize(cameras / n) for n in os.listdir(cameras) if "tfrecord" in n)
    assert shards <= fetched < shards * 1.05, (fetched, shards)
