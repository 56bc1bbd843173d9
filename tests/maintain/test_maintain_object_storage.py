"""`info`, `validate`, `stats`, `show` and `export` on datasets in object storage.

Each command runs on a dataset written locally and uploaded to a real server
on 127.0.0.1 (moto's S3, the GCS emulator), and must give what it gives on
the local directory: the same summary, checks, statistics, frames and
exported values (only the path differs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from byte_relay import upload
from object_store_data import EPISODES, write_camera_dataset

import rlds_writer
from rlds_writer.maintain import field_statistics, statistics
from rlds_writer.maintain.episode_video import render_episode
from rlds_writer.maintain.summary import info
from rlds_writer.maintain.validation import validate
from rlds_writer.store.dataset import Dataset

pytest.importorskip("s3fs")
pytest.importorskip("gcsfs")
# Servers, and a dataset uploaded for each test: out of the quick loop.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_camera_dataset(tmp_path_factory.mktemp("local") / "cameras")


@pytest.fixture
def remote(object_store, local):
    url = object_store.path("cameras")
    upload(local, url)
    return url


def _without_path(summary: dict, path: object) -> str:
    return json.dumps(summary, sort_keys=True).replace(str(path), "<ds>")


def test_info_of_a_bucket_equals_info_of_the_directory(local, remote):
    there = info(remote)
    assert there["splits"]["train"]["steps"] == EPISODES * 8
    assert there["path"] == remote
    assert _without_path(there, remote) == _without_path(info(local), local)


def test_info_reports_damage_in_a_bucket_as_in_the_directory(local, object_store, tmp_path):
    bucket = object_store.url
    damaged = tmp_path / "damaged"
    shutil.copytree(local, damaged)
    shard = damaged / "rlds_dataset-train.tfrecord-00001"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record header: the scan resynchronises after it
    shard.write_bytes(bytes(data))
    os.remove(damaged / "rlds_dataset-train.tfrecord-00002")
    url = f"{bucket}/damaged-info"
    upload(damaged, url)
    here, there = info(damaged), info(url)
    assert len(there["problems"]) >= 3
    assert _without_path(there, url) == _without_path(here, damaged)
    checked, expected = validate(url), validate(damaged)
    assert not checked["ok"]
    assert [v["message"].replace(url, "<ds>") for v in checked["violations"]] == [
        v["message"].replace(str(damaged), "<ds>") for v in expected["violations"]
    ]


def test_validate_checks_a_bucket_with_the_tf_free_reader(local, remote):
    there, here = validate(remote), validate(local)
    assert there["ok"] and here["ok"]
    assert there["splits"] == here["splits"] == {"train": {"episodes": EPISODES, "steps": 96}}
    assert any("rlds_writer's reader" in note for note in there["notes"])


def test_stats_of_a_bucket_equal_stats_of_the_directory(local, remote):
    there = statistics.compute_statistics(remote, per_episode=True)
    assert _without_path(there, remote) == _without_path(
        statistics.compute_statistics(local, per_episode=True), local
    )
    dims = field_statistics.dataset_statistics(Dataset.open(remote), "train")
    expected = field_statistics.dataset_statistics(local, "train", cache=False)
    del expected["fingerprint"]
    assert json.dumps(dims, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_show_draws_the_same_frames_from_a_bucket(local, remote, tmp_path):
    done = render_episode(remote, tmp_path / "there.gif", episode=7)
    render_episode(local, tmp_path / "here.gif", episode=7)
    assert done["frames"] == 8
    assert (tmp_path / "there.gif").read_bytes() == (tmp_path / "here.gif").read_bytes()


def test_export_reads_its_source_from_a_bucket(local, remote, tmp_path):
    pytest.importorskip("h5py")
    rlds_writer.export(remote, tmp_path / "there.h5", to="d3rlpy")
    rlds_writer.export(local, tmp_path / "here.h5", to="d3rlpy")
    import h5py

    with h5py.File(tmp_path / "there.h5") as a, h5py.File(tmp_path / "here.h5") as b:
        names = []
        a.visit(names.append)
        assert names
        for name in names:
            if isinstance(a[name], h5py.Dataset):
                assert np.array_equal(a[name][()], b[name][()]), name


def test_the_cli_reads_a_bucket(local, remote, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlds_writer.cli.main", *args],
            capture_output=True,
            text=True,
            env=os.environ,
            cwd=tmp_path,
        )

    there, here = cli("info", "--json", remote), cli("info", "--json", str(local))
    assert there.returncode == 0, there.stderr
    assert there.stdout.replace(remote, "<ds>") == here.stdout.replace(str(local), "<ds>")
    checked = cli("validate", remote)
    assert checked.returncode == 0 and f"{remote}: valid" in checked.stdout
    missing = cli("info", remote + "-nothing")
    assert missing.returncode != 0
    assert "Traceback" not in missing.stderr
    assert "not an RLDS dataset directory" in missing.stderr


def test_info_and_validate_read_array_record_shards_in_a_bucket(
    object_store, tmp_path, tmp_path_factory, monkeypatch
):
    local = write_camera_dataset(tmp_path_factory.mktemp("ar") / "cameras", "array_record")
    url = object_store.path("array-record")
    upload(local, url)
    monkeypatch.setenv("RLDS_WRITER_CACHE_DIR", str(tmp_path / "cache"))
    there = info(url)
    assert there["file_format"] == "array_record"
    assert there["splits"]["train"]["steps"] == EPISODES * 8
    assert _without_path(there, url) == _without_path(info(local), local)
    checked = validate(url)
    assert checked["ok"], checked["violations"]
    assert checked["splits"] == {"train": {"episodes": EPISODES, "steps": EPISODES * 8}}
