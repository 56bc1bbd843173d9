"""Recording real PettingZoo envs: each agent episode equals a hand-made reference.

Each test plays the same seeded env with the same seeded policy twice: once
bare (the reference, collected here from what the PettingZoo API returns to
each agent), once through the recording wrapper. The per-agent datasets are
read back (our reader, and TFDS once) and compared step by step; returns of
both runs must be equal (recording changes nothing).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
import tensorflow_datasets as tfds

from rlds_writer.read.reader import open_dataset

# The pettingzoo extra (PettingZoo, pygame for butterfly, mpe2); skipped without it.
pytest.importorskip("pettingzoo")
pytest.importorskip("pygame")
simple_adversary_v3 = pytest.importorskip("mpe2.simple_adversary_v3")
kaz = pytest.importorskip("pettingzoo.butterfly.knights_archers_zombies_v11")
connect_four_v3 = pytest.importorskip("pettingzoo.classic.connect_four_v3")

from rlds_writer.record.pettingzoo import RecordRLDSAEC, RecordRLDSParallel  # noqa: E402

Key = tuple[int, str]  # (env episode index, agent id)


def kaz_parallel() -> Any:
    # line_death makes agents die at different steps; max_cycles truncates the rest.
    return kaz.parallel_env(max_cycles=60, spawn_delay=5, line_death=True)


def kaz_aec() -> Any:
    return kaz.env(max_cycles=60, spawn_delay=5, line_death=True)


def policy_for(seed: int):
    rng = np.random.default_rng(seed)

    def act(agent: str, obs: Any, space: Any) -> Any:
        if isinstance(obs, dict) and "action_mask" in obs:
            return int(rng.choice(np.flatnonzero(obs["action_mask"])))
        if hasattr(space, "n"):
            return int(rng.choice(space.n, p=_bias(space.n)))
        return rng.uniform(space.low, space.high).astype(space.dtype)

    return act


def _bias(n: int) -> np.ndarray:
    p = np.ones(n)
    p[0] = n  # KAZ: mostly "move up", so agents hit the wall (die) at different steps
    return p / p.sum()


def play_parallel(env: Any, seeds: list[int]) -> dict[Key, dict[str, Any]]:
    """Plays one env episode per seed; returns each agent's episode as it saw it."""
    act = policy_for(7)
    out: dict[Key, dict[str, Any]] = {}
    for index, seed in enumerate(seeds):
        obs, infos = env.reset(seed=seed)
        for agent, o in obs.items():
            out[index, agent] = {"obs": [o], "actions": [], "rewards": [], "terminated": False}
        while env.agents:
            actions = {a: act(a, obs[a], env.action_space(a)) for a in env.agents}
            obs, rewards, terms, truncs, infos = env.step(actions)
            for agent, action in actions.items():
                ep = out[index, agent]
                ep["actions"].append(action)
                ep["rewards"].append(rewards[agent])
                ep["obs"].append(obs[agent])
                ep["terminated"] = bool(terms[agent])
    return out


def play_aec(env: Any, seeds: list[int]) -> dict[Key, dict[str, Any]]:
    """Plays one env episode per seed with `agent_iter`/`last`; per-agent episodes."""
    act = policy_for(11)
    out: dict[Key, dict[str, Any]] = {}
    for index, seed in enumerate(seeds):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            obs, reward, term, trunc, _ = env.last()
            key = (index, agent)
            if key not in out:
                out[key] = {"obs": [obs], "actions": [], "rewards": [], "terminated": False}
            else:
                out[key]["obs"].append(obs)
                out[key]["rewards"].append(reward)
            out[key]["terminated"] = bool(term)
            action = None if term or trunc else act(agent, obs, env.action_space(agent))
            if action is not None:
                out[key]["actions"].append(action)
            env.step(action)
    return out


def recorded(directory: Any) -> dict[Key, dict[str, Any]]:
    """Each agent episode of one group's dataset, keyed like the references."""
    out = {}
    for episode in open_dataset(directory)["train"]:
        key = (int(episode["env_episode_index"]), episode["agent_id"].decode())
        assert key not in out, f"{key} recorded twice"
        out[key] = episode
    return out


def flat(obs: Any) -> Any:
    return obs["observation"] if isinstance(obs, dict) else obs


def check_episode(key: Key, ref: dict[str, Any], episode: dict[str, Any]) -> None:
    steps = episode["steps"]
    n = len(ref["obs"])
    assert len(ref["actions"]) == n - 1, key
    assert len(steps["is_first"]) == n, key
    stored_obs = steps["observation"]
    stored_obs = stored_obs["observation"] if isinstance(stored_obs, dict) else stored_obs
    want = np.stack([flat(o) for o in ref["obs"]]).astype(stored_obs.dtype)
    np.testing.assert_array_equal(stored_obs, want, err_msg=str(key))
    np.testing.assert_array_equal(steps["action"][:-1], np.asarray(ref["actions"]), str(key))
    np.testing.assert_array_equal(
        steps["reward"][:-1], np.asarray(ref["rewards"], np.float32), str(key)
    )
    assert steps["is_first"].tolist() == [True] + [False] * (n - 1), key
    assert steps["is_last"].tolist() == [False] * (n - 1) + [True], key
    assert steps["is_terminal"].tolist() == [False] * (n - 1) + [ref["terminated"]], key


def check_all(reference: dict[Key, dict], datasets: dict[Key, dict]) -> None:
    assert sorted(datasets) == sorted(reference)
    for key, ref in reference.items():
        check_episode(key, ref, datasets[key])
    ids = defaultdict(set)
    for (index, _), episode in datasets.items():
        ids[index].add(episode["env_episode_id"])
    assert all(len(v) == 1 for v in ids.values()), ids  # one id per env episode
    assert len({next(iter(v)) for v in ids.values()}) == len(ids)  # distinct across


def returns(episodes: dict[Key, dict]) -> dict[Key, float]:
    return {k: float(np.sum(v["rewards"])) for k, v in episodes.items()}


def test_parallel_kaz_agents_that_die_early_match_the_reference(tmp_path):
    seeds = [3, 5]
    reference = play_parallel(kaz_parallel(), seeds)
    lengths = {len(e["obs"]) for e in reference.values()}
    assert len(lengths) > 2, "agents should leave at different steps"
    assert any(e["terminated"] for e in reference.values())
    assert not all(e["terminated"] for e in reference.values())  # some truncated

    env = RecordRLDSParallel(kaz_parallel(), tmp_path)
    wrapped = play_parallel(env, seeds)
    env.close()
    assert returns(wrapped) == returns(reference)  # recording changes nothing
    assert sorted(env.directories) == ["archer", "knight"]
    datasets = {**recorded(tmp_path / "archer"), **recorded(tmp_path / "knight")}
    check_all(reference, datasets)


def test_aec_kaz_agents_that_die_early_match_the_reference(tmp_path):
    seeds = [3]
    reference = play_aec(kaz_aec(), seeds)
    assert len({len(e["obs"]) for e in reference.values()}) > 1
    env = RecordRLDSAEC(kaz_aec(), tmp_path)
    wrapped = play_aec(env, seeds)
    env.close()
    assert returns(wrapped) == returns(reference)
    datasets = {**recorded(tmp_path / "archer"), **recorded(tmp_path / "knight")}
    check_all(reference, datasets)


def test_aec_connect_four_turn_based_agents_record_only_their_own_turns(tmp_path):
    seeds = [0, 1, 2]
    reference = play_aec(connect_four_v3.env(), seeds)
    env = RecordRLDSAEC(connect_four_v3.env(), tmp_path)
    wrapped = play_aec(env, seeds)
    env.close()
    assert returns(wrapped) == returns(reference)
    datasets = recorded(tmp_path / "player")
    check_all(reference, datasets)
    for index in range(len(seeds)):
        first = datasets[index, "player_0"]["steps"]
        second = datasets[index, "player_1"]["steps"]
        # Alternating turns: the first player has as many or one more turns.
        assert len(first["is_first"]) - len(second["is_first"]) in (0, 1)
        # The action mask each agent saw is stored with its observation.
        assert first["observation"]["action_mask"].shape == (len(first["is_first"]), 7)
        # The winner's last reward is +1 and the loser's -1 (or both 0 on a draw).
        final = sorted([first["reward"][-2], second["reward"][-2]])
        assert final in ([-1.0, 1.0], [0.0, 0.0])


def test_mpe_agents_with_different_spaces_go_to_one_dataset_per_group(tmp_path):
    make = lambda: simple_adversary_v3.parallel_env(max_cycles=15)  # noqa: E731
    seeds = [1, 2]
    reference = play_parallel(make(), seeds)
    env = RecordRLDSParallel(make(), tmp_path)
    wrapped = play_parallel(env, seeds)
    env.close()
    assert returns(wrapped) == returns(reference)
    adversary, agents = recorded(tmp_path / "adversary"), recorded(tmp_path / "agent")
    assert adversary[0, "adversary_0"]["steps"]["observation"].shape[1:] == (8,)
    assert agents[0, "agent_0"]["steps"]["observation"].shape[1:] == (10,)
    check_all(reference, {**adversary, **agents})
    # Regroup the agents of one env episode through TFDS, by env_episode_id.
    groups: dict[bytes, list[bytes]] = defaultdict(list)
    for group in ("adversary", "agent"):
        builder = tfds.builder_from_directory(os.fspath(tmp_path / group))
        for episode in tfds.as_numpy(builder.as_dataset(split="train")):
            groups[episode["env_episode_id"]].append(episode["agent_id"])
    assert sorted(sorted(v) for v in groups.values()) == [
        [b"adversary_0", b"agent_0", b"agent_1"]
    ] * len(seeds)


def test_agents_with_different_spaces_in_one_group_are_refused(tmp_path):
    with pytest.raises(ValueError, match="agent_group="):
        RecordRLDSParallel(
            simple_adversary_v3.parallel_env(), tmp_path, agent_group=lambda agent: "all"
        )


def test_an_env_episode_cut_by_reset_is_written_cut_short(tmp_path):
    env = RecordRLDSParallel(kaz_parallel(), tmp_path, agent_group=lambda a: "all")
    env.reset(seed=0)
    for _ in range(3):
        env.step({a: 1 for a in env.agents})
    env.reset(seed=1)
    env.close()
    episodes = recorded(tmp_path / "all")
    assert {k for k in episodes if k[0] == 0} == {(0, a) for a in env.possible_agents}
    for (index, _), episode in episodes.items():
        steps = episode["steps"]
        assert len(steps["is_first"]) == (4 if index == 0 else 1)
        assert steps["is_last"][-1] and not steps["is_terminal"].any()
