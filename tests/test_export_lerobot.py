"""`rlds-writer export --to lerobot` and `convert --from lerobot`.

LeRobot cannot be installed beside rlds_writer (it pins torch<2.11,
datasets<5, huggingface-hub<0.36), so these tests check the export against
the rules LeRobot 0.4.4's loader applies (`lerobot.datasets.utils`,
`lerobot_dataset.py`, `compute_stats.py`): info.json keys and types, the
Parquet columns loaded through `datasets` with the features LeRobot builds from
info.json, episode boundaries, statistics. `test_real_lerobot_loader_*` runs
LeRobot's own `LeRobotDataset` in another Python when `RLDS_LEROBOT_PYTHON`
points at one (docs/sharing.md says how to make it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

from consumer_venv import run_consumer  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402
from rlds_writer.read.nest import flatten  # noqa: E402

INFO_TYPES = {
    "codebase_version": str,
    "robot_type": (str, type(None)),
    "total_episodes": int,
    "total_frames": int,
    "total_tasks": int,
    "chunks_size": int,
    "data_files_size_in_mb": (int, float),
    "video_files_size_in_mb": (int, float),
    "fps": int,
    "splits": dict,
    "data_path": str,
    "video_path": (str, type(None)),
    "features": dict,
}
STATS = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}


class _Camera(gym.Env):
    """A dict observation with an RGB camera; terminates after 4 steps."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "rgb": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        }
    )
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def _obs(self):
        return {
            "pos": self.pos.copy(),
            "rgb": self.np_random.integers(0, 256, (16, 16, 3), np.uint8),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2, np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos += action
        self.t += 1
        return self._obs(), float(self.t), self.t >= 4, False, {"pole": np.float32(self.t / 2)}


def _record(path, episodes=4, cut_at=1):
    """Terminated episodes, one truncated by a time limit, then one cut short by close()."""
    env = rlds_writer.RecordRLDS(
        gym.wrappers.TimeLimit(_Camera(), max_episode_steps=3 if episodes > 2 else 10),
        path,
        step_fn=lambda o, a, r, te, tr, info: {
            "info": {"pole": np.float32(info.get("pole", 0.0))},
            "language_instruction": "reach" if o["pos"][0] < 0.5 else "hold",
        },
        episode_fn=lambda o, a, r, te, tr, info: {"label": "demo"},
    )
    env.action_space.seed(0)
    for episode in range(episodes):
        if episode == 1:
            env.env._max_episode_steps = 10  # episodes after the first terminate
        env.reset(seed=episode)
        for t in range(10):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated or (episode == episodes - 1 and t == cut_at):
                break
    env.close()
    return Path(path)


def _run_lerobot(*args: str, cwd: Path) -> str:
    """Runs LeRobot's venv python (RLDS_LEROBOT_PYTHON); fails with its output if it fails."""
    python = Path(os.path.abspath(os.environ["RLDS_LEROBOT_PYTHON"]))
    return run_consumer(python, *args, cwd=cwd, timeout=600)


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def camera(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("lerobot") / "rlds")


def _hf_features(features):
    """The `datasets.Features` LeRobot 0.4.4 makes from info.json."""
    datasets = pytest.importorskip("datasets")
    out = {}
    for key, ft in features.items():
        shape = tuple(ft["shape"])
        if ft["dtype"] == "image":
            out[key] = datasets.Image()
        elif shape == (1,):
            out[key] = datasets.Value(ft["dtype"])
        elif len(shape) == 1:
            out[key] = datasets.List(datasets.Value(ft["dtype"]), length=shape[0])
        else:
            out[key] = getattr(datasets, f"Array{len(shape)}D")(shape=shape, dtype=ft["dtype"])
    return datasets.Features(out)


def _data_rows(dest):
    files = sorted((dest / "data").glob("*/*.parquet"))
    return files, pa.concat_tables([pq.read_table(f) for f in files])


def _episodes_meta(dest):
    files = sorted((dest / "meta" / "episodes").glob("*/*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def test_export_follows_lerobot_v3_schema_and_matches_the_rlds_transitions(camera, tmp_path):
    dest = tmp_path / "lerobot"
    code = cli.main(
        [
            "export",
            "--to",
            "lerobot",
            str(camera),
            str(dest),
            "--task-field",
            "language_instruction",
        ]
    )
    assert code == 0
    info = json.loads((dest / "meta" / "info.json").read_text())
    for key, kind in INFO_TYPES.items():
        assert isinstance(info[key], kind), key
    assert info["codebase_version"] == "v3.0" and info["fps"] == 10
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["splits"] == {"train": f"0:{info['total_episodes']}"}
    features = info["features"]
    assert features["observation.images.rgb"] == {
        "dtype": "image",
        "shape": [16, 16, 3],
        "names": ["height", "width", "channels"],
    }
    assert features["observation.pos"]["shape"] == [2] and features["next.reward"]["shape"] == [1]
    for name in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert name in features
    assert all("/" not in k and {"dtype", "shape", "names"} <= set(v) for k, v in features.items())
    assert "complementary_info.language_instruction" not in features  # it is the task

    # The data loads through `datasets` with the features LeRobot builds (as LeRobot loads it).
    datasets = pytest.importorskip("datasets")
    files, table = _data_rows(dest)
    assert set(table.column_names) == set(features)
    loaded = datasets.Dataset.from_parquet(
        [str(f) for f in files], features=_hf_features(features), cache_dir=str(tmp_path / "c")
    )
    assert len(loaded) == info["total_frames"] == table.num_rows
    np.testing.assert_array_equal(loaded["index"], np.arange(table.num_rows))

    reader = rlds_writer.open_dataset(camera)
    q = reader.episodes("train").qlearning_dataset(step_metadata=True)
    np.testing.assert_array_equal(np.asarray(loaded["episode_index"]), q["episode_ids"])
    np.testing.assert_array_equal(np.asarray(loaded["action"], np.float32), q["actions"])
    np.testing.assert_array_equal(np.asarray(loaded["next.reward"], np.float32), q["rewards"])
    np.testing.assert_array_equal(np.asarray(loaded["next.done"]), q["terminals"])
    np.testing.assert_array_equal(np.asarray(loaded["next.truncated"]), q["timeouts"])
    np.testing.assert_array_equal(
        np.asarray(loaded["observation.pos"], np.float32), q["observations"]["pos"]
    )
    np.testing.assert_array_equal(
        np.asarray(loaded[3]["observation.images.rgb"]), q["observations"]["rgb"][3]
    )
    np.testing.assert_array_equal(
        np.asarray(loaded["complementary_info.info.pole"], np.float32),
        q["step_metadata"]["info"]["pole"],
    )
    frame_index = np.asarray(loaded["frame_index"])
    np.testing.assert_allclose(np.asarray(loaded["timestamp"]), frame_index / 10, rtol=1e-6)

    # Tasks: a pandas frame indexed by the text (LeRobot's tasks.loc[task].task_index).
    tasks = pd.read_parquet(dest / "meta" / "tasks.parquet")
    texts = [t.decode() for t in q["step_metadata"]["language_instruction"]]
    assert [tasks.iloc[i].name for i in loaded["task_index"]] == texts
    assert int(tasks.loc["reach"].task_index) == list(tasks.index).index("reach")
    assert info["total_tasks"] == len(tasks) == 2

    # meta/episodes: boundaries match the data rows and files.
    meta = _episodes_meta(dest)
    assert [m["episode_index"] for m in meta] == list(range(info["total_episodes"]))
    for m in meta:
        rows = np.flatnonzero(np.asarray(loaded["episode_index"]) == m["episode_index"])
        assert (m["dataset_from_index"], m["dataset_to_index"]) == (rows[0], rows[-1] + 1)
        assert m["length"] == len(rows) and np.array_equal(frame_index[rows], np.arange(len(rows)))
        assert (m["data/chunk_index"], m["data/file_index"]) == (0, 0)
        assert set(m["tasks"]) == {texts[r] for r in rows}
    assert [m["rlds/end_reason"] for m in meta] == [
        "truncated",
        "terminated",
        "terminated",
        "cut_short",
    ]

    # stats.json: every non-text feature, LeRobot's keys and shapes, values of the frames.
    stats = json.loads((dest / "meta" / "stats.json").read_text())
    assert set(stats) == {k for k, v in features.items() if v["dtype"] != "string"}
    for key, values in stats.items():
        assert set(values) == STATS, key
        assert np.shape(values["count"]) == (1,)
    assert np.shape(stats["observation.images.rgb"]["mean"]) == (3, 1, 1)
    assert np.shape(stats["observation.pos"]["mean"]) == (2,)
    assert np.shape(stats["next.reward"]["mean"]) == (1,)
    np.testing.assert_allclose(stats["observation.pos"]["mean"], q["observations"]["pos"].mean(0))
    np.testing.assert_allclose(stats["observation.pos"]["std"], q["observations"]["pos"].std(0))
    np.testing.assert_allclose(stats["action"]["min"], q["actions"].min(0))
    assert stats["index"]["count"] == [table.num_rows]
    for m in meta:  # per-episode statistics, as LeRobot's meta/episodes keeps them
        rows = slice(m["dataset_from_index"], m["dataset_to_index"])
        np.testing.assert_allclose(
            m["stats/action/mean"], q["actions"][rows].astype(np.float64).mean(0)
        )
        assert m["stats/action/count"] == [m["length"]]


def test_convert_back_restores_every_value_and_flag(camera, tmp_path, capsys):
    rlds_writer.export(
        camera, tmp_path / "lerobot", to="lerobot", task_field="language_instruction"
    )
    assert (
        cli.main(
            ["convert", "--from", "lerobot", str(tmp_path / "lerobot"), str(tmp_path / "back")]
        )
        == 0
    )
    assert "4 episodes" in capsys.readouterr().out
    _assert_same(camera, tmp_path / "back")


def _assert_same(original, restored):
    a = rlds_writer.open_dataset(original)
    b = rlds_writer.open_dataset(restored)
    kinds = {leaf.key: (leaf.class_name, leaf.describe()) for leaf in b.features.leaves}
    for leaf in a.features.leaves:
        assert kinds[leaf.key] == (leaf.class_name, leaf.describe()), leaf.key
    assert b.metadata["action_space"] == a.metadata["action_space"]
    pairs = list(zip(a.episodes("train"), b.episodes("train"), strict=True))
    assert pairs
    for x, y in pairs:
        restored_fields = dict(flatten(y))
        for path, value in flatten(x):
            np.testing.assert_array_equal(restored_fields[path], value, err_msg=str(path))
            assert np.asarray(restored_fields[path]).dtype == np.asarray(value).dtype, path
        if "discount" not in x["steps"]:  # a discount is added, as the recorders write it
            expected = np.ones(len(y["steps"]["reward"]), np.float32)
            expected[-1] = 0.0
            if y["steps"]["is_terminal"][-1]:
                expected[-2] = 0.0
            np.testing.assert_array_equal(y["steps"]["discount"], expected)


def test_files_roll_by_size_into_chunks_and_still_round_trip(camera, tmp_path):
    dest = tmp_path / "lerobot"
    rlds_writer.interop.export.export_lerobot(
        camera, dest, data_files_size_in_mb=0.000001, chunks_size=2
    )
    files, table = _data_rows(dest)
    assert [f.relative_to(dest).as_posix() for f in files] == [
        "data/chunk-000/file-000.parquet",
        "data/chunk-000/file-001.parquet",
        "data/chunk-001/file-000.parquet",
        "data/chunk-001/file-001.parquet",
    ]
    np.testing.assert_array_equal(table.column("index").to_numpy(), np.arange(table.num_rows))
    for m, file in zip(_episodes_meta(dest), files, strict=True):
        rows = pq.read_table(file)
        assert rows.column("episode_index").to_pylist() == [m["episode_index"]] * m["length"]
        assert file.relative_to(dest).as_posix() == json.loads(
            (dest / "meta" / "info.json").read_text()
        )["data_path"].format(chunk_index=m["data/chunk_index"], file_index=m["data/file_index"])
        assert rows.column("index")[0].as_py() == m["dataset_from_index"]
    rlds_writer.convert("lerobot", dest, tmp_path / "back")
    _assert_same(camera, tmp_path / "back")


def test_episodes_share_row_groups_so_files_stay_small(camera, tmp_path):
    # One row group per episode kept every group's footer entry in memory and
    # bloated meta/episodes (33 MB for 1,000 Catch episodes).
    dest = tmp_path / "lerobot"
    rlds_writer.interop.export.export_lerobot(camera, dest)
    files = sorted((dest / "data").rglob("*.parquet")) + sorted(
        (dest / "meta" / "episodes").rglob("*.parquet")
    )
    assert len(files) == 2
    assert len(_episodes_meta(dest)) > 1
    for file in files:
        assert pq.ParquetFile(file).num_row_groups == 1


def test_constant_or_episode_task_and_dropped_cut_short_episodes(camera, tmp_path):
    report = rlds_writer.interop.export.export_lerobot(
        camera, tmp_path / "a", task="pick", cut_short="drop", fps=30
    )
    assert (report.episodes, report.skipped, report.cut_short) == (3, 1, 1)
    tasks = pd.read_parquet(tmp_path / "a" / "meta" / "tasks.parquet")
    assert list(tasks.index) == ["pick"]
    info = json.loads((tmp_path / "a" / "meta" / "info.json").read_text())
    assert info["fps"] == 30 and info["total_episodes"] == 3
    assert "complementary_info.language_instruction" in info["features"]

    rlds_writer.interop.export.export_lerobot(camera, tmp_path / "b", task_field="label")
    tasks = pd.read_parquet(tmp_path / "b" / "meta" / "tasks.parquet")
    assert list(tasks.index) == ["demo"]
    rlds_writer.convert("lerobot", tmp_path / "b", tmp_path / "back")
    _assert_same(camera, tmp_path / "back")


def test_a_lerobot_dataset_of_another_writer_becomes_one_step_per_frame(camera, tmp_path):
    dest = tmp_path / "lerobot"
    rlds_writer.interop.export.export_lerobot(camera, dest, task_field="language_instruction")
    (dest / "meta" / "rlds_writer.json").unlink()  # as LeRobot itself would have written it
    report = rlds_writer.convert("lerobot", dest, tmp_path / "back")
    original = list(rlds_writer.open_dataset(camera).episodes("train"))
    restored = list(rlds_writer.open_dataset(tmp_path / "back").episodes("train"))
    assert report.episodes == len(restored) == len(original)
    for x, y in zip(original, restored, strict=True):
        xs, ys = x["steps"], y["steps"]
        n = len(xs["reward"]) - 1  # frames: the RLDS final step is not one
        assert len(ys["reward"]) == n and ys["is_last"][-1] and ys["is_first"][0]
        np.testing.assert_array_equal(ys["observation"]["pos"], xs["observation"]["pos"][:n])
        np.testing.assert_array_equal(
            ys["observation"]["images"]["rgb"], xs["observation"]["rgb"][:n]
        )
        np.testing.assert_array_equal(ys["action"], xs["action"][:n])
        np.testing.assert_array_equal(ys["reward"], xs["reward"][:n])
        np.testing.assert_array_equal(ys["language_instruction"], xs["language_instruction"][:n])
        np.testing.assert_array_equal(
            ys["complementary_info"]["info"]["pole"], xs["info"]["pole"][:n]
        )
        assert bool(ys["is_terminal"][-1]) == bool(xs["is_terminal"][-1])


def _one_line_error(capsys, argv, expected):
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_bad_input_gets_one_line_errors(camera, tmp_path, capsys):
    src, dest = str(camera), tmp_path / "out"
    dest.mkdir()
    (dest / "x").write_text("")
    _one_line_error(capsys, ["export", "--to", "lerobot", src, str(dest)], "not an empty directory")
    new = str(tmp_path / "new")
    _one_line_error(
        capsys,
        ["export", "--to", "lerobot", src, new, "--task-field", "nope"],
        "language_instruction",
    )
    _one_line_error(capsys, ["export", "--to", "lerobot", src, new, "--fps", "0"], "fps")
    _one_line_error(capsys, ["export", "--to", "hf", src, new, "--video"], "--to lerobot only")
    _one_line_error(capsys, ["export", "--to", "hf", src, new, "--fps", "5"], "--to lerobot only")
    _one_line_error(capsys, ["export", "--to", "lerobot", src, new, "--split", "test"], "no split")
    assert not Path(new).exists()
    _one_line_error(capsys, ["convert", "--from", "lerobot", src, new], "not a LeRobot dataset")

    lerobot = tmp_path / "lerobot"
    rlds_writer.interop.export.export_lerobot(camera, lerobot)
    info_path = lerobot / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    _one_line_error(capsys, ["convert", "--from", "lerobot", str(lerobot), new], "v2.1")
    (lerobot / "meta" / "rlds_writer.json").unlink()  # as another writer's dataset
    video = {"dtype": "video", "shape": [16, 16, 3], "names": None}
    info_path.write_text(json.dumps({**info, "features": {**info["features"], "cam": video}}))
    _one_line_error(capsys, ["convert", "--from", "lerobot", str(lerobot), new], "video")
    info_path.write_text("{not json")
    _one_line_error(capsys, ["convert", "--from", "lerobot", str(lerobot), new], "info.json")
    info_path.write_text(json.dumps(info))
    episodes = lerobot / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(episodes)
    lengths = pa.array([n + 1 for n in table.column("length").to_pylist()], pa.int64())
    pq.write_table(
        table.set_column(table.column_names.index("length"), "length", lengths), episodes
    )
    _one_line_error(capsys, ["convert", "--from", "lerobot", str(lerobot), new], "meta/episodes")


_LEROBOT_SCRIPT = """
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root = sys.argv[1]
ds = LeRobotDataset("rlds/camera", root=root)
fps = ds.fps
shifted = LeRobotDataset("rlds/camera", root=root, delta_timestamps={"action": [0, 1 / fps]})
frames = []
for i in range(len(ds)):
    item = ds[i]
    frames.append({
        "pos": item["observation.pos"].tolist(),
        "rgb": (item["observation.images.rgb"] * 255).round().to(int).tolist(),
        "action": item["action"].tolist(),
        "reward": float(item["next.reward"]),
        "done": bool(item["next.done"]),
        "truncated": bool(item["next.truncated"]),
        "episode_index": int(item["episode_index"]),
        "task": item["task"],
        "next_action_is_pad": shifted[i]["action_is_pad"].tolist(),
    })
# LeRobot's own aggregation (and its shape checks) of the per-episode statistics.
from lerobot.datasets.compute_stats import aggregate_stats
from lerobot.datasets.utils import dataset_to_policy_features, unflatten_dict

import glob
import pyarrow.parquet as pq

# LeRobot's load_episodes leaves the stats/ columns out; read them as its aggregation tools do.
rows = [r for f in sorted(glob.glob(root + "/meta/episodes/*/*.parquet"))
        for r in pq.read_table(f).to_pylist()]
episode_stats = [
    unflatten_dict({k[6:]: np.array(v) for k, v in row.items() if k.startswith("stats/")})
    for row in rows
]
aggregated = aggregate_stats(episode_stats)
gap = max(
    float(np.max(np.abs(np.asarray(aggregated[k][s], float) - np.asarray(v, float))))
    for k, stats in ds.meta.stats.items() for s, v in stats.items()
)
policy = {k: v.type.name for k, v in dataset_to_policy_features(ds.meta.features).items()}
print(json.dumps({
    "len": len(ds), "num_episodes": ds.num_episodes, "fps": fps,
    "camera_keys": ds.meta.camera_keys, "stats": sorted(ds.meta.stats), "frames": frames,
    "stats_gap": gap, "policy": policy,
}))
"""


@pytest.mark.skipif(
    not os.environ.get("RLDS_LEROBOT_PYTHON"),
    reason="set RLDS_LEROBOT_PYTHON to a python with lerobot 0.4.4 (docs/sharing.md)",
)
def test_real_lerobot_loader_opens_the_export_with_the_rlds_values(camera, tmp_path):
    dest = tmp_path / "lerobot"
    rlds_writer.interop.export.export_lerobot(camera, dest, task_field="language_instruction")
    out = _last_json(_run_lerobot("-c", _LEROBOT_SCRIPT, str(dest), cwd=tmp_path))
    q = rlds_writer.open_dataset(camera).episodes("train").qlearning_dataset(step_metadata=True)
    frames = out["frames"]
    assert out["len"] == len(q["rewards"]) == len(frames) and out["num_episodes"] == 4
    assert out["camera_keys"] == ["observation.images.rgb"] and "action" in out["stats"]
    assert out["stats_gap"] < 1e-9  # LeRobot's aggregate of our per-episode stats is stats.json
    assert out["policy"] == {
        "action": "ACTION",
        "observation.pos": "STATE",
        "observation.images.rgb": "VISUAL",
    }
    np.testing.assert_array_equal([f["pos"] for f in frames], q["observations"]["pos"])
    np.testing.assert_array_equal(
        np.array([f["rgb"] for f in frames]).transpose(0, 2, 3, 1), q["observations"]["rgb"]
    )
    np.testing.assert_array_equal(np.float32([f["action"] for f in frames]), q["actions"])
    np.testing.assert_array_equal(np.float32([f["reward"] for f in frames]), q["rewards"])
    np.testing.assert_array_equal([f["done"] for f in frames], q["terminals"])
    np.testing.assert_array_equal([f["truncated"] for f in frames], q["timeouts"])
    np.testing.assert_array_equal([f["episode_index"] for f in frames], q["episode_ids"])
    texts = [t.decode() for t in q["step_metadata"]["language_instruction"]]
    assert [f["task"] for f in frames] == texts
    # LeRobot pads the action one frame ahead exactly at the last frame of each episode.
    last = np.append(q["episode_ids"][1:] != q["episode_ids"][:-1], True)
    np.testing.assert_array_equal([f["next_action_is_pad"][1] for f in frames], last)
    print(f"LeRobot loaded {out['len']} frames of {out['num_episodes']} episodes", file=sys.stderr)


class _Smooth(_Camera):
    """Flat-colour frames that change a lot from step to step (video stays close to them)."""

    def _obs(self):
        level = (37 * self.t + 20 * int(self.np_random.integers(0, 3))) % 200 + 20
        rgb = np.zeros((16, 16, 3), np.uint8) + np.uint8([level, 255 - level, 128])
        return {"pos": self.pos.copy(), "rgb": rgb}


@pytest.fixture(scope="module")
def smooth(tmp_path_factory):
    path = tmp_path_factory.mktemp("smooth") / "rlds"
    env = rlds_writer.RecordRLDS(_Smooth(), path)
    env.action_space.seed(0)
    for episode in range(3):
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.close()
    return path


def test_video_export_writes_mp4_cameras_lerobot_locates_by_timestamp(smooth, tmp_path, capsys):
    av = pytest.importorskip("av")
    dest = tmp_path / "lerobot"
    assert cli.main(["export", "--to", "lerobot", str(smooth), str(dest), "--video"]) == 0
    info = json.loads((dest / "meta" / "info.json").read_text())
    camera = info["features"]["observation.images.rgb"]
    assert camera["dtype"] == "video" and camera["info"]["video.fps"] == info["fps"] == 10
    assert (
        info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    _, table = _data_rows(dest)
    assert "observation.images.rgb" not in table.column_names  # frames live in the MP4
    meta = _episodes_meta(dest)
    q = rlds_writer.open_dataset(smooth).episodes("train").qlearning_dataset()
    path = dest / info["video_path"].format(
        video_key="observation.images.rgb", chunk_index=0, file_index=0
    )
    with av.open(str(path)) as container:
        decoded = [
            (float(f.pts * f.time_base), f.to_ndarray(format="rgb24"))
            for f in container.decode(video=0)
        ]
    assert len(decoded) == len(q["rewards"])
    for m in meta:
        start, stop = (
            m["videos/observation.images.rgb/from_timestamp"],
            m["videos/observation.images.rgb/to_timestamp"],
        )
        assert round((stop - start) * 10) == m["length"]
        for i in range(m["length"]):
            seconds, pixels = decoded[m["dataset_from_index"] + i]
            assert abs(seconds - (start + i / 10)) < 1e-4  # LeRobot's tolerance_s
            original = q["observations"]["rgb"][m["dataset_from_index"] + i].astype(int)
            assert np.abs(pixels.astype(int) - original).mean() < 8  # lossy, the same frame
    # The way back decodes the video: every field exact but the camera, which is close.
    rlds_writer.convert("lerobot", dest, tmp_path / "back")
    pairs = zip(
        rlds_writer.open_dataset(smooth).episodes("train"),
        rlds_writer.open_dataset(tmp_path / "back").episodes("train"),
        strict=True,
    )
    for x, y in pairs:
        restored = dict(flatten(y))
        for path, value in flatten(x):
            if path == ("steps", "observation", "rgb"):
                error = np.abs(restored[path].astype(int) - value.astype(int)).mean(axis=(1, 2, 3))
                assert error[-1] == 0 and error.max() < 8  # the final step was kept as PNG
            else:
                np.testing.assert_array_equal(restored[path], value, err_msg=str(path))


_LEROBOT_VIDEO_SCRIPT = """
import json, sys
from lerobot.datasets.lerobot_dataset import LeRobotDataset

out = {}
for backend in ("pyav", "torchcodec"):
    try:
        ds = LeRobotDataset("rlds/smooth", root=sys.argv[1], video_backend=backend)
        frames = [
            (ds[i]["observation.images.rgb"] * 255).round().to(int).tolist() for i in range(len(ds))
        ]
    except Exception as e:  # torchcodec needs FFmpeg's shared libraries on the system
        frames = repr(e)
    out[backend] = frames
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not os.environ.get("RLDS_LEROBOT_PYTHON"),
    reason="set RLDS_LEROBOT_PYTHON to a python with lerobot 0.4.4 (docs/sharing.md)",
)
def test_real_lerobot_loader_decodes_the_video_export(smooth, tmp_path):
    pytest.importorskip("av")
    dest = tmp_path / "lerobot"
    rlds_writer.interop.export.export_lerobot(smooth, dest, video=True)
    out = _last_json(_run_lerobot("-c", _LEROBOT_VIDEO_SCRIPT, str(dest), cwd=tmp_path))
    assert isinstance(out["pyav"], list), out["pyav"]
    originals = rlds_writer.open_dataset(smooth).episodes("train").qlearning_dataset()
    expected = originals["observations"]["rgb"].astype(int)
    for backend, frames in out.items():
        if isinstance(frames, str):  # a decoder that cannot load here
            print(f"LeRobot video backend {backend}: {frames}", file=sys.stderr)
            continue
        decoded = np.array(frames).transpose(0, 2, 3, 1)
        assert decoded.shape == expected.shape, backend
        error = np.abs(decoded - expected).mean(axis=(1, 2, 3))
        assert error.max() < 8, (backend, error)  # lossy, but every frame is the right one
        print(
            f"LeRobot ({backend}) decoded {len(frames)} frames, mean abs error "
            f"<= {error.max():.2f} levels",
            file=sys.stderr,
        )


_LEROBOT_WRITER_SCRIPT = """
import sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, kind = sys.argv[1], sys.argv[2]
features = {
    "observation.state": {"dtype": "float32", "shape": (3,), "names": ["a", "b", "c"]},
    "observation.images.cam": {
        "dtype": kind, "shape": (64, 64, 3), "names": ["height", "width", "channels"]
    },
    "action": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
    "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    "next.done": {"dtype": "bool", "shape": (1,), "names": None},
}
ds = LeRobotDataset.create(
    "local/native", fps=10, features=features, root=root, use_videos=kind == "video"
)
for episode in range(2):
    for t in range(5):
        level = [40 * t + 30 * episode, 90, 200 - 30 * t]
        image = np.zeros((64, 64, 3), np.uint8) + np.uint8(level)
        ds.add_frame({
            "observation.state": np.float32([episode, t, episode * t]),
            "observation.images.cam": image,
            "action": np.float32([t, -t]),
            "next.reward": np.float32([t]),
            "next.done": np.array([t == 4]),
            "task": f"task {episode}",
        })
    ds.save_episode()
ds.finalize()
"""


@pytest.mark.skipif(
    not os.environ.get("RLDS_LEROBOT_PYTHON"),
    reason="set RLDS_LEROBOT_PYTHON to a python with lerobot 0.4.4 (docs/sharing.md)",
)
@pytest.mark.parametrize("kind", ["image", "video"])
def test_a_dataset_written_by_lerobot_itself_converts(kind, tmp_path):
    if kind == "video":
        pytest.importorskip("av")
    root = tmp_path / "native"
    _run_lerobot("-c", _LEROBOT_WRITER_SCRIPT, str(root), kind, cwd=tmp_path)
    report = rlds_writer.convert("lerobot", root, tmp_path / "rlds")
    assert (report.episodes, report.steps, report.terminated) == (2, 10, 2)
    for episode, stored in enumerate(rlds_writer.open_dataset(tmp_path / "rlds").episodes()):
        steps = stored["steps"]
        t = np.arange(5)
        np.testing.assert_array_equal(
            steps["observation"]["state"], np.float32([[episode, i, episode * i] for i in t])
        )
        np.testing.assert_array_equal(steps["action"], np.float32([[i, -i] for i in t]))
        np.testing.assert_array_equal(steps["reward"], np.float32(t))
        assert [s.decode() for s in steps["language_instruction"]] == [f"task {episode}"] * 5
        assert steps["is_terminal"][-1] and steps["is_last"][-1] and not steps["is_last"][:-1].any()
        expected = (
            np.zeros((5, 64, 64, 3), int)
            + np.array([[40 * i + 30 * episode, 90, 200 - 30 * i] for i in t])[:, None, None, :]
        )
        error = np.abs(steps["observation"]["images"]["cam"].astype(int) - expected).max()
        assert error == 0 if kind == "image" else error < 8, error
        assert stored["episode_index"] == episode
