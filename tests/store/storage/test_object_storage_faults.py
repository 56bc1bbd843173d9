"""Recording to and reading from S3 (moto) through a proxy that breaks requests on command.

The store goes away (connections reset) or black-holes requests at `close()`:
the episodes not uploaded keep their local file, the error says which and
where, the lock's release does not hide it, and `recover` (on the dataset or
on the kept copy) uploads them; a stalled upload never blocks the env loop; a
reader whose range requests are all reset gets our error naming the object;
a refused credential and a missing bucket say what to check. Every count is
of episodes: recorded, reported saved, found afterwards.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from fault_proxy import fault_proxy

import rlds_writer
from rlds_writer.errors import (
    BucketNotFoundError,
    StorageAccessError,
    StorageError,
    UploadFailedError,
    WriterFailedError,
)
from rlds_writer.store.storage import unsaved_shards

pytest.importorskip("s3fs")
pytestmark = pytest.mark.slow  # servers: out of the quick loop


def _proxy(bucket, monkeypatch, tmp_path):
    monkeypatch.setenv("RLDS_WRITER_UNSAVED_DIR", str(tmp_path / "unsaved"))
    # Roomy bounds while the store works (the machine may be loaded) ...
    monkeypatch.setenv("RLDS_WRITER_STORE_TIMEOUT", "20")
    monkeypatch.setenv("RLDS_WRITER_STORE_ATTEMPTS", "2")
    return fault_proxy(bucket, monkeypatch)


@pytest.fixture
def proxy(s3_bucket, monkeypatch, tmp_path):
    relay = _proxy(s3_bucket, monkeypatch, tmp_path)
    yield relay
    relay.close()


@pytest.fixture
def gcs_proxy(gcs_bucket, monkeypatch, tmp_path):
    relay = _proxy(gcs_bucket, monkeypatch, tmp_path)
    yield relay
    relay.close()


def _store(request, store: str):
    """(bucket, proxy) of S3 (moto) or GCS (the emulator), the proxy in front."""
    if store == "s3":
        return request.getfixturevalue("s3_bucket"), request.getfixturevalue("proxy")
    return request.getfixturevalue("gcs_bucket"), request.getfixturevalue("gcs_proxy")


def _break(proxy, monkeypatch, action: str, **which) -> None:
    """... and short ones once it breaks, so a test's close() fails in seconds."""
    monkeypatch.setenv("RLDS_WRITER_STORE_TIMEOUT", "1")
    proxy.fail(action, **which)


def _episode(env, action: int) -> None:
    timestep = env.reset()
    while not timestep.last():
        timestep = env.step(action)


def _episodes_found(url: str) -> int:
    return len(rlds_writer.open_dataset(url).episodes("train"))


def _in_time(fn, seconds: float):
    """Runs `fn` on a thread; fails the test if it has not returned within `seconds`."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize(
    ("store", "fault", "recover_from"),
    [("s3", "reset", "dataset"), ("s3", "blackhole", "copy"), ("gs", "blackhole", "dataset")],
)
def test_a_store_gone_at_close_keeps_the_unsaved_episodes_for_recover(
    request, monkeypatch, store, fault, recover_from
):
    bucket, proxy = _store(request, store)
    url = bucket.path("run")
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=url)
    for i in range(10):
        _episode(env, i % 3)
        if i == 3:
            env.flush()  # four episodes uploaded and listed
    _break(proxy, monkeypatch, fault)  # the store is gone (reset) or answers nothing
    with pytest.raises(WriterFailedError) as raised:
        _in_time(env.close, 60)  # bounded: 2 attempts of 1 s per request
    message = str(raised.value)
    assert "4 episodes of this run are in the store" in message
    assert "6 episodes were NOT uploaded (episodes 5-10 of this run" in message
    assert "on disk" not in message and ".rlds_writer.lock" not in message
    assert isinstance(raised.value.__cause__, UploadFailedError)
    kept_dir = unsaved_shards.kept_directory(url)
    assert kept_dir in message and unsaved_shards.destination_of(kept_dir) == url
    assert len(unsaved_shards.kept_shards(kept_dir)) == 1

    proxy.heal()
    assert _episodes_found(url) == 4  # what the last commit listed
    report = rlds_writer.recover(url if recover_from == "dataset" else kept_dir)
    assert report.splits == {"train": [4, 6]}, report.summary()
    assert _episodes_found(url) == 10
    assert not os.path.exists(kept_dir)
    # The lock left by the failed release was this process's: taken over, released.
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=1), data_directory=url, mode="append")
    _episode(env, 1)
    env.close()
    assert _episodes_found(url) == 11


def test_a_stalled_upload_is_never_waited_for_by_the_env_loop(proxy, s3_bucket):
    url = s3_bucket.path("run")
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=url, max_episodes_per_file=5
    )
    _episode(env, 0)  # the first shard is open: later short episodes are written inline
    proxy.fail("hold", method="PUT")  # every upload stalls until released
    longest = [0.0]

    def loop():
        for i in range(1, 12):
            timestep = env.reset()
            while not timestep.last():
                start = time.perf_counter()
                timestep = env.step(i % 3)
                longest[0] = max(longest[0], time.perf_counter() - start)

    # The fifth episode fills the shard: its upload stalls on the writer thread
    # while the env loop goes on (before the fix, the env thread uploaded it and
    # waited for the store).
    _in_time(loop, 60)
    _in_time(lambda: _wait_for(lambda: proxy.held >= 1), 30)
    print(f"longest env step while an upload stalled: {longest[0] * 1e3:.2f} ms")
    assert proxy.count("hold", "PUT") >= 1
    proxy.heal()
    _in_time(env.close, 60)
    assert _episodes_found(url) == 12


def test_a_failed_rotation_keeps_its_shard_and_the_episodes_queued_behind_it(
    proxy, s3_bucket, monkeypatch
):
    url = s3_bucket.path("run")
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=url, max_episodes_per_file=2
    )
    # The store takes no upload: the 2nd episode fills the first shard, whose
    # upload times out on the writer thread while episodes 3-6 queue behind it.
    _break(proxy, monkeypatch, "blackhole", method="PUT")
    _in_time(lambda: [_episode(env, i % 3) for i in range(6)], 60)
    with pytest.raises(WriterFailedError) as raised:
        _in_time(env.close, 60)
    message = str(raised.value)
    assert "0 episodes of this run are in the store" in message
    assert "6 episodes were NOT uploaded (episodes 1-6 of this run" in message
    kept_dir = unsaved_shards.kept_directory(url)
    assert len(unsaved_shards.kept_shards(kept_dir)) == 2
    proxy.heal()
    report = rlds_writer.recover(url)
    assert report.splits == {"train": [2, 4]}, report.summary()
    assert _episodes_found(url) == 6


def _wait_for(condition) -> None:
    while not condition():
        time.sleep(0.01)


def _local_dataset(path: str) -> None:
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=path, max_episodes_per_file=2
    )
    for i in range(4):
        _episode(env, i % 3)
    env.close()


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_every_range_request_reset_raises_our_error_naming_the_object(request, monkeypatch, store):
    bucket, proxy = _store(request, store)
    url = bucket.path("run")
    _local_dataset(url)
    _break(proxy, monkeypatch, "reset", ranged=True)
    with pytest.raises(StorageError) as raised:
        _in_time(lambda: [len(e["steps"]) for e in rlds_writer.open_dataset(url).episodes()], 60)
    assert re.search(
        rf"{url}/\S*\.tfrecord-0000\d: reading failed after 2 attempts", str(raised.value)
    )
    assert ("AWS_ENDPOINT_URL" if store == "s3" else "STORAGE_EMULATOR_HOST") in str(raised.value)
    assert proxy.count("reset") >= 2
    proxy.heal()
    assert _episodes_found(url) == 4


def test_a_refused_secret_names_the_bucket_and_the_credentials(proxy, s3_bucket, capsys):
    from rlds_writer.cli.main import main

    url = s3_bucket.path("run")
    proxy.fail("403")
    with pytest.raises(StorageAccessError) as raised:
        rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=url)
    text = str(raised.value)
    assert url in text and s3_bucket.name in text and "AWS_SECRET_ACCESS_KEY" in text
    assert main(["info", url]) == 1
    line = capsys.readouterr().err
    assert "error: Forbidden" not in line and "AWS_SECRET_ACCESS_KEY" in line and url in line


def test_a_missing_bucket_is_named_as_missing(s3_bucket, capsys):
    from rlds_writer.cli.main import main

    url = f"s3://{s3_bucket.name}-missing/run"
    with pytest.raises(BucketNotFoundError, match=rf"bucket '{s3_bucket.name}-missing' does"):
        rlds_writer.open_dataset(url)
    with pytest.raises(BucketNotFoundError, match="AWS_ENDPOINT_URL"):
        rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=url)
    assert main(["info", url]) == 1
    line = capsys.readouterr().err
    assert "not an RLDS dataset directory" not in line and "does not exist" in line


@pytest.mark.parametrize("store", ["s3", "gs"])
def test_a_stream_read_of_a_silent_store_ends_in_our_bound_naming_the_object(
    request, monkeypatch, store
):
    """`recover`'s rewrite and `tfrecord_records` read a shard as a stream: a store
    that stops answering ends it within RLDS_WRITER_STORE_TIMEOUT x attempts (not the
    client library's minute per try), with our error naming the object."""
    from rlds_writer.store.formats.tfrecord import tfrecord_shards
    from rlds_writer.store.storage.object_path import as_path

    bucket, proxy = _store(request, store)
    url = bucket.path("run")
    _local_dataset(url)
    shard = sorted(str(p) for p in as_path(url).iterdir() if ".tfrecord-" in str(p))[0]
    whole = as_path(shard).read_bytes()
    with as_path(shard).open("rb") as f:
        f.seek(10)
        assert f.read(100) == whole[10:110] and f.tell() == 110
    stream = as_path(shard).open("rb")  # opened (its size asked) before the store goes silent
    _break(proxy, monkeypatch, "blackhole", method="GET")
    with pytest.raises(StorageError) as raised:
        _in_time(stream.read, 30)
    assert re.search(
        rf"{shard}: reading failed after 2 attempts of at most \d+ s", str(raised.value)
    )
    proxy.heal()
    assert len(list(tfrecord_shards.tfrecord_records(shard))) == 2
