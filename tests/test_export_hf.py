"""`rlds-writer export --to hf`: checked by loading the result with Hugging Face `datasets`."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
datasets = pytest.importorskip("datasets")

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402


def _record_cartpole(path):
    """Time-limited and terminated episodes, then one cut short by close()."""
    env = rlds_writer.RecordRLDS(
        gym.make("CartPole-v1", max_episode_steps=10),
        path,
        step_fn=lambda o, a, r, te, tr, info: {"info": {"pole": np.float32(o[2])}},
        episode_fn=lambda o, a, r, te, tr, info: {"label": "random"},
    )
    env.action_space.seed(0)
    for episode in range(4):
        env.reset(seed=episode)
        for t in range(50):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated or (episode == 3 and t == 2):
                break
    env.close()


def test_transitions_and_episodes_load_with_datasets_as_the_reader_gives_them(tmp_path, capsys):
    _record_cartpole(tmp_path / "rlds")
    dest = tmp_path / "hf"
    assert cli.main(["export", "--to", "hf", str(tmp_path / "rlds"), str(dest)]) == 0
    assert "4 episodes" in capsys.readouterr().out
    loaded = datasets.load_dataset(str(dest), cache_dir=str(tmp_path / "cache"))["train"]
    assert loaded.features["observation"] == datasets.List(datasets.Value("float32"), length=4)
    assert loaded.features["info"]["pole"] == datasets.Value("float32")
    table = loaded.with_format("numpy")[:]
    q = (
        rlds_writer.open_dataset(tmp_path / "rlds")
        .episodes("train")
        .qlearning_dataset(step_metadata=True)
    )
    pairs = {
        "observation": "observations",
        "action": "actions",
        "reward": "rewards",
        "next_observation": "next_observations",
        "terminated": "terminals",
        "truncated": "timeouts",
        "discount": "discounts",
        "episode_index": "episode_ids",
    }
    for column, key in pairs.items():
        np.testing.assert_array_equal(table[column], q[key], err_msg=column)
    poles = np.array([info["pole"] for info in loaded["info"]], np.float32)
    np.testing.assert_array_equal(poles, q["step_metadata"]["info"]["pole"])

    episodes = datasets.load_dataset(str(dest), "episodes", cache_dir=str(tmp_path / "cache"))
    rows = list(episodes["train"])
    assert [r["end"] for r in rows][-1] == "cut_short"
    assert all(r["label"] == "random" for r in rows)
    assert sum(r["num_transitions"] for r in rows) == len(loaded)

    report = rlds_writer.interop.export.export_hf(
        tmp_path / "rlds", tmp_path / "hf2", cut_short="drop"
    )
    assert (report.episodes, report.skipped) == (3, 1)
    capsys.readouterr()
    assert cli.main(["export", "--to", "hf", str(tmp_path / "rlds"), str(dest)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an empty directory" in err[0], err


class _Camera(gym.Env):
    """An env with a dict observation holding an RGB image."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "rgb": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        }
    )
    action_space = gym.spaces.Discrete(3)

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
        return self._obs(), 1.0, self.t >= 3, False, {}


def test_dict_and_image_observations_become_dict_and_image_features(tmp_path):
    env = rlds_writer.RecordRLDS(_Camera(), tmp_path / "rlds")
    for seed in range(2):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(1)
            done = terminated or truncated
    env.close()
    leaves = rlds_writer.open_dataset(tmp_path / "rlds").features.step_leaves
    assert {leaf.key: leaf.class_name for leaf in leaves}["steps/observation/rgb"] == "Image"
    rlds_writer.interop.export.export_hf(tmp_path / "rlds", tmp_path / "hf", episodes_per_file=1)
    assert len(list((tmp_path / "hf" / "transitions").glob("*.parquet"))) == 2
    loaded = datasets.load_dataset(str(tmp_path / "hf"), cache_dir=str(tmp_path / "cache"))
    train = loaded["train"]
    assert isinstance(train.features["observation"]["rgb"], datasets.Image)
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    row = 0
    for original in originals:
        steps = original["steps"]
        for t in range(len(steps["reward"]) - 1):
            item = train[row]
            np.testing.assert_array_equal(
                np.asarray(item["observation"]["rgb"]), steps["observation"]["rgb"][t]
            )
            np.testing.assert_array_equal(
                np.asarray(item["next_observation"]["rgb"]), steps["observation"]["rgb"][t + 1]
            )
            np.testing.assert_array_equal(
                item["observation"]["pos"], steps["observation"]["pos"][t]
            )
            row += 1
    assert row == len(train)
