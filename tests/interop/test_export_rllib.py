"""`rlds-writer export --to rllib-episodes`: RLlib's own offline pipeline trains on the result.

The source is CartPole recorded with `RecordRLDS` by a policy that always
pushes right (action 1), plus an episode cut short by `close()`. Behaviour
cloning on the exported data must move the policy towards action 1; MARWIL
must train; the episodes layout must read back through
`rlds-writer convert --from rllib-episodes` unchanged.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# TensorFlow first: RLlib's try_import_tf() disables TF2 behaviour (eager
# execution) for the whole process when it is the one that imports TensorFlow.
pytest.importorskip("tensorflow")
gym = pytest.importorskip("gymnasium")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.rllib")
pytest.importorskip("msgpack_numpy")
torch = pytest.importorskip("torch")

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402


@pytest.fixture(scope="module")
def source(tmp_path_factory, record_episodes):
    """CartPole pushed right: 6 episodes of at most 8 steps, the last cut short after 3."""
    return record_episodes(
        gym.make("CartPole-v1", max_episode_steps=8),
        tmp_path_factory.mktemp("rlds") / "push_right",
        6,
        action=1,
        cut_last_at=2,
        step_fn=lambda o, a, r, te, tr, info: {"info": {"cart": np.float32(o[0])}},
        episode_fn=lambda o, a, r, te, tr, info: {"label": "push-right"},
    ).path


def test_episodes_layout_reads_back_through_convert_unchanged(source, tmp_path, capsys):
    dest = tmp_path / "rllib"
    assert cli.main(["export", "--to", "rllib-episodes", str(source), str(dest)]) == 0
    assert "6 episodes" in capsys.readouterr().out
    back = tmp_path / "back"
    assert cli.main(["convert", "--from", "rllib-episodes", str(dest), str(back)]) == 0
    reader = rlds_writer.open_dataset(source)
    originals = list(reader.episodes("train"))
    returned = list(rlds_writer.open_dataset(back).episodes("train"))
    assert len(returned) == len(originals) == 6
    for index, (original, episode) in enumerate(zip(originals, returned)):
        a, b = original["steps"], episode["steps"]
        for key in ("observation", "action", "is_first", "is_last", "is_terminal"):
            np.testing.assert_array_equal(b[key], a[key], err_msg=key)
        np.testing.assert_allclose(b["reward"], a["reward"])  # RLlib keeps Python floats
        np.testing.assert_array_equal(b["info"]["cart"], a["info"]["cart"])
        assert episode["episode_id"] == f"{reader.name}-{index}".encode()
        # Every truncated episode (the cut-short one included) is a finished RLlib episode.
        assert bool(episode["is_truncated"]) == (not a["is_terminal"][-1])
        custom = episode["custom_data"].decode()
        assert original["end_reason"].decode() in custom and "push-right" in custom


def test_cut_short_drop_and_user_errors(source, tmp_path, capsys):
    report = rlds_writer.export(source, tmp_path / "kept", to="rllib-episodes", cut_short="drop")
    assert (report.episodes, report.skipped, report.cut_short) == (5, 1, 1)
    argv = ["export", "--to", "rllib-episodes", str(source), str(tmp_path / "kept")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an empty directory" in err[0], err
    assert cli.main([*argv[:-1], str(tmp_path / "new"), "--jpeg"]) == 1
    assert "--to minari only" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def _config(algo_class, data, episodes):
    env = gym.make("CartPole-v1")
    return (
        algo_class()
        .environment(observation_space=env.observation_space, action_space=env.action_space)
        .offline_data(
            input_=[os.fspath(data)],
            input_read_episodes=episodes,
            dataset_num_iters_per_learner=1,
            map_batches_kwargs={"concurrency": 1, "num_cpus": 1},
            iter_batches_kwargs={"prefetch_batches": 1},
        )
        .training(train_batch_size_per_learner=32, lr=0.01)
        .debugging(seed=0)
    )


def _p_right(algo, observations):
    """The trained policy's mean probability of action 1 on the recorded observations."""

    def p_right(learner):
        with torch.no_grad():
            out = learner.module["default_policy"].forward_inference(
                {"obs": torch.as_tensor(observations)}
            )
        return torch.softmax(out["action_dist_inputs"], -1)[:, 1].mean().item()

    return [result.get() for result in algo.learner_group.foreach_learner(p_right)][0]


@pytest.mark.parametrize("layout", ["episodes", "columns"])
def test_bc_on_the_export_learns_the_recorded_action(source, tmp_path, ray_session, layout):
    from ray.rllib.algorithms.bc import BCConfig

    data = tmp_path / layout
    rlds_writer.export(source, data, to="rllib-episodes", layout=layout)
    observations = rlds_writer.open_dataset(source).episodes("train").qlearning_dataset()
    observations = observations["observations"]
    algo = _config(BCConfig, data, layout == "episodes").build_algo()
    try:
        before = _p_right(algo, observations)
        for _ in range(2):
            result = algo.train()
        after = _p_right(algo, observations)
    finally:
        algo.stop()
    assert result["learners"]["default_policy"]["num_module_steps_trained"] > 0
    assert after > before + 0.05, (before, after)


def test_marwil_trains_on_exported_episodes(source, tmp_path, ray_session):
    from ray.rllib.algorithms.marwil import MARWILConfig

    data = tmp_path / "episodes"
    rlds_writer.export(source, data, to="rllib-episodes")
    algo = _config(MARWILConfig, data, True).build_algo()
    try:
        learner = algo.train()["learners"]["default_policy"]
    finally:
        algo.stop()
    assert np.isfinite(learner["vf_loss"]) and np.isfinite(learner["policy_loss"])
    assert learner["num_module_steps_trained"] > 0


class _DictObs(gym.Env):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"pos": np.ones(2, np.float32)}, 0.0, True, False, {}


def test_dict_observations_go_to_the_episodes_layout_not_columns(tmp_path, capsys):
    env = rlds_writer.RecordRLDS(_DictObs(), tmp_path / "rlds")
    env.reset(seed=0)
    env.step(0)
    env.close()
    argv = ["export", "--to", "rllib-episodes", str(tmp_path / "rlds")]
    assert cli.main([*argv, str(tmp_path / "cols"), "--layout", "columns"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use layout='episodes'" in err[0], err
    assert not (tmp_path / "cols").exists()
    assert cli.main([*argv, str(tmp_path / "eps")]) == 0
    back = tmp_path / "back"
    assert cli.main(["convert", "--from", "rllib-episodes", str(tmp_path / "eps"), str(back)]) == 0
    steps = next(iter(rlds_writer.open_dataset(back).episodes("train")))["steps"]
    np.testing.assert_array_equal(steps["observation"]["pos"], [[0, 0], [1, 1]])


# --------------------------------------- datasets TFDS wrote (RL Unplugged's layouts)


def _items(dest):
    import msgpack
    import msgpack_numpy
    import pyarrow.parquet as pq
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return [
        SingleAgentEpisode.from_state(
            msgpack.unpackb(item, object_hook=msgpack_numpy.decode, strict_map_key=False)
        )
        for file in sorted(dest.glob("*.parquet"))
        for item in pq.read_table(file).column("item").to_pylist()
    ]


def test_rwrl_rewards_of_shape_one_export_as_numbers_in_both_layouts(tmp_path, capsys):
    import pyarrow.parquet as pq
    from helpers_rlu import write_rwrl_like

    write_rwrl_like(tmp_path / "rlds", [4, 3])
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    assert originals[0]["steps"]["reward"].shape == (4, 1)
    argv = ["export", "--to", "rllib-episodes", str(tmp_path / "rlds"), str(tmp_path / "ep")]
    assert cli.main(argv) == 0, capsys.readouterr().err
    episodes = _items(tmp_path / "ep")
    assert len(episodes) == 2
    for original, episode in zip(originals, episodes, strict=True):
        steps = original["steps"]
        rewards = episode.get_rewards()
        assert all(isinstance(r, float) for r in rewards)
        np.testing.assert_allclose(rewards, steps["reward"][:-1, 0])
        positions = np.stack([o["position"] for o in episode.get_observations()])
        np.testing.assert_array_equal(positions, steps["observation"]["position"])

    # RLlib's column layout takes dict observations in neither case; a flat one does.
    flat = tmp_path / "flat"
    import tensorflow_datasets as tfds
    from helpers_core import EpisodeSpec, write_with_tfds
    from tensorflow_datasets.rlds import rlds_base

    config = rlds_base.DatasetConfig(
        name="rwrl_flat",
        observation_info=tfds.features.Tensor(shape=(3,), dtype=np.float32),
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        reward_info=tfds.features.Tensor(shape=(1,), dtype=np.float32),
        discount_info=tfds.features.Tensor(shape=(1,), dtype=np.float32),
    )
    rewards = [np.array([0.25 * t], np.float32) for t in range(3)]
    write_with_tfds(
        flat,
        config,
        [
            EpisodeSpec(
                observations=[np.full(3, t, np.float32) for t in range(4)],
                actions=[np.zeros(2, np.float32)] * 3,
                rewards=rewards,
                discounts=[np.ones(1, np.float32)] * 3,
            )
        ],
    )
    rlds_writer.interop.export.export_rllib(flat, tmp_path / "cols", layout="columns")
    table = pq.read_table(next((tmp_path / "cols").glob("*.parquet")))
    assert table.column("rewards").to_pylist() == [0.0, 0.25, 0.5]


def test_a_reward_of_several_numbers_is_refused_by_name(tmp_path, capsys):
    from helpers_rlu import write_rwrl_like

    write_rwrl_like(tmp_path / "rlds", [3], reward_shape=(2,))
    argv = ["export", "--to", "rllib-episodes", str(tmp_path / "rlds"), str(tmp_path / "ep")]
    assert cli.main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "steps/reward: float32[2]" in lines[0], lines
    assert "one scalar reward per step" in lines[0]
    assert not (tmp_path / "ep").exists()


def test_episode_ids_name_the_source_episode_when_one_is_left_out(tmp_path):
    from helpers_rlu import write_atari_like

    ends = ["terminated", "cut_short", "truncated", "terminated"]
    # Without RL Unplugged's episode_id field (which would name them), ids are indices.
    write_atari_like(tmp_path / "rlds", [3, 4, 1, 2], ends=ends, channels=3, episode_fields=False)
    report = rlds_writer.interop.export.export_rllib(
        tmp_path / "rlds", tmp_path / "ep", cut_short="drop"
    )
    assert (report.episodes, report.skipped) == (2, 2)
    ids = [episode.id_ for episode in _items(tmp_path / "ep")]
    assert ids == ["atari_like-0", "atari_like-3"]
    q = rlds_writer.open_dataset(tmp_path / "rlds").episodes("train")
    assert sorted(set(q.qlearning_dataset(cut_short="drop")["episode_ids"])) == [0, 3]
