"""The storage seam (store/storage/storage.py): local disk, memory://, moto S3, the GCS emulator."""

from __future__ import annotations

import os
import sys

import pytest

from rlds_writer.errors import MissingDependencyError, RLDSWriterError, UploadFailedError
from rlds_writer.store.storage import file_io, storage, storage_remote
from rlds_writer.store.storage.storage import (
    FsspecStorage,
    LocalStorage,
    StorageNotSupportedError,
    storage_for,
)


@pytest.fixture(params=["local", "memory", "s3", "gs"])
def root(request, tmp_path) -> str:
    """A fresh directory on each kind of storage."""
    if request.param == "local":
        return str(tmp_path / "root")
    if request.param == "memory":
        return f"memory://rlds-test-{os.getpid()}-{request.node.name}".replace("[", "-").rstrip("]")
    bucket = request.getfixturevalue("s3_bucket" if request.param == "s3" else "gcs_bucket")
    return bucket.path("root")


def test_backend_by_path(tmp_path):
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    assert storage_for(tmp_path).is_local
    memory = storage_for("memory://x/y")
    assert isinstance(memory, FsspecStorage)
    assert (memory.protocol, memory.is_local) == ("memory", False)


def test_missing_backend_names_the_extra(monkeypatch):
    # s3fs/gcsfs absent: a one-line error naming the extra, at first use.
    for module, path, extra in (("s3fs", "s3://b/run", "s3"), ("gcsfs", "gs://b/run", "gcs")):
        monkeypatch.setitem(sys.modules, module, None)
        for protocol in ("s3", "gs"):
            monkeypatch.delitem(storage._FSSPEC, protocol, raising=False)
        with pytest.raises(MissingDependencyError) as caught:
            storage_for(path)
        assert f'pip install "rlds_writer[{extra}]"' in str(caught.value)
        assert "\n" not in str(caught.value)


def test_unknown_protocol_is_refused():
    with pytest.raises(RLDSWriterError, match="no file system for this protocol"):
        storage_for("nosuchprotocol://bucket/run")


def test_files_round_trip(root, tmp_path, monkeypatch):
    monkeypatch.setenv("RLDS_WRITER_UNSAVED_DIR", str(tmp_path / "unsaved"))
    fs = storage_for(root)
    fs.makedirs(root)
    info = fs.join(root, "dataset_info.json")
    fs.replace_bytes(info, b'{"a": 1}')
    fs.replace_bytes(info, b'{"a": 2}', fsync=True)
    assert fs.read_bytes(info) == b'{"a": 2}'
    assert fs.read_bytes(info, limit=4) == b'{"a"'
    assert fs.read_text(info) == '{"a": 2}'
    assert fs.size(info) == 8
    assert fs.exists(info) and fs.isfile(info) and not fs.isdir(info)
    assert fs.isdir(root)
    assert fs.listdir(root) == ["dataset_info.json"]  # no temporary file left behind

    # A shard exists only complete on object stores; locally it grows in place.
    shard = fs.join(root, "ds-train.tfrecord-00000")
    sink = fs.open_shard_sink(shard)
    sink.write_parts([b"abc", memoryview(b"def")])
    sink.flush()
    assert fs.exists(shard) == fs.is_local
    sink.write_parts([bytearray(b"ghi")], 3)
    sink.close()
    assert fs.read_bytes(shard) == b"abcdefghi"
    if fs.is_local:
        with pytest.raises(FileExistsError):
            fs.open_shard_sink(shard)
    else:
        # No request at open (an episode's append never waits on the store): the
        # object is refused at the upload, and the bytes written are kept.
        sink = fs.open_shard_sink(shard)
        sink.write_parts([b"new"])
        with pytest.raises(UploadFailedError, match="already exists") as raised:
            sink.close()
        with open(raised.value.kept, "rb") as f:
            assert f.read() == b"new"
        assert fs.read_bytes(shard) == b"abcdefghi"

    aborted = fs.join(root, "aborted")
    sink = fs.open_shard_sink(aborted)
    sink.write_parts([b"x"])
    sink.abort()
    assert fs.exists(aborted) == fs.is_local

    with fs.open_random(shard) as f:
        assert f.size == 9
        assert f.read_at(3, 4) == b"defg"
        assert f.read_at(7, 100) == b"hi"
    with fs.open_read(shard) as f:
        assert f.read() == b"abcdefghi"

    sub = fs.join(root, "sub")
    fs.makedirs(sub)
    fs.copy(shard, fs.join(sub, "copied"))
    fs.move(fs.join(sub, "copied"), fs.join(sub, "moved"))
    assert fs.listdir(sub) == ["moved"]
    assert fs.read_bytes(fs.join(sub, "moved")) == b"abcdefghi"
    fs.remove(fs.join(sub, "moved"))
    assert not fs.exists(fs.join(sub, "moved"))
    with pytest.raises(FileNotFoundError):
        fs.remove(fs.join(sub, "moved"))


def test_upload_and_download(root, tmp_path):
    fs = storage_for(root)
    fs.makedirs(root)
    local = tmp_path / "local.bin"
    local.write_bytes(bytes(range(256)) * 10)
    fs.upload(str(local), fs.join(root, "up"))
    fs.download(fs.join(root, "up"), str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == local.read_bytes()


def test_create_exclusive(root):
    fs = storage_for(root)
    fs.makedirs(root)
    lock = fs.join(root, ".rlds_writer.lock")
    assert fs.create_exclusive(lock, b"first")
    assert not fs.create_exclusive(lock, b"second")
    assert fs.read_bytes(lock) == b"first"
    fs.remove(lock)
    assert fs.create_exclusive(lock, b"third")


def test_s3_conditional_create_is_the_stores(s3_bucket):
    # The check is S3's own If-None-Match: a second create with the object
    # already there fails at the server, not through our exists() check.
    fs = storage_for(s3_bucket.url)
    key = f"{s3_bucket.name}/lock"
    fs.fs.pipe_file(key, b"1", mode="create")
    with pytest.raises(FileExistsError):
        fs.fs.pipe_file(key, b"2", mode="create")


def test_protocol_without_conditional_create_refuses_a_lock():
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class PlainFileSystem(MemoryFileSystem):
        protocol = "rldsplain"

    fsspec.register_implementation("rldsplain", PlainFileSystem, clobber=True)
    fs = storage_for("rldsplain://run")
    with pytest.raises(StorageNotSupportedError, match="cannot take the one-writer lock"):
        fs.create_exclusive("rldsplain://run/.lock", b"x")
    assert not fs.exists("rldsplain://run/.lock")


def _replace_bytes(path, data, fsync):
    LocalStorage().replace_bytes(str(path), data, fsync)


def _atomic_file(path, data, fsync):
    with file_io.atomic_file(path, fsync) as f:
        f.write(data)


@pytest.mark.parametrize(
    "write", [_replace_bytes, _atomic_file], ids=["replace_bytes", "atomic_file"]
)
def test_a_local_file_is_replaced_whole_never_through_a_link_and_kept_on_error(
    tmp_path, monkeypatch, write
):
    # Both ways of replacing a local file are one function (storage.atomic_local_file).
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    target = tmp_path / "info.json"
    target.symlink_to(victim)
    # The first temporary name drawn is taken by a planted link: another is drawn.
    planted = tmp_path / f".info.json.tmp-{os.getpid()}-{'00' * 8}"
    planted.symlink_to(victim)
    draws, urandom = iter([bytes(8)]), os.urandom
    monkeypatch.setattr(os, "urandom", lambda n: next(draws, None) or urandom(n))
    calls, atomic_local_file = [], storage.atomic_local_file

    def spy(path, fsync=False):
        calls.append(path)
        return atomic_local_file(path, fsync)

    monkeypatch.setattr(storage, "atomic_local_file", spy)
    write(target, b"new", True)
    assert calls == [str(target)]  # the one implementation, whichever the entry
    assert not target.is_symlink() and target.read_bytes() == b"new"  # the link itself replaced
    assert victim.read_bytes() == b"keep" and planted.is_symlink()
    planted.unlink()
    with pytest.raises(TypeError):  # a failed write leaves the old file, and no temporary
        write(target, object(), False)
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["info.json", "victim"]


def test_remote_random_access_reads_ranges_not_the_object(s3_bucket):
    fs = storage_for(s3_bucket.url)
    big = s3_bucket.path("big")
    data = os.urandom(24 * storage_remote.REMOTE_BLOCK_SIZE)
    fs.replace_bytes(big, data)
    with fs.open_random(big) as f:
        assert f.read_at(5, 10) == data[5:15]
        far = 20 * storage_remote.REMOTE_BLOCK_SIZE + 7
        assert f.read_at(far, 100) == data[far : far + 100]
        assert f.read_at(5, 10) == data[5:15]
        assert f.blocks_fetched == 2


def test_local_never_writes_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    root = tmp_path / "ds"
    root.mkdir()
    fs = storage_for(str(root))
    for name in ("lock", "shard", "info"):
        os.symlink(victim, root / name)
    assert not fs.create_exclusive(str(root / "lock"), b"x")
    with pytest.raises(FileExistsError):
        fs.open_shard_sink(str(root / "shard"))
    fs.replace_bytes(str(root / "info"), b"new")  # replaces the link itself
    assert not os.path.islink(root / "info")
    assert (root / "info").read_bytes() == b"new"
    assert victim.read_bytes() == b"keep"
