"""Recording a real multi-agent RLlib PPO run with 2 remote EnvRunners.

The env (`_Plant`) has three agents: `a` (module `p0`) and `b`, `c` (module
`p1`, other observation and action spaces). `b` leaves early (terminated),
`c` joins late, and the env episode ends truncated for the rest. Every
observation holds the env's clock, the agent's code and the agent's previous
action; every info holds the clock, the agent id and the env's own episode
uid; rewards are a function of clock and agent. The env logs each agent
episode it played (first and last clock, terminated) when its episode ends,
so the recorded dataset is checked step by step against what the env did,
not against RLlib's chunks. `rollout_fragment_length` 5 cuts most episodes
into several chunks.

One Ray instance and one training run (2 `train()`s with evaluation on the
local EnvRunner, then `algo.stop()`, which merges) serve the module.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds

ray = pytest.importorskip("ray")

from rlds_writer.read.reader import open_dataset  # noqa: E402, I001
from rlds_writer.record.rllib import RLDSRecorder  # noqa: E402
from ray.rllib.env.multi_agent_env import MultiAgentEnv  # noqa: E402

FRAGMENT = 5
CODES = {"a": 1, "b": 2, "c": 3}
MODULES = {"a": "p0", "b": "p1", "c": "p1"}


def reward_of(agent: str, clock: int, action: int) -> float:
    return 0.01 * clock + CODES[agent] + 0.5 * action


class _Plant(MultiAgentEnv):
    """a: obs (3,), 3 actions; b, c: obs (4,), 2 actions. b leaves early, c joins late."""

    def __init__(self, config: Any = None):
        super().__init__()
        config = config or {}
        self.log_dir = config.get("log_dir", "")
        self.eval = bool(config.get("eval", False))
        self.possible_agents = ["a", "b", "c"]
        self.agents = []
        box = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        wide = gym.spaces.Box(-1e6, 1e6, (4,), np.float32)
        self.observation_spaces = {"a": box, "b": wide, "c": wide}
        self.action_spaces = {"a": gym.spaces.Discrete(3)} | {
            k: gym.spaces.Discrete(2) for k in ("b", "c")
        }
        self.rng = np.random.default_rng(getattr(config, "worker_index", 0) * 7919 + os.getpid())

    def _obs(self, agent: str, previous_action: int) -> np.ndarray:
        out = np.zeros(self.observation_spaces[agent].shape, np.float32)
        out[:3] = (self.t, CODES[agent], previous_action)
        return out

    def _info(self, agent: str) -> dict[str, Any]:
        return {"clock": self.t, "agent": agent, "env_uid": self.uid}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.uid = uuid.uuid4().hex
        self.length = int(self.rng.integers(10, 26))
        self.b_leaves = int(self.rng.integers(2, self.length - 3))
        self.c_joins = int(self.rng.integers(1, self.length - 3))
        self.agents = ["a", "b"]
        self.played = {a: {"first": 0, "terminated": False} for a in self.agents}
        return {a: self._obs(a, 0) for a in self.agents}, {a: self._info(a) for a in self.agents}

    def step(self, actions: dict[str, Any]):
        self.t += 1
        obs, rewards, infos = {}, {}, {}
        terms, truncs = {"__all__": False}, {"__all__": False}
        for agent, action in actions.items():
            obs[agent] = self._obs(agent, int(action))
            rewards[agent] = reward_of(agent, self.t, int(action))
            infos[agent] = self._info(agent)
            self.played[agent]["last"] = self.t
        if "b" in self.agents and self.t == self.b_leaves:
            terms["b"] = True
            self.agents.remove("b")
            self.played["b"]["terminated"] = True
        if self.t == self.c_joins:
            self.agents.append("c")
            obs["c"], infos["c"] = self._obs("c", 0), self._info("c")
            self.played["c"] = {"first": self.t, "terminated": False}
        if self.t >= self.length:
            truncs["__all__"] = True
            self._log()
        return obs, rewards, terms, truncs, infos

    def _log(self) -> None:
        if not self.log_dir:
            return
        with open(os.path.join(self.log_dir, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(
                json.dumps(
                    {"uid": self.uid, "eval": self.eval, "pid": os.getpid(), "agents": self.played}
                )
                + "\n"
            )


def _played(log_dir: str) -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out


def _policy_mapping(agent_id: str, episode: Any, **kwargs: Any) -> str:
    return MODULES[agent_id]


def _episode_fn(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "fn_agent": f"{data['agent_id']}/{data['module_id']}",
        "fn_actions": len(data["actions"]),
    }


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    from ray.rllib.algorithms.ppo import PPOConfig

    root = tmp_path_factory.mktemp("rllib_ma") / "out"
    log_dir = str(tmp_path_factory.mktemp("played"))
    recorder = RLDSRecorder.with_options(
        root,
        name="plant",
        info_keys=["clock", "agent", "env_uid"],
        model_outputs=["action_logp"],
        episode_fn=_episode_fn,
    )
    config = (
        PPOConfig()
        .environment(_Plant, env_config={"log_dir": log_dir})
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_policy_mapping)
        .env_runners(
            num_env_runners=2,
            rollout_fragment_length=FRAGMENT,
            num_cpus_per_env_runner=0.5,
        )
        .training(train_batch_size_per_learner=100, minibatch_size=50, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .evaluation(
            evaluation_interval=1,
            evaluation_duration=2,
            evaluation_duration_unit="episodes",
            evaluation_num_env_runners=0,
            evaluation_config={"env_config": {"log_dir": log_dir, "eval": True}},
        )
        .fault_tolerance(restart_failed_env_runners=True)
        .callbacks(recorder)
    )
    algo = config.build_algo()
    results = [algo.train()]
    killed_pid = _kill_and_wait_for_restart(algo, index=1)
    results.append(algo.train())
    algo.stop()
    return {
        "root": root,
        "played": _played(log_dir),
        "results": results,
        "killed_pid": killed_pid,
    }


def _kill_and_wait_for_restart(algo: Any, index: int) -> int:
    actor = algo.env_runner_group._worker_manager.actors()[index]
    killed_pid = ray.get(actor.__ray_call__.remote(lambda runner: os.getpid()))
    # Ray restarts the actor (same worker index, new process); RLlib probes it back in.
    ray.kill(actor, no_restart=False)
    for _ in range(30):
        try:
            pid = ray.get(actor.__ray_call__.remote(lambda runner: os.getpid()), timeout=20)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            continue
        if pid != killed_pid:
            return killed_pid
    raise AssertionError("the killed EnvRunner was not restarted")


def _recorded(run: dict[str, Any], split: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(env uid, agent id) -> the recorded agent episode, over both module datasets."""
    out = {}
    for module in ("p0", "p1"):
        for episode in open_dataset(run["root"] / "merged" / module)[split]:
            steps = episode["steps"]
            uids = {u.decode() for u in steps["env_uid"]}
            assert len(uids) == 1, "one agent episode spans two env episodes"
            key = (uids.pop(), episode["agent_id"].decode())
            assert key not in out, f"{key} recorded twice"
            assert episode["module_id"].decode() == module == MODULES[key[1]]
            out[key] = episode
    return out


def _expected(run: dict[str, Any], evaluation: bool) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (e["uid"], agent): played
        for e in run["played"]
        if e["eval"] == evaluation
        for agent, played in e["agents"].items()
    }


def test_every_agent_episode_is_recorded_once_whole_and_step_by_step(run):
    recorded = _recorded(run, "train")
    expected = _expected(run, evaluation=False)
    assert set(recorded) == set(expected)
    for key, want in expected.items():
        agent = key[1]
        steps = recorded[key]["steps"]
        clock = steps["observation"][:, 0].astype(int)
        # Exactly the observations this agent received, from its first to its last.
        assert clock.tolist() == list(range(want["first"], want["last"] + 1)), key
        assert (steps["observation"][:, 1] == CODES[agent]).all()
        assert steps["clock"].tolist() == clock.tolist()
        assert {a.decode() for a in steps["agent"]} == {agent}
        # The action taken after each observation (the env echoes it in the next one).
        actions = steps["action"]
        assert actions[:-1].tolist() == steps["observation"][1:, 2].astype(int).tolist()
        np.testing.assert_allclose(
            steps["reward"][:-1],
            [reward_of(agent, c, a) for c, a in zip(clock[1:], actions[:-1])],
            rtol=1e-6,
        )
        assert actions[-1] == 0 and steps["reward"][-1] == 0
        # RLDS flags from this agent's own terminated/truncated.
        assert steps["is_first"].tolist() == [True] + [False] * (len(clock) - 1)
        assert steps["is_last"].tolist() == [False] * (len(clock) - 1) + [True]
        assert steps["is_terminal"].tolist() == [False] * (len(clock) - 1) + [want["terminated"]]
        assert want["terminated"] == (agent == "b")
        # episode_fn sees one agent's joined episode.
        episode = recorded[key]
        assert episode["fn_agent"].decode() == f"{agent}/{MODULES[agent]}"
        assert episode["fn_actions"] == len(clock) - 1
        # Model outputs per agent, on the step of the action they produced.
        assert (steps["action_logp"][:-1] < 0).all() and steps["action_logp"][-1] == 0


def test_agent_episodes_regroup_into_env_episodes_and_counts_equal_rllibs(run):
    recorded = _recorded(run, "train")
    by_env_episode = defaultdict(set)
    worker = {}
    for (uid, agent), episode in recorded.items():
        by_env_episode[episode["env_episode_id"].decode()].add((uid, agent))
        worker.setdefault(uid, set()).add(int(episode["worker_index"]))
    # One RLlib env episode id per env episode, shared by its three agents.
    assert sorted(len(v) for v in by_env_episode.values()) == [3] * len(by_env_episode)
    assert all(len({uid for uid, _ in v}) == 1 for v in by_env_episode.values())
    assert {w for ws in worker.values() for w in ws} == {1, 2}
    lifetime = run["results"][-1]["env_runners"]["num_episodes_lifetime"]
    assert lifetime == len(by_env_episode)
    figures = run["results"][-1]["env_runners"]["rlds_writer"]
    assert figures["episodes_written"] == len(recorded)
    assert figures["steps_written"] == sum(len(e["steps"]["is_first"]) for e in recorded.values())


def test_agent_episodes_longer_than_a_fragment_are_joined_from_chunks(run):
    recorded = _recorded(run, "train")
    long = [k for k, e in recorded.items() if len(e["steps"]["is_first"]) > 2 * FRAGMENT + 1]
    assert long, "no agent episode spanned several chunks"
    # Late joiners: c's episodes start at the clock it joined, mid-chunk or on a cut.
    starts = {int(e["steps"]["clock"][0]) for (_, a), e in recorded.items() if a == "c"}
    assert len(starts) > 1 and 0 not in starts


def test_killed_env_runner_loses_no_finished_agent_episode(run):
    recorded = _recorded(run, "train")
    killed = {e["uid"] for e in run["played"] if e["pid"] == run["killed_pid"]}
    assert killed and all((uid, "a") in recorded for uid in killed)
    # The restarted runner (same worker index, new process) appended to its directories.
    restarted = {e["uid"] for e in run["played"] if e["pid"] != run["killed_pid"] and not e["eval"]}
    workers = {int(recorded[uid, "a"]["worker_index"]) for uid in restarted}
    assert workers == {1, 2}


def test_evaluation_agent_episodes_go_to_the_eval_split(run):
    expected = _expected(run, evaluation=True)
    assert expected
    recorded = _recorded(run, "eval")
    assert {k: len(e["steps"]["is_first"]) - 1 for k, e in recorded.items()} == {
        k: v["last"] - v["first"] for k, v in expected.items()
    }


def test_merge_leaves_one_dataset_per_module_loadable_by_tfds(run):
    assert sorted(p.name for p in run["root"].iterdir()) == ["merged"]
    assert sorted(p.name for p in (run["root"] / "merged").iterdir()) == ["p0", "p1"]
    for module, obs_size in (("p0", 3), ("p1", 4)):
        builder = tfds.builder_from_directory(os.fspath(run["root"] / "merged" / module))
        assert set(builder.info.splits) == {"train", "eval"}
        episode = next(iter(tfds.as_numpy(builder.as_dataset(split="train").take(1))))
        first = next(iter(episode["steps"]))
        assert first["observation"].shape == (obs_size,)
        assert episode["module_id"].decode() == module


def test_module_ids_that_cannot_name_a_directory_are_refused():
    from rlds_writer.record.rllib.rllib_multiagent import check_module_id

    assert check_module_id("p0") == "p0"
    for bad in ("merged", "writer-1", "a/b", ""):
        with pytest.raises(ValueError, match="cannot name its dataset directory"):
            check_module_id(bad)


def _seeded_returns(root: Any | None) -> tuple[list[Any], Any]:
    """Two seeded iterations on a local EnvRunner; with a recorder if `root` is given."""
    from ray.rllib.algorithms.ppo import PPOConfig

    from rlds_writer.record.rllib import finish_recording

    config = (
        PPOConfig()
        .environment(_Plant)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=_policy_mapping)
        .env_runners(num_env_runners=0, rollout_fragment_length=FRAGMENT)
        .training(train_batch_size_per_learner=60, minibatch_size=30, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .debugging(seed=3)
    )
    if root is not None:
        config = config.callbacks(RLDSRecorder.with_options(root, info_keys=["clock"]))
    algo = config.build_algo()
    out = []
    for _ in range(2):
        runners = algo.train()["env_runners"]
        out.append((runners["num_episodes_lifetime"], runners["agent_episode_returns_mean"]))
    finished = finish_recording(algo) if root is not None else None
    algo.stop()
    return out, finished


def test_recording_does_not_change_what_is_played(ray_session, tmp_path):
    with_recorder, reports = _seeded_returns(tmp_path / "out")
    assert with_recorder[-1][0] > 0
    # finish_recording merged each module (before algo.stop()).
    assert sorted(reports) == ["p0", "p1"]
    assert reports["p1"].episodes["train"] == 2 * reports["p0"].episodes["train"] > 0
    assert _seeded_returns(None)[0] == with_recorder


def _episode_of_a_and_b() -> Any:
    """RLlib's own `MultiAgentEpisode` for agents a and b, one module."""
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    space = gym.spaces.Box(-1e3, 1e3, (1,), np.float32)
    return MultiAgentEpisode(
        observation_space={"a": space, "b": space},
        action_space={"a": gym.spaces.Discrete(99), "b": gym.spaces.Discrete(99)},
        agent_to_module_mapping_fn=lambda agent, ep: "p",
    )


def _cut_as_a_runner(episode: Any, chunks: list[Any]) -> Any:
    """Cuts `episode` as an EnvRunner does at the end of `sample()`; copies the chunk returned.

    Returns the successor chunk.
    """
    from rlds_writer.record.rllib.rllib_multiagent import extract_multi_agent

    successor = episode.cut(len_lookback_buffer=1)  # RLlib's default lookback
    for agent, sa in list(episode.agent_episodes.items()):
        if not sa:  # the EnvRunner drops steps-less agent chunks before returning
            del episode.agent_episodes[agent]
    chunks.append(extract_multi_agent(episode, ()))
    return successor


def _turn_based_chunks(length: int, cuts: set[int]) -> tuple[list[Any], dict[str, Any]]:
    """Plays agents a, b in turn on RLlib's own `MultiAgentEpisode`, cut as an EnvRunner cuts.

    Returns the recorder's copies of the chunks, and what each agent saw and did.
    """
    from rlds_writer.record.rllib.rllib_multiagent import extract_multi_agent

    episode = _episode_of_a_and_b()
    played = {"a": {"obs": [0], "actions": []}, "b": {"obs": [], "actions": []}}
    episode.add_env_reset(observations={"a": np.float32([0])}, infos={"a": {}})
    chunks = []
    for t in range(1, length + 1):
        mover, other = ("a", "b") if t % 2 else ("b", "a")
        played[mover]["actions"].append(t)
        last = t == length
        seen = ("a", "b") if last else (other,)
        for agent in seen:
            played[agent]["obs"].append(t)
        episode.add_env_step(
            {agent: np.float32([t]) for agent in seen},
            {mover: t},
            {agent: 1.0 for agent in (mover, *seen)},
            infos={agent: {} for agent in seen},
            terminateds={"__all__": last},
        )
        if t in cuts and not last:
            episode = _cut_as_a_runner(episode, chunks)
    chunks.append(extract_multi_agent(episode, ()))
    return chunks, played


@pytest.mark.parametrize("length", [5, 8])
def test_turn_based_agent_episodes_join_exactly_wherever_rllib_cuts(length):
    from rlds_writer.record.rllib.rllib_chunks import join
    from rlds_writer.record.rllib.rllib_multiagent import agent_parts

    cut_sets = [{c} for c in range(1, length)] + [
        {c, c + d} for c in range(1, length) for d in (1, 2, 3)
    ]
    for cuts in cut_sets:
        chunks, played = _turn_based_chunks(length, cuts)
        parts = agent_parts(chunks)
        assert set(parts) == {"a", "b"}
        for agent, agent_chunks in parts.items():
            joined = join(agent, agent_chunks, ())
            assert joined is not None, (cuts, agent)
            got = [int(o[0]) for o in joined["observations"]]
            assert got == played[agent]["obs"], (cuts, agent)
            assert [int(a) for a in joined["actions"]] == played[agent]["actions"], (cuts, agent)


def _simultaneous_chunks(length: int, a_leaves: int, cut: int) -> list[Any]:
    """Agents a and b act on every step of RLlib's own `MultiAgentEpisode`; a is done at `a_leaves`.

    Cut once at `cut` as an EnvRunner cuts; the last chunk is copied as
    `on_episode_end` sees it (before RLlib prunes its empty agent episodes).
    """
    from rlds_writer.record.rllib.rllib_multiagent import extract_multi_agent

    episode = _episode_of_a_and_b()
    episode.add_env_reset(
        observations={"a": np.float32([0]), "b": np.float32([0])}, infos={"a": {}, "b": {}}
    )
    chunks = []
    for t in range(1, length + 1):
        acting = ("a", "b") if t <= a_leaves else ("b",)
        episode.add_env_step(
            {agent: np.float32([t]) for agent in acting},
            {agent: t for agent in acting},
            {agent: 1.0 for agent in acting},
            infos={agent: {} for agent in acting},
            terminateds={"a": t == a_leaves, "__all__": t == length},
        )
        if t == cut and t != length:
            episode = _cut_as_a_runner(episode, chunks)
    chunks.append(extract_multi_agent(episode, ()))
    return chunks


def test_an_agent_done_on_the_last_step_before_a_cut_is_recorded_whole():
    # The cluster run's loss: RLlib's cut() brings a done agent back in the next chunk as
    # an empty agent episode starting at t=0, and its chunks no longer joined.
    from rlds_writer.record.rllib.rllib_chunks import join
    from rlds_writer.record.rllib.rllib_multiagent import agent_parts

    length = 7
    for a_leaves in range(1, length):
        for cut in range(1, length):
            parts = agent_parts(_simultaneous_chunks(length, a_leaves, cut))
            joined = {agent: join(agent, p, ()) for agent, p in parts.items()}
            where = (a_leaves, cut)
            a_obs = [int(o[0]) for o in joined["a"]["observations"]]
            assert a_obs == list(range(a_leaves + 1)), where
            b_obs = [int(o[0]) for o in joined["b"]["observations"]]
            assert b_obs == list(range(length + 1)), where
            assert parts["a"][-1]["terminated"], where
            a_actions = [int(x) for x in joined["a"]["actions"]]
            assert a_actions == list(range(1, a_leaves + 1)), where


def test_an_agent_episode_whose_chunks_do_not_join_is_kept_as_unrecorded():
    from rlds_writer.record.rllib.rllib_chunks import ChunkWriter
    from rlds_writer.record.rllib.rllib_multiagent import MultiAgentRecording

    obs_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    act_space = gym.spaces.Discrete(3)
    recording = MultiAgentRecording({}, "00001", 1, "train", "/nonexistent")
    # Its writer exists already: nothing is written (the recorder is never reached).
    recording.writers["p0"] = ChunkWriter(
        None, obs_space, act_space, {"model_outputs": ()}, "train"
    )
    agent = {"module_id": "p0", "agent_episode_id": "e1", "terminated": True, "truncated": False}
    agent.update(observation_space=obs_space, action_space=act_space)
    # The second part acted but starts at t=0 again: the parts do not join.
    spans = [{"span": (0, 3), "actions": [1]}, {"span": (0, 0), "actions": [2]}]
    written = recording.write("env1", [{"a": {**agent, **span}} for span in spans])
    assert written == 0
    assert recording.unrecorded == ["e1"]
