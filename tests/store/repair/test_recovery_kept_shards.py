"""`recover` given a directory of kept shards uploads shards only, and never overwrites.

The directory a failed upload leaves (`store.storage.unsaved_shards`) may be
copied around and handed to `recover` by hand: only files named as shards go
up (not a planted `dataset_info.json`, not a link), and an object that
exists with other bytes is left alone, its copy kept. On `memory://` (the
unit tests' store): no server needed.
"""

from __future__ import annotations

import json
import os
import uuid

import rlds_writer
from rlds_writer.store.storage import unsaved_shards
from rlds_writer.store.storage.storage import storage_for


def _record(path: str, episodes: int) -> None:
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=path, max_episodes_per_file=2
    )
    for i in range(episodes):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(i % 3)
    env.close()


def test_recover_given_kept_shards_uploads_shards_only_and_overwrites_nothing(tmp_path):
    url = f"memory://rlds-{uuid.uuid4().hex[:12]}/run"
    _record(url, 4)  # shards 00000 and 00001, two episodes each
    fs = storage_for(url)
    shard = "rlds_dataset-train.tfrecord-{:05d}"
    _record(str(tmp_path / "local"), 2)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / unsaved_shards.DESTINATION).write_text(json.dumps({"dataset": url}))
    os.replace(tmp_path / "local" / shard.format(0), kept / shard.format(2))
    (kept / "dataset_info.json").write_text("{}")  # not a shard: never uploaded
    (kept / shard.format(1)).write_bytes(b"other bytes")  # its object exists
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for the bucket")
    os.symlink(secret, kept / shard.format(3))  # a link: never followed
    listed = fs.read_bytes(fs.join(url, "dataset_info.json"))
    existing = fs.read_bytes(fs.join(url, shard.format(1)))

    report = rlds_writer.recover(str(kept))
    assert report.splits == {"train": [2, 2, 2]}, report.summary()
    assert len(rlds_writer.open_dataset(url).episodes("train")) == 6
    assert fs.read_bytes(fs.join(url, shard.format(1))) == existing
    assert json.loads(fs.read_bytes(fs.join(url, "dataset_info.json"))) != {}
    assert fs.read_bytes(fs.join(url, "dataset_info.json")) != listed  # relisted
    assert not fs.exists(fs.join(url, shard.format(3)))
    assert sorted(os.listdir(kept)) == sorted(
        [unsaved_shards.DESTINATION, "dataset_info.json", shard.format(1), shard.format(3)]
    )
