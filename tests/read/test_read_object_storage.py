"""The TF-free reader on datasets in object storage (moto's S3 server, the GCS emulator).

Datasets are written locally and uploaded; every value read from the bucket
must equal the local read, and reading one episode must fetch that episode
(and a few record headers), never the dataset: a TCP relay in front of the
real server counts the bytes it sends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from byte_relay import relay, upload
from helpers_core import assert_same
from object_store_data import EPISODES, PER_SHARD, write_camera_dataset

import rlds_writer
from rlds_writer.errors import IncompatibleDatasetError, NotADatasetError

pytest.importorskip("s3fs")
pytest.importorskip("gcsfs")
# Servers, and a dataset uploaded for each test: out of the quick loop.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_camera_dataset(tmp_path_factory.mktemp("local") / "cameras")


@pytest.fixture
def counter(object_store, monkeypatch):
    proxy = relay(object_store, monkeypatch)
    yield proxy
    proxy.close()


@pytest.fixture
def remote(object_store, counter, local):
    url = object_store.path("cameras")
    upload(local, url)
    return url, counter


def test_every_episode_read_from_the_bucket_equals_the_local_read(local, remote):
    url, _ = remote
    here, there = rlds_writer.open_dataset(local), rlds_writer.open_dataset(url)
    assert there.splits == here.splits == {"train": EPISODES}
    assert there.metadata == here.metadata
    # Sequential (file order) and random access, each against the local read.
    for mine, theirs in zip(here.episodes("train"), there.episodes("train"), strict=True):
        assert_same(theirs, mine)
    for i in (EPISODES - 1, 0, 5):
        assert_same(there.episodes("train")[i], here.episodes("train")[i])
    assert there.num_steps("train[2:7]") == here.num_steps("train[2:7]")
    windows = zip(here["train[:3]"].windows(4, 3), there["train[:3]"].windows(4, 3), strict=True)
    for mine, theirs in windows:
        assert_same(theirs, mine)


def test_reading_one_episode_fetches_that_episode_not_the_dataset(local, remote):
    url, proxy = remote
    shard = os.path.getsize(local / "rlds_dataset-train.tfrecord-00001")
    total = sum(os.path.getsize(local / n) for n in os.listdir(local))
    proxy.reset()
    reader = rlds_writer.open_dataset(url)
    episode = reader.episodes("train")[PER_SHARD + 1]  # the second record of the second shard
    fetched = proxy.reset()
    record = shard / PER_SHARD
    assert episode["steps"]["observation"]["state"].shape == (8, 8192)
    # The record itself came through the relay (the count is real) ...
    assert fetched > record
    # ... and little else: the JSON files and one small range per record header.
    assert fetched < 2 * record < total / 5, (fetched, record, total)

    proxy.reset()
    ((_, data),) = list(reader.episodes("train")[PER_SHARD * 2 + 2 : PER_SHARD * 2 + 3].records())
    fetched = proxy.reset()
    assert len(data) < fetched < 2 * record, (fetched, record)


def test_the_torch_reader_streams_from_the_bucket(local, remote):
    pytest.importorskip("torch")
    from rlds_writer.read.torch_data import EpisodeDataset, WindowDataset

    url, _ = remote
    here, there = WindowDataset(local, 3, stride=2), WindowDataset(url, 3, stride=2)
    assert len(there) == len(here)
    for i in (0, len(here) // 2, len(here) - 1):
        assert_same(there[i], here[i])
    episodes = EpisodeDataset(rlds_writer.open_dataset(url), "train[-2:]")
    assert [len(e["steps"]["reward"]) for e in episodes] == [8, 8]


def test_reading_a_bucket_does_not_load_tensorflow(remote):
    url, _ = remote
    code = (
        "import sys, rlds_writer\n"
        f"r = rlds_writer.open_dataset({url!r})\n"
        "n = sum(len(e['steps']['reward']) for e in r.episodes('train'))\n"
        "print(n, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.split() == [str(EPISODES * 8), "False"]


def test_a_missing_dataset_in_a_bucket_is_not_a_dataset(object_store):
    bucket = object_store.url
    with pytest.raises(NotADatasetError, match="it has no dataset_info.json"):
        rlds_writer.open_dataset(f"{bucket}/no-such-dataset")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("filepathTemplate", "../victim/{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"),
        ("filepathTemplate", "/{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"),
        ("name", "../victim"),
    ],
)
def test_names_leading_outside_the_dataset_are_refused_in_a_bucket(
    local, object_store, field, value, tmp_path
):
    import fsspec

    bucket = object_store.url
    info = json.loads((local / "dataset_info.json").read_text())
    if field == "name":
        info["splits"][0]["name"] = value
    else:
        info["splits"][0][field] = value
    url = f"{bucket}/crafted-{abs(hash(value))}"
    upload(local, url)
    fs = fsspec.filesystem(url.split("://")[0])
    fs.pipe_file(f"{url}/dataset_info.json", json.dumps(info).encode())
    # The victim: a shard a crafted name could reach, next to the dataset.
    upload(local, f"{bucket}/victim")
    with pytest.raises(IncompatibleDatasetError, match="dataset_info.json"):
        rlds_writer.open_dataset(url)
    assert (
        fs.cat_file(f"{bucket}/victim/dataset_info.json")
        == (local / "dataset_info.json").read_bytes()
    )


def test_a_damaged_record_in_a_bucket_is_named_as_locally(local, object_store, tmp_path):
    import shutil

    bucket = object_store.url
    damaged = tmp_path / "damaged"
    shutil.copytree(local, damaged)
    shard = damaged / "rlds_dataset-train.tfrecord-00001"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 + 1000] ^= 0xFF  # inside record 2: its data CRC fails
    shard.write_bytes(bytes(data))
    url = f"{bucket}/damaged"
    upload(damaged, url)
    errors = []
    for where in (damaged, url):
        with pytest.raises(rlds_writer.CorruptRecordError) as raised:
            list(rlds_writer.open_dataset(where).episodes("train"))
        errors.append((raised.value.offset, str(raised.value).replace(str(where), "<ds>")))
    assert errors[0] == errors[1]
    skipped = rlds_writer.open_dataset(url, on_corrupt="skip").episodes("train")
    assert sum(1 for _ in skipped) == EPISODES - 1
    assert np.isfinite(skipped[0]["steps"]["reward"]).all()


def test_array_record_shards_are_copied_one_at_a_time_into_a_bounded_cache(
    object_store, tmp_path, tmp_path_factory, monkeypatch
):
    local = write_camera_dataset(tmp_path_factory.mktemp("ar") / "cameras", "array_record")
    url = object_store.path("array-record")
    upload(local, url)
    cache = tmp_path / "cache"
    shard = max(os.path.getsize(local / n) for n in os.listdir(local))
    monkeypatch.setenv("RLDS_WRITER_CACHE_DIR", str(cache))
    monkeypatch.setenv("RLDS_WRITER_CACHE_BYTES", str(int(shard * 1.5)))
    there, here = rlds_writer.open_dataset(url), rlds_writer.open_dataset(local)
    assert there.file_format == "array_record"
    assert_same(there.episodes("train")[PER_SHARD + 1], here.episodes("train")[PER_SHARD + 1])
    assert len(os.listdir(cache)) == 1  # the one shard read, not the dataset
    for mine, theirs in zip(here.episodes("train"), there.episodes("train"), strict=True):
        assert_same(theirs, mine)
    # Three shards read, room for one and a half: the older copies were evicted.
    assert len(os.listdir(cache)) == 1
    assert sum(os.path.getsize(cache / n) for n in os.listdir(cache)) <= shard * 1.5
