"""A move into S3 (moto) killed mid-way finishes when the same merge runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import rlds_writer
from rlds_writer.store.storage.storage import storage_for

_CHILD = r"""
import sys
import rlds_writer
rlds_writer.merge([sys.argv[1]], sys.argv[2], move=True)
"""


def _record(path: str) -> None:
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=path, max_episodes_per_file=1
    )
    for i in range(8):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(i % 3)
    env.close()


@pytest.mark.slow
def test_killed_move_into_a_bucket_resumes(s3_bucket, tmp_path):
    source = str(tmp_path / "src")
    _record(source)
    # The same merge, locally, of a source of the same name (metadata.json names it).
    reference = str(tmp_path / "reference")
    _record(str(tmp_path / "ref" / "src"))
    rlds_writer.merge([str(tmp_path / "ref" / "src")], reference)
    dest = s3_bucket.path("merged")
    fs = storage_for(dest)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, source, dest], env={**os.environ, **s3_bucket.env}
    )
    try:
        # Kill it once the journal is written and a shard has arrived.
        journal = fs.join(dest, ".rlds_writer.merge.json")
        while child.poll() is None:
            if fs.exists(journal) and any(".tfrecord-" in n for n in fs.listdir(dest)):
                break
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    if fs.exists(journal):  # killed mid-way (else it had finished): the same merge finishes it
        rlds_writer.merge([source], dest, move=True)
    assert not fs.exists(journal)
    assert not os.path.exists(source)  # moved: its shards, then its JSON files, then itself
    want = {n: open(os.path.join(reference, n), "rb").read() for n in os.listdir(reference)}
    got = {n: fs.read_bytes(fs.join(dest, n)) for n in fs.listdir(dest)}
    assert sorted(got) == sorted(want)
    assert [n for n in want if got[n] != want[n]] == []
    assert rlds_writer.recover(dest, dry_run=True).splits == {"train": [1] * 8}


def test_a_journal_source_with_one_slash_is_refused_not_read_as_a_local_path(
    s3_bucket, tmp_path, monkeypatch
):
    import json

    from rlds_writer.store.repair import merge as merge_module
    from rlds_writer.store.repair.merge import MergeError

    source, dest = s3_bucket.path("src"), s3_bucket.path("merged")
    _record(source)
    fs = storage_for(dest)

    def interrupted(plan, dest):
        raise KeyboardInterrupt("killed after the journal was written")

    monkeypatch.setattr(merge_module, "_execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rlds_writer.merge([source], dest, move=True)
    monkeypatch.undo()
    # A crafted journal: `s3:/bucket/...` (one slash) normalises like `s3://bucket/...`.
    journal = fs.join(dest, ".rlds_writer.merge.json")
    plan = json.loads(fs.read_bytes(journal))
    name = plan["steps"][0]["src"].rsplit("/", 1)[1]
    plan["steps"][0]["src"] = f"s3:/{s3_bucket.name}/src/{name}"
    fs.replace_bytes(journal, json.dumps(plan).encode())
    # The local file that path names, relative to the working directory.
    planted = tmp_path / "s3:" / s3_bucket.name / "src" / name
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"a local file the merge must not touch")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MergeError, match="outside the merge's directories"):
        rlds_writer.merge([source], dest, move=True)
    assert planted.read_bytes() == b"a local file the merge must not touch"
    assert rlds_writer.recover(source, dry_run=True).splits == {"train": [1] * 8}
