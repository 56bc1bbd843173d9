"""Your own episodes on disk in: a directory of .npz / .npy episodes and HDF5 episode groups."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from helpers_core import load_episodes

import rlds_writer
from rlds_writer.cli.main import main


def _episode(rng, n):
    """n observations (the last being the final one), n - 1 transitions."""
    return {
        "pixels": rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
        "state": rng.standard_normal((n, 3)).astype(np.float32),
        "actions": rng.standard_normal((n - 1, 2)).astype(np.float32),
        "rewards": rng.standard_normal(n - 1).astype(np.float32),
        "terminals": np.array([False] * (n - 2) + [n % 2 == 0]),
        "clock": np.arange(n, dtype=np.int64),
    }


MAPPING = [
    "observation/image=pixels",
    "observation/state=state",
    "action=actions",
    "reward=rewards",
    "terminated=terminals",
    "step/clock=clock",
]


@pytest.fixture(scope="module")
def episodes():
    rng = np.random.default_rng(0)
    return [_episode(rng, n) for n in (4, 7, 5)]


def _check(path, episodes):
    loaded = load_episodes(path)
    assert len(loaded) == len(episodes)
    for got, want in zip(loaded, episodes, strict=True):
        steps = got["steps"]
        n = len(want["pixels"])
        assert len(steps) == n
        np.testing.assert_array_equal([s["observation"]["image"] for s in steps], want["pixels"])
        np.testing.assert_array_equal([s["observation"]["state"] for s in steps], want["state"])
        np.testing.assert_array_equal([s["action"] for s in steps[:-1]], want["actions"])
        np.testing.assert_array_equal([s["reward"] for s in steps[:-1]], want["rewards"])
        np.testing.assert_array_equal([s["clock"] for s in steps], want["clock"])
        assert bool(steps[-1]["is_terminal"]) == bool(want["terminals"][-1])
        assert not steps[-1]["action"].any()  # RLDS's final step


def test_a_directory_of_npz_episodes_converts_with_a_mapping(tmp_path, episodes, capsys):
    src = tmp_path / "npz"
    src.mkdir()
    for i, episode in enumerate(episodes):
        np.savez(src / f"episode_{i}.npz", **episode)
    argv = ["convert", "--from", "npz-dir", str(src), str(tmp_path / "ds")]
    assert main([*argv, *(f"--map={m}" for m in MAPPING)]) == 0
    assert "3 episodes" in capsys.readouterr().out
    _check(tmp_path / "ds", episodes)


def test_npy_subdirectories_convert_in_natural_order(tmp_path, episodes):
    src = tmp_path / "npy"
    for i, episode in zip((2, 10, 11), episodes):  # "ep10" sorts after "ep2"
        (src / f"ep{i}").mkdir(parents=True)
        for key, value in episode.items():
            np.save(src / f"ep{i}" / f"{key}.npy", value)
    rlds_writer.convert("npz-dir", src, tmp_path / "ds", mapping=MAPPING)
    _check(tmp_path / "ds", episodes)


def test_hdf5_episode_groups_convert_robomimic_style(tmp_path, episodes):
    src = tmp_path / "demos.hdf5"
    with h5py.File(src, "w") as f:
        for i, episode in enumerate(episodes):
            group = f.create_group(f"data/demo_{i}")
            group["obs/agentview"] = episode["pixels"]
            group["obs/proprio"] = episode["state"]
            for key in ("actions", "rewards", "terminals", "clock"):
                group[key] = episode[key]
    mapping = [
        m.replace("=pixels", "=obs/agentview").replace("=state", "=obs/proprio") for m in MAPPING
    ]
    rlds_writer.convert("hdf5-episodes", src, tmp_path / "ds", mapping=mapping)
    _check(tmp_path / "ds", episodes)


def test_default_names_need_no_mapping(tmp_path):
    src = tmp_path / "plain"
    src.mkdir()
    rng = np.random.default_rng(1)
    np.savez(
        src / "0.npz",
        observations=rng.standard_normal((3, 2)).astype(np.float32),
        actions=np.array([0, 1]),
        rewards=np.array([1.0, 2.0], np.float32),
        timeouts=np.array([False, True]),
    )
    rlds_writer.convert("npz-dir", src, tmp_path / "ds")
    (episode,) = load_episodes(tmp_path / "ds")
    assert [int(s["action"]) for s in episode["steps"]] == [0, 1, 0]
    assert not episode["steps"][-1]["is_terminal"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--map", "obs=pixels"], "unknown field 'obs'"),
        (["--map", "observation"], "expected FIELD=KEY"),
        (["--map", "observation=nope"], r"no key 'nope' \(mapped to observation\)"),
    ],
)
def test_mapping_mistakes_are_one_line(tmp_path, episodes, capsys, argv, match):
    import re

    src = tmp_path / "npz"
    src.mkdir()
    np.savez(src / "0.npz", **episodes[0])
    assert main(["convert", "--from", "npz-dir", str(src), str(tmp_path / "ds"), *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(match, err), err
