"""`rlds-writer export --to minari`: checked by opening the result with Minari itself.

The source datasets are recorded with `RecordRLDS` (CartPole: terminated,
time-limited and cut-short episodes) or written from a custom env with dict
and image observations; the exported dataset is opened with
`minari.load_dataset` and, for the round trip, converted back with
`rlds-writer convert --from minari` and compared field by field.
"""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari")

from helpers_envs import Rover  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / "minari_root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def _record_cartpole(path, episodes=5, cut_at=3):
    """CartPole episodes: time limit 12, the pole falling, and a last one cut short by close()."""
    env = rlds_writer.RecordRLDS(
        gym.make("CartPole-v1", max_episode_steps=12),
        path,
        step_fn=lambda o, a, r, te, tr, info: {
            "info": {"pole": np.float32(o[2]), "left": bool(o[0] < 0)}
        },
        episode_fn=lambda o, a, r, te, tr, info: {"label": "random", "speed": np.float64(1.5)},
    )
    env.action_space.seed(0)
    for episode in range(episodes):
        env.reset(seed=episode)
        for t in range(100):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated or (episode == episodes - 1 and t == cut_at):
                break
    env.close()
    return rlds_writer.open_dataset(path)


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_minari_export_opens_in_minari_and_round_trips_every_value_and_flag(
    tmp_path, minari_root, capsys, data_format
):
    source = _record_cartpole(tmp_path / "rlds")
    originals = list(source.episodes("train"))
    assert [e["end_reason"] for e in originals].count(b"cut_short") == 1

    argv = ["export", "--to", "minari", str(tmp_path / "rlds"), "cartpole/rec-v0"]
    assert cli.main([*argv, "--data-format", data_format]) == 0
    out = capsys.readouterr().out
    assert "5 episodes" in out and "1 episode cut short" in out

    dataset = minari.load_dataset("cartpole/rec-v0")
    assert dataset.total_episodes == 5
    assert dataset.storage.metadata["data_format"] == data_format
    assert dataset.spec.action_space == gym.spaces.Discrete(2)  # from the recorded env_id
    env = dataset.recover_environment()
    assert env.spec.id == "CartPole-v1"
    env.close()
    metadatas = list(dataset.storage.get_episode_metadata(range(5)))
    endings = set()
    for original, episode, metadata in zip(originals, dataset.iterate_episodes(), metadatas):
        steps = original["steps"]
        t = len(steps["reward"]) - 1
        np.testing.assert_array_equal(episode.observations, steps["observation"])
        np.testing.assert_array_equal(episode.actions, steps["action"][:t])
        np.testing.assert_array_equal(episode.rewards, steps["reward"][:t])
        np.testing.assert_array_equal(episode.infos["pole"], steps["info"]["pole"])
        np.testing.assert_array_equal(episode.infos["left"], steps["info"]["left"])
        terminal = bool(steps["is_terminal"][-1])
        assert (bool(episode.terminations[-1]), bool(episode.truncations[-1])) == (
            terminal,
            not terminal,
        )
        assert not episode.terminations[:-1].any() and not episode.truncations[:-1].any()
        assert metadata["end_reason"] == original["end_reason"].decode()
        assert metadata["label"] == "random" and metadata["speed"] == 1.5
        endings.add(metadata["end_reason"])
    assert endings == {"terminated", "truncated", "cut_short"}

    back = tmp_path / "back"
    assert cli.main(["convert", "--from", "minari", "cartpole/rec-v0", str(back)]) == 0
    returned = list(rlds_writer.open_dataset(back).episodes("train"))
    assert len(returned) == len(originals)
    for index, (original, episode) in enumerate(zip(originals, returned)):
        for key, value in original.items():
            if key != "steps":
                np.testing.assert_array_equal(episode[key], value, err_msg=key)
        assert episode["minari_id"] == index
        for key, column in original["steps"].items():
            if isinstance(column, dict):
                for sub, values in column.items():
                    np.testing.assert_array_equal(episode["steps"][key][sub], values)
                    assert episode["steps"][key][sub].dtype == values.dtype
            else:
                np.testing.assert_array_equal(episode["steps"][key], column, err_msg=key)
                assert episode["steps"][key].dtype == column.dtype, key


def test_cut_short_drop_leaves_the_recorders_cut_episodes_out(tmp_path, minari_root):
    _record_cartpole(tmp_path / "rlds", episodes=3)
    report = rlds_writer.interop.export.export_minari(tmp_path / "rlds", "cartpole/kept-v0")
    assert (report.episodes, report.cut_short) == (3, 1)
    report = rlds_writer.export(
        tmp_path / "rlds", "cartpole/dropped-v0", to="minari", cut_short="drop"
    )
    assert (report.episodes, report.skipped) == (2, 1)
    dropped = minari.load_dataset("cartpole/dropped-v0")
    ends = [m["end_reason"] for m in dropped.storage.get_episode_metadata(range(2))]
    assert "cut_short" not in ends and dropped.total_episodes == 2


def test_dict_and_image_observations_without_env_id_get_spaces_from_the_features(
    tmp_path, minari_root
):
    env = rlds_writer.RecordRLDS(Rover(), tmp_path / "rlds")
    env.action_space.seed(1)
    for seed in range(2):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.close()
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))

    rlds_writer.interop.export.export_minari(tmp_path / "rlds", "rover-v0")
    dataset = minari.load_dataset("rover-v0")
    space = dataset.spec.observation_space
    assert isinstance(space, gym.spaces.Dict)
    assert space["camera"] == gym.spaces.Box(0, 255, (6, 5, 3), np.uint8)
    assert dataset.spec.action_space.shape == (2,)
    assert dataset.spec.env_spec is None
    for original, episode in zip(originals, dataset.iterate_episodes()):
        steps = original["steps"]
        for key in ("pos", "camera"):  # raw, not JPEG: exact
            np.testing.assert_array_equal(episode.observations[key], steps["observation"][key])
        np.testing.assert_array_equal(episode.actions, steps["action"][:-1])
        assert episode.terminations[-1] and not episode.truncations.any()


@pytest.mark.parametrize(
    "args, needles",
    [
        (["{rlds}", "not an id"], ["not a Minari dataset id", "name-v<version>"]),
        (["{rlds}", "cartpole/rec"], ["'cartpole/rec' is not a Minari dataset id", "-v0"]),
        (["{rlds}", "cartpole/rec-v0", "--split", "test"], ["no split 'test'", "--split"]),
        (["{missing}", "cartpole/rec-v0"], ["not an RLDS dataset directory"]),
        (["{rlds}", "cartpole/rec-v0", "--env-id", "NoSuchEnv-v9"], ["NoSuchEnv-v9"]),
        (
            ["{rlds}", "cartpole/rec-v0", "--env-id", "no_such_module_xyz:Env-v0"],
            ["cannot import 'no_such_module_xyz'"],
        ),
    ],
)
def test_export_user_errors_are_one_line(tmp_path, minari_root, capsys, args, needles):
    _record_cartpole(tmp_path / "rlds", episodes=1)
    paths = {"rlds": tmp_path / "rlds", "missing": tmp_path / "missing"}
    argv = ["export", "--to", "minari", *(a.format(**paths) for a in args)]
    assert cli.main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlds-writer export: error:"), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (minari_root / "cartpole" / "rec-v0").exists()


def test_existing_minari_dataset_is_refused_and_kept(tmp_path, minari_root, capsys):
    _record_cartpole(tmp_path / "rlds", episodes=2)
    assert cli.main(["export", "--to", "minari", str(tmp_path / "rlds"), "cartpole/rec-v0"]) == 0
    assert cli.main(["export", "--to", "minari", str(tmp_path / "rlds"), "cartpole/rec-v0"]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "minari delete cartpole/rec-v0" in err
    assert minari.load_dataset("cartpole/rec-v0").total_episodes == 2


def test_a_discount_minari_cannot_express_is_kept_in_infos(tmp_path, minari_root):
    dm_env = pytest.importorskip("dm_env")
    from dm_env import specs

    class Decaying(dm_env.Environment):
        """Three steps with a discount of 0.9 (an env-side gamma), then termination."""

        def reset(self):
            self.t = 0
            return dm_env.restart(np.zeros(2, np.float32))

        def step(self, action):
            self.t += 1
            obs = np.full(2, self.t, np.float32)
            if self.t == 3:
                return dm_env.termination(1.0, obs)
            return dm_env.transition(1.0, obs, discount=0.9)

        def observation_spec(self):
            return specs.Array((2,), np.float32)

        def action_spec(self):
            return specs.DiscreteArray(2)

    env = rlds_writer.EnvLogger(Decaying(), data_directory=str(tmp_path / "rlds"))
    env.reset()
    for _ in range(3):
        env.step(np.int64(1))
    env.close()
    stored = next(iter(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train")))
    rlds_writer.interop.export.export_minari(tmp_path / "rlds", "decaying-v0")
    episode = next(minari.load_dataset("decaying-v0").iterate_episodes())
    np.testing.assert_array_equal(episode.infos["discount"], stored["steps"]["discount"])
    assert episode.infos["discount"][0] == np.float32(0.9)
    assert episode.terminations[-1]


def test_one_element_rewards_of_datasets_tfds_wrote_are_minaris_scalars(tmp_path, minari_root):
    """RL Unplugged RWRL's rewards are `(1,)` (written by TFDS itself): Minari's
    `rewards` are one number per step, `(T,)`, as its own collector stores them;
    a reward of several numbers stays a vector."""
    from helpers_rlu import write_rwrl_like

    for shape, dataset_id in (((1,), "rwrl/one-v0"), ((2,), "rwrl/two-v0")):
        write_rwrl_like(tmp_path / str(shape[0]), [4, 3], reward_shape=shape)
        stored = list(rlds_writer.open_dataset(tmp_path / str(shape[0])).episodes("train"))
        rlds_writer.interop.export.export_minari(tmp_path / str(shape[0]), dataset_id)
        episodes = list(minari.load_dataset(dataset_id).iterate_episodes())
        for episode, source in zip(episodes, stored, strict=True):
            t = len(source["steps"]["reward"]) - 1
            want = source["steps"]["reward"][:t]
            assert episode.rewards.shape == ((t,) if shape == (1,) else (t, 2))
            np.testing.assert_array_equal(episode.rewards, want.reshape(episode.rewards.shape))
