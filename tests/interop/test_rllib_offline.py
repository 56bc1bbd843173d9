"""RLlib's offline training straight from an RLDS dataset (`interop/formats/rllib/offline.py`).

No export: `RLDSOfflineData` reads the RLDS shards through Ray Data in the
schema RLlib asks for. The source is CartPole recorded by a policy that
always pushes right (action 1): behaviour cloning must move the policy
towards it, MARWIL must train with finite losses, and one epoch of training
must hand every recorded transition to RLlib's pre-learner exactly once.
"""

from __future__ import annotations

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

from helpers_core import EpisodeSpec, write_with_rlds_writer  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer.errors import SpecError  # noqa: E402
from rlds_writer.interop.formats.rllib import offline  # noqa: E402

_COUNTER = "rlds-offline-counter"


@pytest.fixture(scope="module")
def source(tmp_path_factory, record_episodes):
    """CartPole pushed right: 6 episodes of at most 8 steps, the last cut short after 3."""
    return record_episodes(
        gym.make("CartPole-v1", max_episode_steps=8),
        tmp_path_factory.mktemp("rlds") / "push_right",
        6,
        action=1,
        cut_last_at=2,
    ).path


def _config(algo_class, path, schema, **offline_data):
    config = algo_class().training(train_batch_size_per_learner=16, lr=0.01).debugging(seed=0)
    # No map_batches_kwargs: on this 2-CPU Ray, RLlib's default pre-learner pool
    # (2 actors x 1 CPU) would leave the read tasks none; RLDSOfflineData sizes it.
    return offline.offline_config(
        config,
        path,
        schema=schema,
        dataset_num_iters_per_learner=1,
        iter_batches_kwargs={"prefetch_batches": 1},
        read_options={"bytes_per_task": 1},  # a read task per episode: several workers
        **offline_data,
    )


def _train(algo, timeout=180):
    """`algo.train()`, bounded: a pipeline whose read tasks never get a CPU waits forever."""
    import threading

    out = {}
    thread = threading.Thread(target=lambda: out.update(result=algo.train()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"train() still waiting after {timeout} s: the reads starved"
    return out["result"]


def test_the_prelearner_pool_leaves_a_read_task_its_cpus():
    from ray.rllib.algorithms.bc import BCConfig

    def pool(cpus, read_cpus=1.0, **learners):
        config = BCConfig().learners(**learners) if learners else BCConfig()
        return offline.prelearner_resources(config, read_cpus, cpus=cpus)

    assert pool(2) == {"concurrency": 1}  # RLlib's 2 x 1 CPU would hold both
    assert pool(8) == {"concurrency": 2}  # RLlib's own size when there is room
    assert pool(1) == {"concurrency": 1, "num_cpus": 0.0}  # beside the read task
    assert pool(1.5) == {"concurrency": 1, "num_cpus": 0.5}  # the half CPU left
    assert pool(2, read_cpus=0.5) == {"concurrency": 1}
    assert pool(5, num_learners=2) == {"concurrency": 2}  # 5 - 2 learners - 1 read
    assert pool(4, num_learners=2) == {"concurrency": 1}
    chosen = BCConfig().offline_data(map_batches_kwargs={"concurrency": 3})
    assert offline.prelearner_resources(chosen, cpus=2) == {}  # the user's choice kept


def test_the_prelearner_actors_start_without_tensorflow_unless_their_environment_is_set():
    from ray.rllib.algorithms.bc import BCConfig

    no_tf = {"runtime_env": {"env_vars": {"RLLIB_TEST_NO_TF_IMPORT": "1"}}}
    assert offline.prelearner_runtime_env(BCConfig()) == no_tf
    own = BCConfig().offline_data(map_batches_kwargs={"runtime_env": {"env_vars": {"A": "1"}}})
    assert offline.prelearner_runtime_env(own) == {}  # the user's environment kept


def _p_right(algo, observations):
    """The trained policy's mean probability of action 1 on the recorded observations."""

    def p_right(learner):
        with torch.no_grad():
            out = learner.module["default_policy"].forward_inference(
                {"obs": torch.as_tensor(observations)}
            )
        return torch.softmax(out["action_dist_inputs"], -1)[:, 1].mean().item()

    return [result.get() for result in algo.learner_group.foreach_learner(p_right)][0]


def test_marwil_from_rlds_episodes_trains_with_finite_losses(source, ray_session):
    from ray.rllib.algorithms.marwil import MARWILConfig

    algo = _config(MARWILConfig, source, "episodes").build_algo()
    try:
        learner = _train(algo)["learners"]["default_policy"]
    finally:
        algo.stop()
    assert np.isfinite(learner["vf_loss"]) and np.isfinite(learner["policy_loss"])
    assert learner["num_module_steps_trained"] > 0


def test_cql_from_rlds_trains_with_no_env_given(tmp_path, record_episodes, ray_session):
    from ray.rllib.algorithms.cql import CQLConfig

    pendulum = record_episodes(
        gym.make("Pendulum-v1", max_episode_steps=8), tmp_path / "pendulum", 3
    ).path
    # SAC's rule: its actor, critic and alpha rates, not `lr`.
    config = CQLConfig().training(train_batch_size_per_learner=8, lr=None)
    # No env: SAC's config would build an env runner and ask for one.
    # RLlib's CQL cannot take one update per call on a local learner: refused in one line.
    with pytest.raises(SpecError, match="dataset_num_iters_per_learner: 1 with CQL"):
        offline.offline_config(config.copy(), pendulum, dataset_num_iters_per_learner=1)
    algo = offline.offline_config(config, pendulum, read_options={"bytes_per_task": 1}).build_algo()
    try:
        assert algo.env_runner_group is None
        learner = _train(algo)["learners"]["default_policy"]
    finally:
        algo.stop()
    assert learner["num_module_steps_trained"] > 0
    assert np.isfinite(learner["cql_loss"]) and np.isfinite(learner["policy_loss"])


def test_the_prelearner_maps_runs_of_episodes_giving_bc_rllibs_batch_and_marwil_advantages(
    source, ray_session
):
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.algorithms.marwil import MARWILConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    from rlds_writer.interop.formats.rllib.prelearner import RLDSPreLearner

    def prelearner(cls, config):
        spaces = (config.observation_space, config.action_space)
        spec = config.get_multi_rl_module_spec(spaces={"default_policy": spaces})
        return cls(config=config, spaces=spaces, module_spec=spec)

    bc = offline.offline_config(BCConfig().debugging(seed=0), source)
    rows = offline.read_for_rllib(bc).take_batch(1000)
    n = len(rows["eps_id"])
    # All rows but the first and the last: the first run starts mid-episode, the
    # last stops before its episode's end (a fragment going on).
    batch = {name: column[1:-1] for name, column in rows.items()}
    episodes = prelearner(RLDSPreLearner, bc)._map_to_episodes(dict(batch))["episodes"]
    assert len(episodes) == 6 and sum(len(e) for e in episodes) == n - 2
    assert all(e.is_done for e in episodes[:-1]) and not episodes[-1].is_done
    for episode in episodes:  # a run's observations, then its last next observation
        rows_of = batch["eps_id"] == int(episode.id_)
        observed = np.concatenate([batch["obs"][rows_of], batch["new_obs"][rows_of][-1:]])
        assert np.array_equal(np.stack(episode.get_observations()), observed)
        assert np.array_equal(episode.get_actions(), batch["actions"][rows_of])
    ours = prelearner(RLDSPreLearner, bc)(dict(batch))
    theirs = prelearner(OfflinePreLearner, bc)(dict(batch))
    assert ours.keys() == theirs.keys()
    for key in ours:  # BC: the very batch RLlib's row-by-row mapping gives
        assert torch.equal(torch.as_tensor(ours[key]), torch.as_tensor(theirs[key])), key
    marwil = offline.offline_config(MARWILConfig().debugging(seed=0), source)
    out = prelearner(RLDSPreLearner, marwil)(dict(batch))
    # One bootstrap step per run (masked out of the loss), not one per transition.
    assert len(out["default_policy/loss_mask"]) == n - 2 + 6
    assert int(out["default_policy/loss_mask"].sum()) == n - 2
    assert torch.isfinite(out["default_policy/advantages"]).all()


@ray.remote(num_cpus=0)
class Counter:
    """What the pre-learners were handed: (episode index, step) per transition."""

    def __init__(self):
        self.seen = []
        self.tensorflow = set()

    def add(self, keys, tensorflow=False):
        self.seen.extend(keys)
        self.tensorflow.add(tensorflow)

    def get(self):
        return list(self.seen)

    def tensorflow_loaded(self):
        return sorted(self.tensorflow)


def _counting_prelearner():
    from rlds_writer.interop.formats.rllib.prelearner import RLDSPreLearner

    class CountingPreLearner(RLDSPreLearner):
        def __call__(self, batch):
            import sys

            keys = list(zip(np.asarray(batch["eps_id"]).tolist(), np.asarray(batch["t"]).tolist()))
            loaded = "tensorflow" in sys.modules
            ray.get(ray.get_actor(_COUNTER).add.remote(keys, loaded))
            return super().__call__(batch)

    return CountingPreLearner


def test_bc_from_rlds_learns_the_recorded_action_reading_each_transition_once_an_epoch(
    source, ray_session
):
    from ray.rllib.algorithms.bc import BCConfig

    observations = rlds_writer.open_dataset(source).episodes("train").qlearning_dataset()
    expected = sorted((int(t["episode_ids"]), int(t["step"])) for t in _transitions(source))
    counter = Counter.options(name=_COUNTER).remote()
    config = _config(BCConfig, source, "columns", prelearner_class=_counting_prelearner())
    algo = config.build_algo()
    try:
        assert isinstance(algo.offline_data, offline.RLDSOfflineData)
        before = _p_right(algo, observations["observations"])
        seen = []
        for _ in range(4 * len(expected)):
            result = _train(algo)
            seen = ray.get(counter.get.remote())
            if len(seen) >= len(expected):
                break
        after = _p_right(algo, observations["observations"])
        tensorflow = ray.get(counter.tensorflow_loaded.remote())
    finally:
        algo.stop()
        ray.kill(counter)
    # One epoch: every transition of every episode handed to RLlib, once.
    assert sorted(seen) == expected
    # The pre-learner actors run without the TensorFlow RLlib imports wherever it is
    # installed (seconds of CPU and ~0.6 GB per actor, every epoch when streaming).
    assert tensorflow == [False]
    learner = result["learners"]["default_policy"]
    assert learner["num_module_steps_trained"] > 0 and np.isfinite(learner["policy_loss"])
    assert after > before + 0.05, (before, after)


def test_the_learner_gets_few_large_blocks_holding_each_transition_once(source, ray_session):
    from ray.rllib.algorithms.bc import BCConfig

    # The learner pays per block it iterates: the read makes at most one task per
    # CPU here, unsplit (Ray's default read parallelism cuts these rows into 4+).
    ds = offline.read_for_rllib(offline.offline_config(BCConfig(), source)).materialize()
    assert ds.num_blocks() <= int(ray.cluster_resources()["CPU"])
    arrays = rlds_writer.open_dataset(source).episodes("train").qlearning_dataset()
    rows = sorted(ds.take_all(), key=lambda r: (r["eps_id"], r["t"]))
    assert [(r["eps_id"], r["t"]) for r in rows] == [
        (t["episode_ids"], t["step"]) for t in _transitions(source)
    ]
    assert np.array_equal(np.stack([r["obs"] for r in rows]), arrays["observations"])
    assert np.array_equal(np.stack([r["new_obs"] for r in rows]), arrays["next_observations"])
    assert [r["actions"] for r in rows] == arrays["actions"].tolist()


def _transitions(path):
    """(episode index, step) of every transition, from the TF-free reader."""
    arrays = rlds_writer.open_dataset(path).episodes("train").qlearning_dataset()
    ids = arrays["episode_ids"]
    out = []
    for episode in np.unique(ids):
        for step in range(int((ids == episode).sum())):
            out.append({"episode_ids": episode, "step": step})
    return out


class _DictObs(gym.Env):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"pos": np.zeros(2, np.float32)}, 0.0, True, False, {}


def test_what_rlds_input_cannot_give_is_refused_in_one_line(source, catch, tmp_path):
    from ray.rllib.algorithms.bc import BCConfig

    def refused(config):
        with pytest.raises(SpecError) as error:
            offline.RLDSOfflineData(config)
        assert "\n" not in str(error.value)
        return str(error.value)

    base = offline.offline_config(BCConfig(), source)
    assert "input_read_sample_batches" in refused(
        base.copy().offline_data(input_read_sample_batches=True)
    )
    assert "input_filesystem" in refused(base.copy().offline_data(input_filesystem="s3"))
    assert "one RLDS dataset" in refused(base.copy().offline_data(input_=[str(source)] * 2))
    env = rlds_writer.RecordRLDS(_DictObs(), tmp_path / "dict")
    env.reset()
    env.step(0)
    env.close()
    columns = offline.offline_config(BCConfig(), tmp_path / "dict")
    assert "input_read_episodes=True" in refused(columns)
    # EnvLogger's DiscreteArray spec is RLlib's Discrete; a bare int64 scalar is refused.
    assert str(offline.offline_config(BCConfig(), catch).action_space) == "Discrete(3)"
    ints = tmp_path / "ints"
    config = rlds_writer.DatasetConfig(
        name="ints", observation_info=np.float32, action_info=np.int64, reward_info=np.float32
    )
    write_with_rlds_writer(
        ints, config, [EpisodeSpec([np.float32(0)] * 2, [np.int64(1)], [np.float32(0)], [])]
    )
    with pytest.raises(SpecError, match="pass action_space=gymnasium.spaces.Discrete"):
        offline.offline_config(BCConfig(), ints)
    with pytest.raises(ValueError, match="schema must be one of"):
        offline.offline_config(BCConfig(), source, schema="batches")
    with pytest.raises(ValueError, match="Unknown split 'valid'"):
        offline.offline_config(BCConfig(), source, split="valid")
