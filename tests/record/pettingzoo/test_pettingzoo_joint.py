"""The joint layout of `RecordRLDSParallel`: each env episode equals a hand-made reference.

Each test plays the same seeded env with the same seeded policy twice: once
bare (the reference, collected here from what the PettingZoo parallel API
returns), once through `RecordRLDSParallel(..., layout="joint")`. The one
dataset is read back with our reader and compared per agent per step with
the reference; TFDS's `builder_from_directory` must read the same values.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import tensorflow_datasets as tfds

from rlds_writer.errors import SpecError
from rlds_writer.interop.export import export
from rlds_writer.maintain.validation import validate
from rlds_writer.read.reader import open_dataset
from rlds_writer.read.transitions import episode_transitions

pytest.importorskip("pettingzoo")
pytest.importorskip("pygame")
simple_adversary_v3 = pytest.importorskip("mpe2.simple_adversary_v3")
kaz = pytest.importorskip("pettingzoo.butterfly.knights_archers_zombies_v11")
rps_v2 = pytest.importorskip("pettingzoo.classic.rps_v2")
connect_four_v3 = pytest.importorskip("pettingzoo.classic.connect_four_v3")

from rlds_writer import RecordRLDSAEC, RecordRLDSParallel  # noqa: E402

MASKS = ("acted", "alive", "terminated", "truncated")


def mpe() -> Any:
    return simple_adversary_v3.parallel_env(max_cycles=15)


def kaz_parallel() -> Any:
    # line_death: agents that reach the top wall die, at different steps.
    return kaz.parallel_env(max_cycles=60, spawn_delay=5, line_death=True)


def rps() -> Any:
    return rps_v2.parallel_env(max_cycles=6)


def policy(seed: int):
    rng = np.random.default_rng(seed)

    def act(space: Any) -> Any:
        if hasattr(space, "n"):
            p = np.ones(space.n)
            p[0] = space.n  # KAZ: mostly "move up", so agents die at different steps
            return int(rng.choice(space.n, p=p / p.sum()))
        return rng.uniform(space.low, space.high).astype(space.dtype)

    return act


def play(env: Any, seeds: list[int], with_state: bool = False) -> list[list[dict]]:
    """One list of steps per env episode, as the parallel API showed them."""
    act = policy(7)

    def step_record(obs: dict, terminated: set, truncated: set) -> dict:
        return {
            "obs": {a: np.array(o, copy=True) for a, o in obs.items()},
            "alive": set(env.agents),
            "terminated": terminated,
            "truncated": truncated,
            "state": np.array(env.state(), copy=True) if with_state else None,
        }

    episodes = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        steps = [step_record(obs, set(), set())]
        while env.agents:
            live = list(env.agents)
            actions = {a: act(env.action_space(a)) for a in live}
            obs, rewards, terms, truncs, _ = env.step(actions)
            steps[-1].update(actions=actions, rewards=dict(rewards))
            ended = {a for a in live if terms[a]}
            steps.append(step_record(obs, ended, {a for a in live if truncs[a]} - ended))
        steps[-1].update(actions={}, rewards={})
        episodes.append(steps)
    return episodes


def zeros(space: Any) -> np.ndarray:
    return np.zeros(space.shape, space.dtype)


def check_episode(env: Any, ref: list[dict], steps: dict[str, Any], where: str) -> None:
    n = len(ref)
    assert steps["is_first"].tolist() == [True] + [False] * (n - 1), where
    assert steps["is_last"].tolist() == [False] * (n - 1) + [True], where
    for agent in env.possible_agents:
        at = f"{where} {agent}"
        obs_space, act_space = env.observation_space(agent), env.action_space(agent)
        want = {
            "observation": [s["obs"].get(agent, zeros(obs_space)) for s in ref],
            "action": [s["actions"].get(agent, zeros(act_space)) for s in ref],
            "reward": [np.float32(s["rewards"].get(agent, 0.0)) for s in ref],
            "acted": [agent in s["actions"] for s in ref],
            "alive": [agent in s["alive"] for s in ref],
            "terminated": [agent in s["terminated"] for s in ref],
            "truncated": [agent in s["truncated"] for s in ref],
        }
        for field, values in want.items():
            np.testing.assert_array_equal(steps[field][agent], np.stack(values), f"{at} {field}")
        assert steps["observation"][agent].dtype == obs_space.dtype, at
    took_part = {a for s in ref for a in s["alive"]}
    all_terminated = all(any(a in s["terminated"] for s in ref) for a in took_part)
    assert steps["is_terminal"].tolist() == [False] * (n - 1) + [all_terminated], where
    if ref[0]["state"] is not None:
        np.testing.assert_array_equal(steps["state"], np.stack([s["state"] for s in ref]), where)


def record(make: Any, directory: Any, seeds: list[int], **options: Any) -> list[list[dict]]:
    env = RecordRLDSParallel(make(), directory, layout="joint", **options)
    played = play(env, seeds, with_state=options.get("record_state", False))
    env.close()
    assert env.directories == {"joint": directory}
    assert env.recorders["joint"].episodes_written == len(seeds)
    return played


def rewards(episodes: list[list[dict]]) -> list[list[dict]]:
    return [[s["rewards"] for s in steps] for steps in episodes]


def check_dataset(make: Any, directory: Any, reference: list[list[dict]]) -> list[dict]:
    episodes = list(open_dataset(directory)["train"])
    assert [int(e["env_episode_index"]) for e in episodes] == list(range(len(reference)))
    assert len({e["env_episode_id"] for e in episodes}) == len(reference)
    env = make()
    for index, (ref, episode) in enumerate(zip(reference, episodes)):
        check_episode(env, ref, episode["steps"], f"episode {index}")
    return episodes


def assert_tfds_reads_the_same(directory: Any, ours: list[dict]) -> None:
    builder = tfds.builder_from_directory(os.fspath(directory))
    theirs = list(tfds.as_numpy(builder.as_dataset(split="train")))
    assert len(theirs) == len(ours)

    def same(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict):
            assert sorted(a) == sorted(b), where
            for key in a:
                same(a[key], b[key], f"{where}/{key}")
        else:
            np.testing.assert_array_equal(a, b, where)

    for index, (mine, tf_episode) in enumerate(zip(ours, theirs)):
        for key in ("env_episode_id", "env_episode_index", "agents", "seed", "end_reason"):
            assert mine[key] == tf_episode[key], key
        rows = list(tf_episode["steps"])  # TFDS: one dict per step; ours: columns
        assert len(rows) == len(mine["steps"]["is_first"])
        for t, row in enumerate(rows):
            same(_row(mine["steps"], t), row, f"episode {index} step {t}")


def _row(columns: Any, t: int) -> Any:
    if isinstance(columns, dict):
        return {k: _row(v, t) for k, v in columns.items()}
    return columns[t]


def test_mpe_simultaneous_moves_and_global_state_match_the_reference(tmp_path):
    seeds = [1, 2]
    reference = play(mpe(), seeds, with_state=True)
    wrapped = record(mpe, tmp_path, seeds, record_state=True)
    assert rewards(wrapped) == rewards(reference)  # recording changes nothing
    episodes = check_dataset(mpe, tmp_path, reference)
    # Agents with different spaces share one dataset: one feature per agent.
    steps = episodes[0]["steps"]
    assert steps["observation"]["adversary_0"].shape == (16, 8)
    assert steps["observation"]["agent_0"].shape == (16, 10)
    assert steps["state"].shape == (16, 28)
    meta = episodes[1]
    assert meta["agents"] == b"adversary_0,agent_0,agent_1" and meta["seed"] == 2
    assert meta["end_reason"] == b"truncated"
    assert_tfds_reads_the_same(tmp_path, episodes)
    assert validate(tmp_path)["ok"]
    # Transitions keep the dicts; the masks come as step metadata.
    transitions = episode_transitions(episodes[0])
    np.testing.assert_array_equal(transitions["reward"]["agent_0"], steps["reward"]["agent_0"][:-1])
    assert transitions["step_metadata"]["acted"]["agent_0"].all()


def test_kaz_an_agent_that_dies_early_has_acted_false_and_zeros_afterwards(tmp_path):
    seeds = [3, 5]
    reference = play(kaz_parallel(), seeds, with_state=True)
    wrapped = record(kaz_parallel, tmp_path, seeds, record_state=True)
    assert rewards(wrapped) == rewards(reference)
    episodes = check_dataset(kaz_parallel, tmp_path, reference)
    dead = 0
    for episode in episodes:
        steps, last = episode["steps"], len(episode["steps"]["is_first"]) - 1
        for agent, terminated in steps["terminated"].items():
            if not terminated[:last].any():
                continue
            t = int(np.flatnonzero(terminated)[0])  # its terminal observation
            dead += 1
            assert steps["acted"][agent][:t].all() and not steps["acted"][agent][t:].any()
            assert not steps["alive"][agent][t:].any()
            assert steps["observation"][agent][t].any()  # its last real observation
            assert not steps["observation"][agent][t + 1 :].any()
            assert not steps["action"][agent][t:].any()
            assert not steps["reward"][agent][t:].any()
    assert dead >= 2, "the policy should make agents die before the end"
    assert_tfds_reads_the_same(tmp_path, episodes)


def test_rock_paper_scissors_both_players_act_in_every_step(tmp_path):
    seeds = [0, 4]
    reference = play(rps(), seeds)
    record(rps, tmp_path, seeds)
    episodes = check_dataset(rps, tmp_path, reference)
    for episode in episodes:
        steps = episode["steps"]
        acted = np.stack([steps["acted"][p] for p in ("player_0", "player_1")])
        assert acted[:, :-1].all() and not acted[:, -1].any()
        # A zero-sum game: the two rewards of every step cancel out.
        np.testing.assert_array_equal(steps["reward"]["player_0"], -steps["reward"]["player_1"])
    assert_tfds_reads_the_same(tmp_path, episodes)


def test_an_env_episode_cut_by_reset_or_close_is_written_cut_short(tmp_path):
    env = RecordRLDSParallel(mpe(), tmp_path, layout="joint")
    env.reset(seed=0)
    for _ in range(3):
        env.step({a: 1 for a in env.agents})
    env.reset()
    env.step({a: 2 for a in env.agents})
    env.close()
    first, second = open_dataset(tmp_path)["train"]
    assert first["end_reason"] == second["end_reason"] == b"cut_short"
    assert first["seed"] == 0 and second["seed"] == -1
    for episode, n in ((first, 4), (second, 2)):
        steps = episode["steps"]
        assert len(steps["is_last"]) == n and steps["is_last"][-1]
        assert not steps["is_terminal"].any()
        for agent in env.possible_agents:
            # Every agent is still alive, but nobody acted on the last observation.
            assert steps["alive"][agent].all()
            assert steps["acted"][agent].tolist() == [True] * (n - 1) + [False]


@pytest.mark.parametrize(
    ("make", "options", "error", "names"),
    [
        (mpe, {"layout": "joined"}, SpecError, "layout"),
        (mpe, {"layout": "joint", "record_state": "yes"}, SpecError, "record_state"),
        (rps, {"layout": "joint", "record_state": True}, SpecError, "state()"),
        (mpe, {"record_state": True}, SpecError, "layout='joint'"),
        (mpe, {"layout": "joint", "info_keys": ["x"]}, NotImplementedError, "info_keys"),
        (mpe, {"layout": "joint", "agent_group": str}, NotImplementedError, "agent_group"),
    ],
)
def test_bad_options_are_refused_in_one_line(tmp_path, make, options, error, names):
    with pytest.raises(error) as raised:
        RecordRLDSParallel(make(), tmp_path, **options)
    assert names in str(raised.value) and "\n" not in str(raised.value)
    assert not any(tmp_path.iterdir())  # nothing was created


def test_the_aec_recorder_refuses_the_joint_layout_in_one_line(tmp_path):
    with pytest.raises(NotImplementedError, match="aec_to_parallel") as raised:
        RecordRLDSAEC(connect_four_v3.env(), tmp_path, layout="joint")
    assert "\n" not in str(raised.value)


def test_single_agent_exporters_refuse_a_joint_dataset_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", os.fspath(tmp_path / "minari"))
    record(rps, tmp_path / "rps", [0])
    for to, dest, message in (
        ("minari", "joint/rps-v0", "steps/reward: a dict of rewards"),
        ("rllib-episodes", tmp_path / "rllib", "steps/reward: a dict of rewards"),
        ("d3rlpy", tmp_path / "rps.h5", "steps/action: a dict of 2 fields"),
        ("hf", tmp_path / "hf", "steps/terminated"),
    ):
        with pytest.raises(SpecError) as raised:
            export(tmp_path / "rps", dest, to=to)
        assert message in str(raised.value) and "\n" not in str(raised.value), to
    # LeRobot keeps dicts as one column per leaf: every agent's action survives.
    report = export(tmp_path / "rps", tmp_path / "lerobot", to="lerobot")
    assert report.episodes == 1
    info = (tmp_path / "lerobot" / "meta" / "info.json").read_text()
    assert '"action.player_0"' in info and '"action.player_1"' in info
