"""`convert` as an Apache Beam pipeline (issue 25 item 5): the same dataset as one process."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("apache_beam")
tfds = pytest.importorskip("tensorflow_datasets")

from helpers_core import load_episodes, load_episodes_from_data_source  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer.cli.main import main  # noqa: E402
from rlds_writer.interop import beam_convert  # noqa: E402
from rlds_writer.store.formats import shards  # noqa: E402

CHECKOUT = Path(rlds_writer.__file__).resolve().parent.parent
IN_PROCESS = ["--runner=DirectRunner"]
MAPPING = [
    "observation/image=pixels",
    "observation/state=state",
    "action=actions",
    "reward=rewards",
    "terminated=terminals",
    "step/clock=clock",
    "episode/seed=seed",
]


def _episode(rng, n, seed):
    return {
        "pixels": rng.integers(0, 256, (n, 6, 5, 3), dtype=np.uint8),
        "state": rng.standard_normal((n, 3)),  # float64: kept as bytes
        "actions": rng.standard_normal((n - 1, 2)).astype(np.float32),
        "rewards": rng.standard_normal(n - 1).astype(np.float32),
        "terminals": np.array([False] * (n - 2) + [seed % 3 == 0]),
        "clock": np.arange(n, dtype=np.int64),
        "seed": np.int64(seed),
    }


def _episodes(count=11, seed=0):
    rng = np.random.default_rng(seed)
    return [_episode(rng, int(rng.integers(2, 9)), i) for i in range(count)]


def _write_npz(src, episodes):
    src.mkdir(parents=True)
    for i, episode in enumerate(episodes):
        np.savez(src / f"episode_{i}.npz", **episode)
    return src


def _write_hdf5(path, episodes):
    with h5py.File(path, "w") as f:
        for i, episode in enumerate(episodes):
            group = f.create_group(f"data/demo_{i}")
            for key, value in episode.items():
                group[key] = value
    return path


def _listed_records(path):
    """Every record of every split, in the order dataset_info.json lists the shards."""
    from rlds_writer.store.dataset import layout

    info = json.loads((path / "dataset_info.json").read_text())
    out = {}
    for split, template in layout.split_templates(info).items():
        lengths, _ = layout.read_splits(info)[split]
        records = []
        for index, n in enumerate(lengths):
            file = path / template.filename(index, len(lengths))
            got = list(shards.adapter(template.file_format).records(file))
            assert len(got) == n, file
            records.extend(got)
        out[split] = records
    return out


def assert_same_dataset(beam, single, per_file):
    """The Beam run wrote the single-process run's dataset: files, listing and episodes."""
    b_info = json.loads((beam / "dataset_info.json").read_text())
    s_info = json.loads((single / "dataset_info.json").read_text())
    b_splits, s_splits = b_info.pop("splits"), s_info.pop("splits")
    assert b_info == s_info
    for name in ("features.json", "metadata.json"):
        assert (beam / name).read_text() == (single / name).read_text(), name
    # Shards as TFDS's Beam writer names them, `max_episodes_per_file` each.
    total = sum(int(n) for n in s_splits[0]["shardLengths"])
    assert [s["name"] for s in b_splits] == [s["name"] for s in s_splits] == ["train"]
    lengths = [int(n) for n in b_splits[0]["shardLengths"]]
    assert lengths == [min(per_file, total - i) for i in range(0, total, per_file)]
    assert b_splits[0]["filepathTemplate"] == "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
    assert b_splits[0]["numBytes"] == s_splits[0]["numBytes"]
    fmt = b_info.get("fileFormat", "tfrecord")
    names = sorted(p.name for p in beam.iterdir() if f".{fmt}-" in p.name)
    n = len(lengths)
    assert names == [f"{b_info['name']}-train.{fmt}-{i:05d}-of-{n:05d}" for i in range(n)]
    assert sorted(p.name for p in beam.iterdir() if f".{fmt}-" not in p.name) == [
        "dataset_info.json",
        "features.json",
        "metadata.json",
    ]
    # Episode by episode, the same bytes: the same encoder, in the same order.
    assert _listed_records(beam) == _listed_records(single)
    # And TFDS itself loads both to the same values (array_record: as a data source).
    load = load_episodes if fmt == "tfrecord" else load_episodes_from_data_source
    got, want = load(beam), load(single)
    assert len(got) == len(want) == total
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert len(g["steps"]) == len(w["steps"])
        for gs, ws in zip(g["steps"], w["steps"], strict=True):
            assert gs.keys() == ws.keys()
            _assert_nested_equal(gs, ws)
        _assert_nested_equal({k: v for k, v in g.items() if k != "steps"}, w)


def _assert_nested_equal(got, want):
    for key, value in got.items():
        if isinstance(value, dict):
            _assert_nested_equal(value, want[key])
        elif key != "steps":
            np.testing.assert_array_equal(value, want[key], err_msg=key)


# ------------------------------------------------- two worker processes, from an install


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """This checkout installed as a package (pip), the only rlds_writer the workers see."""
    site = tmp_path_factory.mktemp("site")
    # Built from a copy: a build in the checkout would leave build/ there.
    copy = tmp_path_factory.mktemp("checkout")
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (CHECKOUT / name).exists():
            shutil.copy(CHECKOUT / name, copy / name)
    shutil.copytree(
        CHECKOUT / "rlds_writer", copy / "rlds_writer", ignore=shutil.ignore_patterns("__pycache__")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(copy),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return site


@pytest.fixture(scope="module")
def multi_processing_run(tmp_path_factory, installed):
    """One `rlds-writer convert` on DirectRunner multi_processing with 2 workers (~100 s)."""
    root = tmp_path_factory.mktemp("beam_mp")
    src = _write_npz(root / "npz", _episodes())
    dest = root / "beam"
    cwd = root / "elsewhere"  # not the checkout: rlds_writer is not importable from here
    cwd.mkdir()
    # Only the install: no checkout on the path of the driver or the workers.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(installed), TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [
        sys.executable,
        "-m",
        "rlds_writer",
        "convert",
        "--from",
        "npz-dir",
        str(src),
        str(dest),
        "--max-episodes-per-file=3",
        "--json",
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
        *(f"--map={m}" for m in MAPPING),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    return src, dest, proc


@pytest.mark.slow
def test_two_worker_processes_write_the_single_process_dataset(multi_processing_run, tmp_path):
    src, dest, proc = multi_processing_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The worker processes log through Beam's harness; nothing failed.
    assert "Traceback" not in proc.stderr and "rlds-writer convert: error" not in proc.stderr
    single = tmp_path / "single"
    report = rlds_writer.convert("npz-dir", src, single, mapping=MAPPING, max_episodes_per_file=3)
    assert_same_dataset(dest, single, per_file=3)
    got = json.loads(proc.stdout)
    assert got.pop("destination") == str(dest)
    want = report.to_dict()
    want.pop("destination")
    assert got == want
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.slow
def test_the_workers_ran_the_installed_copy_not_a_path_of_the_driver(multi_processing_run):
    """The workers of the run above could import rlds_writer only from the install."""
    _, _, proc = multi_processing_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Without the install on the path, the worker command line cannot import the
    # code under test from the run's working directory (what a worker falls back to).
    probe = subprocess.run(
        [sys.executable, "-c", "import rlds_writer.interop.beam_convert"],
        capture_output=True,
        text=True,
        cwd=multi_processing_run[1].parent / "elsewhere",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    installed_elsewhere = probe.returncode == 0
    if installed_elsewhere:  # e.g. `pip install -e .` of this checkout: also an install
        return
    assert "No module named" in probe.stderr


# ------------------------------------------------------------ in-process runner (quick)


@pytest.mark.slow  # several seconds of Beam
@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_hdf5_episode_groups_in_process_runner_match_one_process(tmp_path, file_format):
    if file_format == "array_record":
        pytest.importorskip("array_record")
    src = _write_hdf5(tmp_path / "demos.hdf5", _episodes(7, seed=1))
    options = {"mapping": MAPPING, "max_episodes_per_file": 2, "name": "demos"}
    options["file_format"] = file_format
    beam = beam_convert.convert("hdf5-episodes", src, tmp_path / "beam", IN_PROCESS, **options)
    single = rlds_writer.convert("hdf5-episodes", src, tmp_path / "single", **options)
    assert_same_dataset(tmp_path / "beam", tmp_path / "single", per_file=2)
    assert beam.to_dict() | {"destination": ""} == single.to_dict() | {"destination": ""}


def test_cli_options_and_per_dimension_stats(tmp_path, capsys):
    src = _write_npz(tmp_path / "npz", _episodes(5, seed=2))
    dest = tmp_path / "ds"
    argv = ["convert", "--from", "npz-dir", str(src), str(dest), "--name", "arm"]
    maps = [f"--map={m}" for m in MAPPING]
    pipeline = ["--beam_pipeline_options", "direct_num_workers=1,direct_running_mode=in_memory"]
    assert main([*argv, *maps, *pipeline]) == 0
    out, err = capsys.readouterr()
    assert "5 episodes" in out
    assert err == ""  # quiet, as every command (Beam's import notice held back)
    assert main([*argv[:4], str(tmp_path / "one"), "--name", "arm", *maps]) == 0
    assert_same_dataset(dest, tmp_path / "one", per_file=1000)
    capsys.readouterr()
    # stats --per-dimension on the runner: the single-process numbers.
    assert main(["stats", str(dest), "--per-dimension", "--json", "--runner=DirectRunner"]) == 0
    beam_stats = json.loads(capsys.readouterr().out)
    assert main(["stats", str(tmp_path / "one"), "--per-dimension", "--json"]) == 0
    one_stats = json.loads(capsys.readouterr().out)
    assert beam_stats["num_transitions"] == one_stats["num_transitions"] > 0
    for name in ("action", "reward", "observation/state"):
        for key in ("count", "min", "max", "q01", "q99"):
            assert beam_stats[name][key] == one_stats[name][key], (name, key)
        np.testing.assert_allclose(beam_stats[name]["mean"], one_stats[name]["mean"], rtol=1e-12)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--from", "npz-dir", "--mode", "append", "--runner=DirectRunner"], "rlds-writer merge"),
        (["--from", "npz-dir", "--beam_pipeline_options", "=x"], "is not KEY=VALUE"),
    ],
)
def test_what_does_not_run_on_beam_is_one_line(tmp_path, capsys, argv, match):
    src = _write_npz(tmp_path / "npz", _episodes(2))
    assert main(["convert", *argv, str(src), str(tmp_path / "ds")]) != 0
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "ds").exists()


def test_stats_refuses_beam_options_without_per_dimension(tmp_path, capsys):
    src = _write_npz(tmp_path / "npz", _episodes(2))
    rlds_writer.convert("npz-dir", src, tmp_path / "ds", mapping=MAPPING)
    assert main(["stats", str(tmp_path / "ds"), "--runner=DirectRunner"]) != 0
    assert "--per-dimension only" in capsys.readouterr().err


def _split_finely(monkeypatch, source_format):
    """One source episode per work item, so that a small source makes several."""
    splitter = dataclasses.replace(beam_convert.SPLITTERS[source_format], per_item=1)
    monkeypatch.setitem(beam_convert.SPLITTERS, source_format, splitter)


def _same_run(tmp_path, source_format, src, **options):
    """Converts `src` on the in-process runner and in one process; checks they agree."""
    beam = beam_convert.convert(source_format, src, tmp_path / "beam", IN_PROCESS, **options)
    single = rlds_writer.convert(source_format, src, tmp_path / "single", **options)
    per_file = options.get("max_episodes_per_file", 1000)
    assert_same_dataset(tmp_path / "beam", tmp_path / "single", per_file=per_file)
    assert beam.to_dict() | {"destination": ""} == single.to_dict() | {"destination": ""}
    return beam


@pytest.mark.slow  # several seconds of Beam
def test_d4rl_row_ranges_split_into_work_items(tmp_path, monkeypatch):
    _split_finely(monkeypatch, "d4rl-hdf5")
    rng = np.random.default_rng(6)
    n = 40
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    terminals[[4, 17]] = True
    timeouts[[9, 25, 31]] = True  # and a trailing partial episode (rows 32-39)
    src = tmp_path / "toy-v2.hdf5"
    with h5py.File(src, "w") as f:
        f["observations"] = rng.normal(size=(n, 3)).astype(np.float32)
        f["next_observations"] = rng.normal(size=(n, 3)).astype(np.float32)
        f["actions"] = rng.normal(size=(n, 2)).astype(np.float32)
        f["rewards"] = rng.normal(size=n).astype(np.float32)
        f["terminals"], f["timeouts"] = terminals, timeouts
        f["infos/qpos"] = rng.normal(size=(n, 4))
        f["metadata/algorithm"] = "SAC"
    report = _same_run(tmp_path, "d4rl-hdf5", src, max_episodes_per_file=2)
    assert report.episodes == 6 and report.notes  # the partial episode's note is kept
    report = _same_run(tmp_path / "drop", "d4rl-hdf5", src, drop_partial=True)
    assert report.episodes == 5


@pytest.mark.slow  # several seconds of Beam
def test_rllib_episode_files_split_into_work_items(tmp_path):
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("ray.rllib")
    msgpack = pytest.importorskip("msgpack")
    msgpack_numpy = pytest.importorskip("msgpack_numpy")
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    def episode(seed):
        env = gym.make("CartPole-v1", max_episode_steps=6)
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        e = SingleAgentEpisode(
            observation_space=env.observation_space, action_space=env.action_space
        )
        e.add_env_reset(observation=obs, infos={"source": "reset"} if seed else {})
        done, t = False, 0
        while not done:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            t += 1
            info = {"t": t} if seed != 2 else {"t": t, "rare": np.float32(t)}  # one file only
            e.add_env_step(
                obs, action, reward, infos=info, terminated=terminated, truncated=truncated
            )
            done = terminated or truncated
        return e

    src = tmp_path / "out" / "cartpole"
    for run, seeds in enumerate(([0, 1], [2], [3, 4])):
        path = src / f"run-{run}" / "a_000000-0.parquet"
        path.parent.mkdir(parents=True)
        items = [msgpack.packb(episode(s).get_state(), default=msgpack_numpy.encode) for s in seeds]
        pq.write_table(pa.table({"item": items}), path)
    report = _same_run(tmp_path, "rllib-episodes", tmp_path / "out", max_episodes_per_file=2)
    assert report.episodes == 5


def test_minari_episodes_split_into_work_items(tmp_path, monkeypatch):
    gym = pytest.importorskip("gymnasium")
    minari = pytest.importorskip("minari")
    pytest.importorskip("jax")  # Minari's DataCollector needs it (minari[create])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari_root"))
    _split_finely(monkeypatch, "minari")
    env = minari.DataCollector(gym.make("CartPole-v1", max_episode_steps=9), data_format="hdf5")
    env.action_space.seed(0)
    for seed in range(5):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.create_dataset(
        "cartpole/beam-v0",
        algorithm_name="random",
        author="tests",
        author_email="tests@example.com",
        code_permalink="https://example.com/code",
        eval_env=gym.make("CartPole-v1", max_episode_steps=9).spec,
        description="five",
    )
    env.close()
    report = _same_run(tmp_path, "minari", "cartpole/beam-v0", max_episodes_per_file=2)
    assert report.episodes == 5


def _split_lerobot_file(src, rows_in_first):
    """Puts the frames of the one data file into two files, the first `rows_in_first` first."""
    import pyarrow.parquet as pq

    data = src / "data" / "chunk-000"
    table = pq.read_table(data / "file-000.parquet")
    pq.write_table(table.slice(0, rows_in_first), data / "file-000.parquet")
    pq.write_table(table.slice(rows_in_first), data / "file-001.parquet")


@pytest.mark.parametrize("rows_in_first", [3, 4], ids=["an_episode_a_file", "episode_1_spans"])
def test_lerobot_data_files_split_into_work_items(tmp_path, rows_in_first):
    """A work item per data file; files that continue an episode stay together."""
    from hostile_sources import lerobot_dir

    src = lerobot_dir(tmp_path / "lerobot")  # 2 episodes of 3 frames
    _split_lerobot_file(src, rows_in_first)
    units = beam_convert.SPLITTERS["lerobot"].units(str(src), {})
    joined = [["chunk-000/file-000.parquet", "chunk-000/file-001.parquet"]]
    assert units == ([[u] for u in joined[0]] if rows_in_first == 3 else joined)
    report = _same_run(tmp_path, "lerobot", src, max_episodes_per_file=1)
    assert (report.episodes, report.steps) == (2, 6)


# ------------------------------------------------------------------- failures


def _bad_rows_episode(tmp_path, episodes):
    """An episode whose schema scans but which cannot be aligned (5 observations, 2 rewards)."""
    bad = dict(episodes[0], rewards=episodes[0]["rewards"][:0].tolist() + [1.0, 2.0])
    bad["rewards"] = np.asarray(bad["rewards"], np.float32)
    bad["pixels"] = bad["pixels"][:1].repeat(5, axis=0)
    bad["state"] = bad["state"][:1].repeat(5, axis=0)
    bad["clock"] = np.arange(5, dtype=np.int64)
    bad["actions"] = bad["actions"][:1].repeat(2, axis=0)
    return bad


@pytest.mark.slow  # several seconds of Beam
def test_a_failing_work_item_leaves_nothing_listed_and_the_old_dataset_whole(tmp_path, capsys):
    """Shards of the good items are written, then one item fails: DEST never lists them."""
    episodes = _episodes(6, seed=4)
    src = _write_npz(tmp_path / "npz", episodes)
    dest = tmp_path / "ds"
    # An existing dataset, to be replaced by --mode overwrite.
    rlds_writer.convert("npz-dir", src, dest, mapping=MAPPING, max_episodes_per_file=2)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    np.savez(src / "episode_9.npz", **_bad_rows_episode(tmp_path, episodes))
    argv = ["convert", "--from", "npz-dir", str(src), str(dest), "--mode", "overwrite"]
    opts = ["--max-episodes-per-file=1", "--runner=DirectRunner", *(f"--map={m}" for m in MAPPING)]
    assert main([*argv, *opts]) != 0
    err = capsys.readouterr().err
    assert "must have 4 or 5 rewards, got 2" in err and len(err.strip().splitlines()) == 1, err
    # The same words as the single-process conversion.
    single = tmp_path / "single"
    assert main(["convert", "--from", "npz-dir", str(src), str(single), *opts[:1], *opts[2:]]) != 0
    assert capsys.readouterr().err == err
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging
    # Into a new directory: nothing at all.
    assert main([*argv[:4], str(tmp_path / "new"), *opts]) != 0
    assert not (tmp_path / "new").exists()
    # Once the source is mended, the overwrite replaces every file of the old dataset.
    (src / "episode_9.npz").unlink()
    (dest / "notes.txt").write_text("not ours")  # left alone, as by the writer's overwrite
    assert main([*argv, *opts]) == 0
    (dest / "notes.txt").unlink()
    rlds_writer.convert(
        "npz-dir", src, tmp_path / "fresh", mapping=MAPPING, max_episodes_per_file=1
    )
    assert_same_dataset(dest, tmp_path / "fresh", per_file=1)


@pytest.mark.slow  # several seconds of Beam
def test_a_killed_driver_leaves_no_dataset_and_a_rerun_succeeds(tmp_path, capsys):
    src = _write_npz(tmp_path / "npz", _episodes(24, seed=5))
    dest = tmp_path / "ds"
    cmd = [
        sys.executable,
        "-m",
        "rlds_writer",
        "convert",
        "--from",
        "npz-dir",
        str(src),
        str(dest),
        "--runner=DirectRunner",
        *(f"--map={m}" for m in MAPPING),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # The staging directory exists from before the pipeline starts to the final rename.
        while proc.poll() is None and not any(p.name.startswith(".ds") for p in tmp_path.iterdir()):
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not (dest / "dataset_info.json").exists()
    assert not dest.exists()
    capsys.readouterr()
    assert main([*cmd[3:]]) == 0  # a stale staging directory is no obstacle, and is named
    assert "1 unfinished conversion to this destination" in capsys.readouterr().out
    assert len(load_episodes(dest)) == 24


_WITHOUT_BEAM = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "apache_beam":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Blocker())
from rlds_writer.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_without_beam_the_options_are_one_line_naming_the_extra(tmp_path):
    src = _write_npz(tmp_path / "npz", _episodes(2))
    argv = ["convert", "--from", "npz-dir", str(src), str(tmp_path / "ds"), "--runner=DirectRunner"]
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_BEAM, *argv], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "rlds-writer convert: error: running as a Beam pipeline needs apache_beam, which is not "
        'installed: pip install "rlds_writer[beam]"'
    ]
    assert not (tmp_path / "ds").exists()
