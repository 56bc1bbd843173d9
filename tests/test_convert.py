"""Tests of `rlds-writer convert`: D4RL HDF5, Minari and RLlib episodes to RLDS.

Every conversion is checked by loading the result with
`tfds.builder_from_directory(...).as_dataset(...)` and comparing every field
with the source.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

# TensorFlow first: RLlib's try_import_tf() disables TF2 behaviour (eager
# execution) for the whole process when it is the one that imports TensorFlow.
tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")
h5py = pytest.importorskip("h5py")

from rlds_writer import cli  # noqa: E402
from rlds_writer.interop.formats.d4rl import importer as d4rl  # noqa: E402


def _load(path, split="train"):
    """Loads every episode with TFDS; steps become dicts of stacked arrays."""
    builder = tfds.builder_from_directory(str(path))
    episodes = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split)):
        steps = list(episode.pop("steps"))
        episode["steps"] = _stack(steps)
        episodes.append(episode)
    return builder, episodes


def _stack(rows):
    if isinstance(rows[0], dict):
        return {k: _stack([r[k] for r in rows]) for k in rows[0]}
    return np.stack(rows)


# ----------------------------------------------------------------------- D4RL


@pytest.mark.parametrize(
    "terminals, timeouts, drop, expected",
    [
        # An episode ends at the row that has terminals or timeouts set.
        ([0, 0, 1, 0, 1], [0, 0, 0, 0, 0], False, [(0, 3, True), (3, 5, True)]),
        ([0, 1, 0, 0, 0], [0, 0, 0, 1, 0], False, [(0, 2, True), (2, 4, False), (4, 5, False)]),
        # Both flags on one row: terminated.
        ([0, 1, 0], [0, 1, 1], False, [(0, 2, True), (2, 3, False)]),
        # A trailing partial episode is kept as truncated, or dropped.
        ([0, 1, 0, 0], [0, 0, 0, 0], False, [(0, 2, True), (2, 4, False)]),
        ([0, 1, 0, 0], [0, 0, 0, 0], True, [(0, 2, True)]),
        ([0, 1, 0, 0], None, True, [(0, 2, True)]),
        ([0, 0, 0], None, False, [(0, 3, False)]),
        ([0, 0, 0], None, True, []),
    ],
)
def test_d4rl_episode_boundary_rules(terminals, timeouts, drop, expected):
    t = np.array(terminals, bool)
    to = None if timeouts is None else np.array(timeouts, bool)
    assert d4rl.episode_bounds(t, to, drop_partial=drop) == expected


def _write_d4rl(path, n=14, next_obs=True):
    rng = np.random.default_rng(1)
    data = {
        "observations": rng.normal(size=(n, 3)).astype(np.float32),
        "actions": rng.normal(size=(n, 2)).astype(np.float32),
        "rewards": rng.normal(size=(n,)).astype(np.float32),
        "terminals": np.zeros(n, bool),
        "timeouts": np.zeros(n, bool),
        "infos/qpos": rng.normal(size=(n, 4)),  # float64: kept exactly
        "infos/goal_id": rng.integers(0, 9, size=n).astype(np.int32),
    }
    if next_obs:
        data["next_observations"] = rng.normal(size=(n, 3)).astype(np.float32)
    data["terminals"][3] = True  # episode 0: rows 0-3, terminated
    data["timeouts"][8] = True  # episode 1: rows 4-8, time limit
    # rows 9..n-1: trailing partial episode
    with h5py.File(path, "w") as f:
        for key, value in data.items():
            f[key] = value
        f["metadata/algorithm"] = "SAC"
        f["metadata/policy/fc0/weight"] = rng.normal(size=(8, 3)).astype(np.float32)
        f.attrs["env"] = "toy-v0"
    return data


def test_d4rl_with_next_observations_keeps_every_field(tmp_path, capsys):
    src = tmp_path / "toy-expert-v2.hdf5"
    data = _write_d4rl(src)
    dest = tmp_path / "rlds"
    assert cli.main(["convert", "--from", "d4rl-hdf5", str(src), str(dest), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["episodes"], report["terminated"], report["truncated"]) == (3, 1, 2)
    assert any("trailing partial episode of 5 rows" in n for n in report["notes"])

    builder, episodes = _load(dest)
    assert builder.info.name == "toy_expert_v2"
    meta = json.loads((dest / "metadata.json").read_text())
    assert meta["metadata/algorithm"] == "SAC" and meta["env"] == "toy-v0"
    assert np.asarray(meta["metadata/policy/fc0/weight"]).shape == (8, 3)
    for episode, (start, stop, terminated) in zip(
        episodes, [(0, 4, True), (4, 9, False), (9, 14, False)]
    ):
        steps = episode["steps"]
        rows = slice(start, stop)
        t = stop - start
        assert len(steps["observation"]) == t + 1
        # o_0..o_{T-1} are the rows' observations; the final step holds next_observations[last].
        np.testing.assert_array_equal(steps["observation"][:t], data["observations"][rows])
        np.testing.assert_array_equal(steps["observation"][t], data["next_observations"][stop - 1])
        np.testing.assert_array_equal(steps["action"][:t], data["actions"][rows])
        np.testing.assert_array_equal(steps["action"][t], np.zeros(2, np.float32))
        np.testing.assert_array_equal(steps["reward"][:t], data["rewards"][rows])
        assert steps["reward"][t] == 0
        np.testing.assert_array_equal(steps["infos"]["qpos"][:t], data["infos/qpos"][rows])
        assert steps["infos"]["qpos"].dtype == np.float64
        np.testing.assert_array_equal(steps["infos"]["goal_id"][:t], data["infos/goal_id"][rows])
        np.testing.assert_array_equal(
            steps["discount"][:t], 1.0 - data["terminals"][rows].astype(np.float32)
        )
        assert steps["is_first"].tolist() == [True] + [False] * t
        assert steps["is_last"].tolist() == [False] * t + [True]
        assert steps["is_terminal"].tolist() == [False] * t + [terminated]
        assert episode["first_row"] == start


def test_d4rl_without_next_observations_keeps_last_action_and_drops_partial(tmp_path):
    src = tmp_path / "toy.hdf5"
    data = _write_d4rl(src, next_obs=False)
    dest = tmp_path / "rlds"
    report = d4rl.convert(src, dest, drop_partial=True)
    assert report.episodes == 2
    assert any("dropped" in n for n in report.notes)
    assert any("no 'next_observations'" in n for n in report.notes)
    _, episodes = _load(dest)
    assert len(episodes) == 2
    for episode, (start, stop, terminated) in zip(episodes, [(0, 4, True), (4, 9, False)]):
        steps = episode["steps"]
        rows = slice(start, stop)
        # One RLDS step per row; the final step keeps its real action and reward.
        np.testing.assert_array_equal(steps["observation"], data["observations"][rows])
        np.testing.assert_array_equal(steps["action"], data["actions"][rows])
        np.testing.assert_array_equal(steps["reward"], data["rewards"][rows])
        assert steps["is_last"].tolist() == [False] * (stop - start - 1) + [True]
        assert bool(steps["is_terminal"][-1]) is terminated


def test_d4rl_missing_dataset_is_a_clear_error(tmp_path):
    src = tmp_path / "bad.hdf5"
    with h5py.File(src, "w") as f:
        f["observations"] = np.zeros((3, 2), np.float32)
        f["rewards"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"missing datasets \['actions', 'terminals'\]"):
        d4rl.convert(src, tmp_path / "out")


# --------------------------------------------------------------------- Minari


def test_minari_dataset_from_data_collector(tmp_path, monkeypatch):
    gym = pytest.importorskip("gymnasium")
    minari = pytest.importorskip("minari")
    pytest.importorskip("jax")  # Minari's DataCollector needs it (minari[create])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari_root"))

    class InfoWrapper(gym.Wrapper):
        """Adds numeric infos, at reset and at every step, like a custom env would."""

        def reset(self, **kwargs):
            obs, _ = self.env.reset(**kwargs)
            self.t = 0
            return obs, {"t": np.int64(0), "pole": np.float32(obs[2])}

        def step(self, action):
            obs, reward, terminated, truncated, _ = self.env.step(action)
            self.t += 1
            return (
                obs,
                reward,
                terminated,
                truncated,
                {"t": np.int64(self.t), "pole": np.float32(obs[2])},
            )

    env = minari.DataCollector(
        InfoWrapper(gym.make("CartPole-v1", max_episode_steps=12)),
        record_infos=True,
        data_format="hdf5",
    )
    env.action_space.seed(0)
    for seed in range(5):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    source = env.create_dataset(
        "cartpole/tiny-v0",
        algorithm_name="random",
        author="tests",
        author_email="tests@example.com",
        code_permalink="https://example.com/code",
        eval_env=gym.make("CartPole-v1", max_episode_steps=12).spec,
        description="five episodes",
    )
    env.close()

    dest = tmp_path / "rlds"
    assert cli.main(["convert", "--from", "minari", "cartpole/tiny-v0", str(dest)]) == 0
    builder, episodes = _load(dest)
    assert builder.info.name == "cartpole_tiny_v0"
    assert builder.info.description == "five episodes"
    meta = json.loads((dest / "metadata.json").read_text())
    assert meta["minari"]["dataset_id"] == "cartpole/tiny-v0"
    source_episodes = list(source.iterate_episodes())
    assert len(episodes) == len(source_episodes) == 5
    endings = set()
    for episode, src in zip(episodes, source_episodes):
        steps = episode["steps"]
        t = len(src.rewards)
        np.testing.assert_array_equal(steps["observation"], src.observations)
        np.testing.assert_array_equal(steps["action"][:t], src.actions)
        np.testing.assert_array_equal(steps["reward"][:t], src.rewards)  # float64, exact
        assert steps["reward"].dtype == src.rewards.dtype
        np.testing.assert_array_equal(steps["info"]["t"], src.infos["t"])
        np.testing.assert_array_equal(steps["info"]["pole"], src.infos["pole"])
        assert bool(steps["is_terminal"][-1]) == bool(src.terminations[-1])
        assert steps["is_last"][-1] and not steps["is_last"][:-1].any()
        assert episode["minari_id"] == src.id
        assert episode["seed"] == src.id  # reset(seed=i) for episode i
        assert episode["rewards_sum"] == pytest.approx(src.rewards.sum())
        endings.add((bool(src.terminations[-1]), bool(src.truncations[-1])))
    # Both kinds of endings were exercised (12-step time limit vs the pole falling).
    assert endings == {(True, False), (False, True)}


# ---------------------------------------------------------------- RLlib output


def _write_rllib_episodes(path, episodes):
    """Writes episodes exactly as RLlib's OfflineSingleAgentEnvRunner does."""
    import msgpack
    import msgpack_numpy
    import pyarrow as pa
    import pyarrow.parquet as pq

    items = [msgpack.packb(e.get_state(), default=msgpack_numpy.encode) for e in episodes]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"item": items}), path)


def _rllib_episode(gym, seed, max_steps):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    env = gym.make("CartPole-v1", max_episode_steps=max_steps)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    episode = SingleAgentEpisode(
        observation_space=env.observation_space, action_space=env.action_space
    )
    episode.add_env_reset(observation=obs, infos={"source": "reset"} if seed else {})
    done = False
    t = 0
    while not done:
        action = int(rng.integers(2))
        obs, reward, terminated, truncated, _ = env.step(action)
        t += 1
        info = {"t": t, "x": float(obs[0])}
        if t == 2:
            info["rare"] = np.array([1.5, 2.5], np.float32)  # only at one step
        episode.add_env_step(
            obs,
            action,
            reward,
            infos=info,
            terminated=terminated,
            truncated=truncated,
            extra_model_outputs={"action_logp": np.float32(-0.1 * t)},
        )
        done = terminated or truncated
    return episode


def test_rllib_episode_output_keeps_infos_and_model_outputs(tmp_path):
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("ray.rllib")
    pytest.importorskip("msgpack_numpy")
    episodes = [_rllib_episode(gym, seed, max_steps=8) for seed in range(4)]
    src = tmp_path / "out"
    _write_rllib_episodes(
        src / "cartpole" / "run-000000-000001" / "a_000000-0.parquet", episodes[:3]
    )
    _write_rllib_episodes(
        src / "cartpole" / "run-000000-000002" / "a_000000-0.parquet", episodes[3:]
    )

    dest = tmp_path / "rlds"
    assert cli.main(["convert", "--from", "rllib-episodes", str(src), str(dest)]) == 0
    builder, loaded = _load(dest)
    meta = json.loads((dest / "metadata.json").read_text())
    assert meta["format"] == "rllib-episodes" and meta["action_space"] == "Discrete(2)"
    assert meta["observation_space"] == str(gym.make("CartPole-v1").observation_space)
    assert len(loaded) == 4
    for episode, source in zip(loaded, episodes):
        steps = episode["steps"]
        t = len(source)
        np.testing.assert_array_equal(steps["observation"], np.stack(source.get_observations()))
        np.testing.assert_array_equal(steps["action"][:t], np.array(source.get_actions()))
        np.testing.assert_array_equal(steps["reward"][:t], np.array(source.get_rewards()))
        infos = source.get_infos()
        np.testing.assert_array_equal(steps["info"]["t"][1:], [i["t"] for i in infos[1:]])
        np.testing.assert_array_equal(steps["info"]["x"][1:], [i["x"] for i in infos[1:]])
        np.testing.assert_array_equal(steps["info"]["rare"][2], [1.5, 2.5])
        assert not steps["info"]["rare"][3:].any()  # missing in the other rows: zeros
        np.testing.assert_allclose(
            steps["extra_model_outputs"]["action_logp"][:t], -0.1 * np.arange(1, t + 1), rtol=1e-6
        )
        assert steps["extra_model_outputs"]["action_logp"][t] == 0
        assert bool(steps["is_terminal"][-1]) == source.is_terminated
        assert bool(episode["is_truncated"]) == source.is_truncated
        assert episode["episode_id"].decode() == source.id_
    # Texts that only some episodes have are kept (and empty elsewhere).
    assert [e["steps"]["info"]["source"][0] for e in loaded] == [b"", b"reset", b"reset", b"reset"]
    assert any(e["is_truncated"] for e in loaded)


def test_rllib_column_format_is_refused_clearly(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"obs": [1.0], "actions": [0], "eps_id": ["a"]}), src)
    from rlds_writer.interop.formats.rllib import importer as rllib_episodes

    with pytest.raises(NotImplementedError, match="output_write_episodes=False"):
        rllib_episodes.convert(src, tmp_path / "out")


@pytest.mark.slow
def test_rllib_training_run_output_converts(tmp_path, ray_session):
    """A real (tiny) PPO run writes episodes with offline_data(output=...).

    On the session's Ray (`ray_session`): a second `ray.init` in one process fails.
    """
    pytest.importorskip("ray.rllib")
    pytest.importorskip("msgpack_numpy")
    from ray.rllib.algorithms.ppo import PPOConfig

    from rlds_writer.interop.formats.rllib import importer as rllib_episodes

    out = tmp_path / "rllib_out"
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, batch_mode="complete_episodes")
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .offline_data(output=str(out))
        .debugging(seed=0)
    )
    algo = config.build_algo()
    algo.train()
    algo.stop()
    states = list(rllib_episodes.iter_states(out))
    assert states
    dest = tmp_path / "rlds"
    report = rllib_episodes.convert(out, dest)
    assert report.episodes == len(states)
    _, loaded = _load(dest)
    for episode, state in zip(loaded, states):
        rewards = np.asarray(state["rewards"]["data"], dtype=np.float64)
        np.testing.assert_array_equal(episode["steps"]["reward"][:-1], rewards)
        assert bool(episode["steps"]["is_terminal"][-1]) == bool(state["is_terminated"])
        assert set(episode["steps"]["extra_model_outputs"]) >= {"action_logp"}


def test_d4rl_to_array_record_reads_back_through_data_source(tmp_path):
    from rlds_writer.maintain import statistics

    src = tmp_path / "toy.hdf5"
    data = _write_d4rl(src)
    dest = tmp_path / "rlds"
    report = d4rl.convert(src, dest, file_format="array_record", max_episodes_per_file=2)
    assert report.episodes == 3
    source = tfds.builder_from_directory(str(dest)).as_data_source(split="train")
    assert len(source) == 3
    steps = source[1]["steps"]
    np.testing.assert_array_equal(
        np.stack([steps[i]["action"] for i in range(len(steps) - 1)]), data["actions"][4:9]
    )
    stats = statistics.compute_statistics(dest, per_episode=True)["splits"]["train"]
    want = [
        float(data["rewards"][a:b].astype(np.float64).sum()) for a, b in [(0, 4), (4, 9), (9, 14)]
    ]
    np.testing.assert_allclose(stats["per_episode"]["return"], want, rtol=1e-6)
    assert (stats["terminated"], stats["truncated"]) == (1, 2)
