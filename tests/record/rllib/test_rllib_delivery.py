"""The driver-side halves of an RLlib recording on a cluster, without Ray.

`EpisodeSink` (the actor on the driver's node) is a plain class: its refusal
of paths a runner sends is tested here on real files. `check_delivered` and
`check_merged` are tested on real datasets against runner reports; the
whole thing runs on a real two-node cluster in test_rllib_cluster.py.
"""

from __future__ import annotations

import os

import pytest

import rlds_writer
from rlds_writer.errors import EpisodesLostError, RLDSWriterError, UnsafePathError
from rlds_writer.record.rllib.rllib_delivery import check_delivered, check_merged
from rlds_writer.record.rllib.rllib_sink import EpisodeSink


def _record(path, episodes: int) -> None:
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=path)
    for _ in range(episodes):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(0)
    env.close()


def _report(directory: str, n: int, worker: int = 2) -> dict:
    return {
        "worker_index": worker,
        "split": "train",
        "node_id": "3fa2b81c09de" + "0" * 44,
        "node_ip": "10.0.0.7",
        "pid": 318,
        "counts": {directory: {"train": n}},
        "shipped": True,
        "closed": True,
    }


@pytest.mark.parametrize(
    "dataset", ["../victim", "/tmp/victim", "writer-1/../../victim", "a//b", ".", ""]
)
def test_the_sink_refuses_a_dataset_path_that_leaves_the_output_root(tmp_path, dataset):
    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "marker").write_text("keep")
    sink = EpisodeSink(os.fspath(root))
    with pytest.raises(UnsafePathError, match="leaves the output root"):
        sink.put("inc", dataset, "x.tfrecord-00000", b"data", 0)
    with pytest.raises(UnsafePathError):
        sink.sees(dataset or "..")
    assert sorted(os.listdir(victim)) == ["marker"]
    assert (victim / "marker").read_text() == "keep"
    assert os.listdir(root) == []


@pytest.mark.parametrize("name", ["../x", "a/b", ".rlds_writer.lock", "..", ""])
def test_the_sink_refuses_a_file_name_outside_the_mirror_or_its_lock(tmp_path, name):
    sink = EpisodeSink(os.fspath(tmp_path))
    with pytest.raises(UnsafePathError):
        sink.put("inc", "writer-00002", name, b"data", 0)
    assert os.listdir(tmp_path) == []


def test_the_sink_takes_only_dataset_json_in_a_commit(tmp_path):
    sink = EpisodeSink(os.fspath(tmp_path))
    with pytest.raises(UnsafePathError, match="only dataset JSON"):
        sink.commit("inc", "writer-00002", {"evil.py": b"print(1)"})
    assert not (tmp_path / "writer-00002" / "evil.py").exists()


def test_a_mirror_never_reuses_a_directory_of_an_earlier_run(tmp_path):
    _record(tmp_path / "writer-00002", 1)
    before = sorted(os.listdir(tmp_path / "writer-00002"))
    sink = EpisodeSink(os.fspath(tmp_path))
    assert sink.mirror("inc", "writer-00002") == "writer-00002.1"
    assert sink.mirror("other", "writer-00002") == "writer-00002.2"
    assert sorted(os.listdir(tmp_path / "writer-00002")) == before
    sink.finish()


def test_a_mirror_is_never_written_through_a_link_planted_in_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    os.symlink(victim, root / "writer-00002")
    sink = EpisodeSink(os.fspath(root))
    assert sink.mirror("inc", "writer-00002") == "writer-00002.1"
    sink.put("inc", "writer-00002", "x-train.tfrecord-00000", b"data", 0)
    sink.seal("inc", "writer-00002", "x-train.tfrecord-00000", 4)
    sink.finish()
    assert os.listdir(victim) == []
    assert (root / "writer-00002.1" / "x-train.tfrecord-00000").read_bytes() == b"data"


def test_delivered_episodes_pass_the_check(tmp_path):
    _record(tmp_path / "writer-00001", 2)
    _record(tmp_path / "writer-00002", 3)
    reports = {"a": _report("writer-00001", 2, 1), "b": _report("writer-00002", 3)}
    check_delivered(tmp_path, reports)


def test_a_runner_directory_short_of_its_reported_episodes_raises_naming_runner_and_node(
    tmp_path,
):
    _record(tmp_path / "writer-00002", 2)
    with pytest.raises(EpisodesLostError) as error:
        check_delivered(tmp_path, {"b": _report("writer-00002", 3)})
    text = str(error.value)
    assert "\n" not in text
    assert "EnvRunner 2 (pid 318) on node 10.0.0.7 3fa2b81c09de" in text
    assert "holds 2 of the 3 episodes finished in split 'train'" in text
    assert isinstance(error.value, RLDSWriterError)


def test_a_runner_directory_that_never_reached_the_driver_raises(tmp_path):
    # main's failure: the runner wrote to its own node's disk, the driver saw nothing.
    with pytest.raises(EpisodesLostError, match="writer-00002 holds 0 of the 4 episodes"):
        check_delivered(tmp_path, {"b": _report("writer-00002", 4)})


def test_a_listed_shard_missing_raises_naming_the_file(tmp_path):
    _record(tmp_path / "writer-00002", 2)
    shard = next(n for n in os.listdir(tmp_path / "writer-00002") if ".tfrecord-" in n)
    os.remove(tmp_path / "writer-00002" / shard)
    with pytest.raises(EpisodesLostError, match=f"lacks the shard files {shard} it lists"):
        check_delivered(tmp_path, {"b": _report("writer-00002", 2)})


def test_a_merged_dataset_short_of_the_reported_episodes_raises(tmp_path):
    _record(tmp_path / "merged", 3)
    reports = {"a": _report("writer-00001", 2, 1), "b": _report("writer-00002", 2)}
    with pytest.raises(EpisodesLostError, match="split 'train' holds 3 episodes but .* 4"):
        check_merged(tmp_path / "merged", reports, per_module=False)
    check_merged(tmp_path / "merged", {"a": _report("writer-00001", 3, 1)}, per_module=False)


def test_an_episode_a_runner_could_not_write_raises_naming_runner_node_and_episode():
    from rlds_writer.record.rllib.rllib_delivery import check_recorded

    reports = {
        "a": {**_report("writer-00001", 2, 1), "unrecorded": []},
        "b": {**_report("writer-00002", 3), "unrecorded": ["ec95f3f795c8"]},
    }
    with pytest.raises(EpisodesLostError) as error:
        check_recorded(reports)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith("1 episode RLlib finished could not be recorded")
    assert "EnvRunner 2 (pid 318) on node 10.0.0.7 3fa2b81c09de: ec95f3f795c8" in text
    assert "EnvRunner 1" not in text
    # Reports of runners that wrote everything (or predate the field) pass.
    check_recorded({"a": _report("writer-00001", 2, 1), "b": {**reports["a"]}})
