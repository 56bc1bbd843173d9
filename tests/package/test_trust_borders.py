"""Trust at the borders: names that become paths, planted links, overlapping paths.

Every hostile input is built here in a tmp dir with victim files next to it:

* names that become path components (a step field `../../../../x` exported
  as a LeRobot video, PettingZoo agent ids `../out` and absolute paths, an
  RLlib module id with `/`, a LeRobot `video_path` that is absolute, climbs
  out or has a huge format width) are refused in one line naming the name and
  what is allowed, and the victim paths stay untouched;
* a symbolic link planted at the temporary name of the statistics cache, of
  `dataset_info.json` and of the reader's index cache never makes us write
  its target;
* `convert` and `export` with a destination equal to, inside or containing
  the source are refused before anything is written; the source stays
  byte-identical;
* a statistics cache with the right fingerprint but no fields is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import crash_child
import numpy as np
import pytest

import rlds_writer
from rlds_writer import cli
from rlds_writer.errors import IncompatibleDatasetError, UnsafePathError
from rlds_writer.store.dataset import layout, names
from rlds_writer.store.storage import file_io

gym = pytest.importorskip("gymnasium")


def _one_line_error(capsys, argv, *expected):
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for text in expected:
        assert text in err[0], err
    return err[0]


def _tree(path: Path) -> dict[str, str]:
    """Relative path -> sha256 (or link target) of everything under `path`."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(root) / name
            rel = os.path.relpath(p, path)
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


# ------------------------------------------------------------------ names


def test_names_check_accepts_ordinary_names_and_refuses_paths():
    for ok in ("observation", "agent_0", "adversary-1", "p0.v2", "cam+depth", "_x"):
        assert names.check_name(ok, "field") == ok
    for bad in ("../out", "/abs", "a/b", "..", ".", "", ".hidden", "-rf", "a\\b", "x\0", 7):
        with pytest.raises(UnsafePathError, match="expected 1-255 ASCII letters"):
            names.check_name(bad, "field")
    with pytest.raises(UnsafePathError):
        names.check_name("x" * 256, "field")


class _Cam(gym.Env):
    """One image observation under a hostile dict key."""

    key = "../../../../x"
    observation_space = gym.spaces.Dict({key: gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {self.key: np.zeros((16, 16, 3), np.uint8)}, {}

    def step(self, action):
        self.t += 1
        return {self.key: np.full((16, 16, 3), self.t * 20, np.uint8)}, 1.0, self.t >= 4, False, {}


def test_lerobot_video_export_refuses_a_field_name_that_climbs_out(
    tmp_path, capsys, record_episodes
):
    pytest.importorskip("av")
    src = record_episodes(_Cam(), tmp_path / "rlds", action=0, max_steps=10).path
    out = tmp_path / "a" / "b"
    out.mkdir(parents=True)
    dest = out / "dest"
    # Where videos/observation.images.../../../../x/... would land: <out>/x.
    victim = out / "x"
    victim.mkdir()
    (victim / "keep.txt").write_text("victim")
    before = _tree(tmp_path / "a")
    argv = ["export", "--to", "lerobot", "--video", str(src), str(dest)]
    _one_line_error(capsys, argv, "observation.images.../../../../x", "expected 1-255 ASCII")
    assert _tree(tmp_path / "a") == before
    assert not dest.exists()


class _Agents:
    """A minimal PettingZoo ParallelEnv whose agents have the given ids."""

    def __init__(self, ids):
        self.possible_agents = list(ids)
        self.agents = []
        self.metadata = {"name": "agents"}
        self.unwrapped = self

    def observation_space(self, agent):
        return gym.spaces.Box(-1, 1, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def close(self):
        pass


@pytest.mark.parametrize("layout_name", ["per_agent", "joint"])
def test_pettingzoo_agent_ids_that_are_paths_are_refused(tmp_path, layout_name):
    pytest.importorskip("pettingzoo")
    from rlds_writer.record.pettingzoo import RecordRLDSParallel

    root = tmp_path / "root"
    data = root / "data"
    absolute = str(tmp_path / "abs")
    for bad in ("../out", absolute, "a/b"):
        with pytest.raises(UnsafePathError) as e:
            RecordRLDSParallel(_Agents([bad, "ok_0"]), data, layout=layout_name)
        message = str(e.value)
        assert "\n" not in message and repr(bad) in message
        assert "expected 1-255 ASCII letters" in message
    assert not (root / "out").exists() and not os.path.exists(absolute)
    assert not data.exists() or not any(data.iterdir())


def test_pettingzoo_agent_group_that_is_a_path_is_refused(tmp_path):
    pytest.importorskip("pettingzoo")
    from rlds_writer.record.pettingzoo import RecordRLDSParallel

    with pytest.raises(UnsafePathError, match=r"agent group '\.\./out'.*expected 1-255"):
        RecordRLDSParallel(_Agents(["a_0"]), tmp_path / "data", agent_group=lambda a: "../out")
    assert not (tmp_path / "out").exists()


def test_rllib_module_id_with_a_separator_is_refused():
    from rlds_writer.record.rllib.rllib_multiagent import check_module_id

    for bad in ("a/b", "../m", "/abs", ".."):
        with pytest.raises(UnsafePathError) as e:
            check_module_id(bad)
        message = str(e.value)
        assert "\n" not in message and repr(bad) in message and "expected 1-255" in message


@pytest.fixture(scope="module")
def lerobot_video(tmp_path_factory, record_episodes):
    """A LeRobot video export of a dataset with one safe camera."""
    pytest.importorskip("av")

    class Cam(_Cam):
        key = "rgb"
        observation_space = gym.spaces.Dict({"rgb": _Cam.observation_space[_Cam.key]})

    base = tmp_path_factory.mktemp("lerobot_video")
    src = record_episodes(Cam(), base / "rlds", action=0, max_steps=10).path
    dest = base / "lerobot"
    rlds_writer.export(src, dest, to="lerobot", video=True)
    return dest


@pytest.mark.parametrize(
    "template",
    [
        "ABSOLUTE/videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "../victim/videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "videos/{video_key}/../../../victim/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "videos/{video_key}/chunk-{chunk_index:0600000000d}/file-{file_index:03d}.mp4",
        "videos/{video_key.__class__}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    ],
    ids=["absolute", "climbs", "climbs-inside", "huge-width", "attribute"],
)
def test_lerobot_import_refuses_a_video_path_outside_the_dataset(
    lerobot_video, tmp_path, capsys, template
):
    dataset = tmp_path / "dataset"
    shutil.copytree(lerobot_video, dataset)
    # A victim copy of the videos outside the dataset: the importer must not read it.
    victim = tmp_path / "victim"
    shutil.copytree(dataset / "videos", victim / "videos")
    template = template.replace("ABSOLUTE", str(victim))
    info_path = dataset / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["video_path"] = template
    info_path.write_text(json.dumps(info))
    shutil.rmtree(dataset / "videos")  # only the victim holds the frames now
    argv = ["convert", "--from", "lerobot", str(dataset), str(tmp_path / "back")]
    _one_line_error(capsys, argv, "video_path", "meta/info.json")
    with pytest.raises(IncompatibleDatasetError, match="video_path"):
        rlds_writer.convert("lerobot", dataset, tmp_path / "back2")
    assert not (tmp_path / "back").exists() and not (tmp_path / "back2").exists()


def test_lerobot_import_refuses_a_video_feature_named_like_a_path(lerobot_video, tmp_path):
    dataset = tmp_path / "dataset"
    shutil.copytree(lerobot_video, dataset)
    info_path = dataset / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    key = next(k for k, f in info["features"].items() if f["dtype"] == "video")
    info["features"]["../../victim"] = info["features"].pop(key)
    info_path.write_text(json.dumps(info))
    with pytest.raises(IncompatibleDatasetError, match=r"video feature '\.\./\.\./victim'"):
        rlds_writer.convert("lerobot", dataset, tmp_path / "back")


# ------------------------------------------------------------ planted links


@pytest.fixture
def catch(tmp_path):
    path = tmp_path / "catch"
    crash_child.write_dataset(path, range(5))
    return path


def test_stats_cache_never_writes_through_a_link_at_its_temporary_name(catch, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    cache = catch / "dataset_statistics_train.json"
    # The name the cache's temporary file had (pid-based, predictable).
    (catch / f".{cache.name}.tmp-{os.getpid()}").symlink_to(victim)
    assert cli.main(["stats", str(catch), "--per-dimension", "--json"]) == 0
    capsys.readouterr()
    assert victim.read_text() == "precious"
    assert json.loads(cache.read_text())["num_trajectories"] == 5
    assert not [p for p in catch.iterdir() if layout.TEMP_FILE.match(p.name) and not p.is_symlink()]


def test_dataset_info_commit_never_writes_through_a_link_at_its_temporary_name(catch, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    backend = rlds_writer.TFDSBackendWriter(catch, crash_child.dataset_config(), mode="append")
    # Planted after the append's recovery (which clears temporary files), before the commit.
    (catch / f".{layout.DATASET_INFO}.tmp-{os.getpid()}").symlink_to(victim)
    for episode_id in (5, 6):
        crash_child.record_episode(backend, episode_id)
    backend.close()
    assert victim.read_text() == "precious"
    assert crash_child.check_records(catch) == list(range(7))


def test_index_cache_never_writes_through_a_link_at_its_temporary_name(catch, tmp_path):
    victim = tmp_path / "victim.npz"
    victim.write_bytes(b"precious")
    reader = rlds_writer.open_dataset(catch, index_cache="disk")
    shard = reader.shard_path("train", 0)
    index_dir = os.path.dirname(reader._shard("train", 0).cache_path)
    reader.close()
    os.makedirs(index_dir, exist_ok=True)
    cache = os.path.join(index_dir, os.path.basename(shard) + ".npz")
    os.symlink(victim, f"{cache}.tmp-{os.getpid()}")
    reader = rlds_writer.open_dataset(catch, index_cache="disk")
    assert reader.episodes("train")[2]["episode_id"] == 2  # random access saves the index
    reader.close()
    assert victim.read_bytes() == b"precious"
    assert os.path.isfile(cache) and not os.path.islink(cache)


def test_index_cache_directory_planted_as_a_link_is_not_used(catch, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    reader = rlds_writer.open_dataset(catch, index_cache="disk")
    index_dir = os.path.dirname(reader._shard("train", 0).cache_path)
    cache_name = os.path.basename(reader.shard_path("train", 0)) + ".npz"
    reader.close()
    victim = elsewhere / cache_name
    victim.write_bytes(b"precious")
    os.symlink(elsewhere, index_dir)
    reader = rlds_writer.open_dataset(catch, index_cache="disk")
    assert reader.episodes("train")[2]["episode_id"] == 2
    reader.close()
    assert victim.read_bytes() == b"precious" and sorted(os.listdir(elsewhere)) == [cache_name]


def test_exclusive_creation_refuses_any_link_even_a_dangling_one(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = tmp_path / ".file.json.tmp-1-0000000000000000"
    for target in (victim, tmp_path / "missing"):
        planted.symlink_to(target)
        with pytest.raises(FileExistsError):
            os.close(file_io.create_exclusive(planted))
        planted.unlink()
    assert victim.read_text() == "precious" and not (tmp_path / "missing").exists()
    file_io.atomic_write_text(tmp_path / "file.json", "new")
    assert (tmp_path / "file.json").read_text() == "new"


# ----------------------------------------------------------- stats cache


def test_stats_cache_with_the_right_fingerprint_but_no_fields_is_recomputed(catch, capsys):
    assert cli.main(["stats", str(catch), "--per-dimension", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    cache = catch / "dataset_statistics_train.json"
    fingerprint = json.loads(cache.read_text())["fingerprint"]
    for damaged in (
        {"fingerprint": fingerprint},
        {**expected, "observation": {"count": 3}},
        {**expected, "observation": {**expected["observation"], "mean": [1.0]}},
    ):
        cache.write_text(json.dumps(damaged))
        assert cli.main(["stats", str(catch), "--per-dimension"]) == 0
        assert "observation[0]" in capsys.readouterr().out
        assert json.loads(cache.read_text())["observation"] == expected["observation"]


# ----------------------------------------------------------- overlapping paths


def _overlaps(src: Path) -> list[tuple[str, Path]]:
    return [("is", src), ("is inside", src / "sub" / "out"), ("contains", src.parent)]


@pytest.mark.parametrize("target", ["hf", "rllib-episodes", "lerobot", "d3rlpy"])
def test_export_refuses_a_destination_overlapping_the_source(tmp_path, capsys, target):
    src = tmp_path / "work" / "catch"
    crash_child.write_dataset(src, range(3))
    before = _tree(tmp_path)
    for relation, dest in _overlaps(src):
        argv = ["export", "--to", target, str(src), str(dest)]
        _one_line_error(capsys, argv, f"the destination {relation} the source dataset")
        assert _tree(tmp_path) == before
    # Through a symbolic link to the source: the same directory.
    link = tmp_path / "link"
    link.symlink_to(src, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="the destination is the source"):
        rlds_writer.export(src, link, to=target)
    with pytest.raises(UnsafePathError, match="is inside"):
        rlds_writer.export(link, src / "x", to=target)
    link.unlink()
    assert _tree(tmp_path) == before


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    root = tmp_path / "minari_root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def test_export_to_minari_refuses_a_source_inside_the_minari_dataset(tmp_path, minari_root):
    src = minari_root / "ns" / "d-v0" / "rlds"
    crash_child.write_dataset(src, range(3))
    before = _tree(tmp_path)
    with pytest.raises(UnsafePathError, match="contains the source dataset"):
        rlds_writer.export(src, "ns/d-v0", to="minari")
    for bad in ("../x-v0", "/abs/x-v0", "ns/../../x-v0"):
        with pytest.raises(ValueError, match=f"{bad!r}.*Minari dataset id"):
            rlds_writer.export(src, bad, to="minari")
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("by", ["path", "id"])
def test_convert_refuses_a_destination_overlapping_the_source(tmp_path, minari_root, capsys, by):
    src = tmp_path / "catch"
    crash_child.write_dataset(src, range(3))
    rlds_writer.export(src, "ns/catch-v0", to="minari")
    dataset = minari_root / "ns" / "catch-v0"
    before = _tree(tmp_path)
    source = "ns/catch-v0" if by == "id" else str(dataset)
    for relation, dest in _overlaps(dataset):
        argv = ["convert", "--from", "minari", source, str(dest)]
        _one_line_error(capsys, argv, f"the destination {relation} the source")
        for mode in ("overwrite", "append"):
            with pytest.raises(UnsafePathError):
                rlds_writer.convert("minari", source, dest, mode=mode)
        assert _tree(tmp_path) == before
    assert (dataset / "data" / "metadata.json").is_file()
    # A file source (D4RL HDF5): a destination over it or its directory is refused too.
    h5py = pytest.importorskip("h5py")
    hdf5 = tmp_path / "d4rl" / "data.hdf5"
    hdf5.parent.mkdir()
    with h5py.File(hdf5, "w") as f:
        f["observations"] = np.zeros((3, 2), np.float32)
    before = _tree(tmp_path)
    for dest in (hdf5, hdf5.parent):
        with pytest.raises(UnsafePathError):
            rlds_writer.convert("d4rl-hdf5", hdf5, dest, mode="overwrite")
    assert _tree(tmp_path) == before
