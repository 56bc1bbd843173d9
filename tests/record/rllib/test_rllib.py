"""Recording a real RLlib PPO run on CartPole with 2 remote EnvRunners.

One Ray instance and one training run serve every test in this module
(building an algorithm costs about a minute on a busy 2-core box). The run:
`rollout_fragment_length` 8 (shorter than most episodes, so they are cut into
chunks), one `train()`, `ray.kill` of EnvRunner 1 (RLlib restarts it), two
more `train()`s with evaluation on a local EnvRunner, then `algo.stop()`,
which merges the runner directories.

What RLlib played is recorded independently by a second callback that counts
steps and sums rewards in `on_episode_step` (not from chunks) and appends one
JSON line per event to a file; the dataset must match it exactly.
"""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds

ray = pytest.importorskip("ray")

from rlds_writer.record.rllib import RLDSRecorder  # noqa: E402, I001
from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402

FRAGMENT = 8


class _StepIndex(gym.Wrapper):
    """CartPole with `info["step_index"]` (0 at reset)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.t = 0
        return obs, {**info, "step_index": 0}

    def step(self, action):
        obs, r, te, tr, info = self.env.step(action)
        self.t += 1
        return obs, r, te, tr, {**info, "step_index": self.t}


def _make_env(config: Any) -> gym.Env:
    return _StepIndex(gym.make("CartPole-v1"))


class _Tracker(RLlibCallback):
    """Logs episode starts and ends, counting steps itself."""

    log_dir = ""

    def __init__(self):
        super().__init__()
        self.steps: dict[str, int] = {}
        self.returns: dict[str, float] = {}

    def _write(self, **event: Any) -> None:
        path = os.path.join(self.log_dir, f"{os.getpid()}.jsonl")
        with open(path, "a") as f:
            f.write(json.dumps({**event, "pid": os.getpid()}) + "\n")

    def on_episode_start(self, *, episode, env_runner=None, **kwargs):
        self.steps[episode.id_] = 0
        self.returns[episode.id_] = 0.0
        self._write(event="start", id=episode.id_, worker=env_runner.worker_index)

    def on_episode_step(self, *, episode, **kwargs):
        self.steps[episode.id_] += 1
        self.returns[episode.id_] += float(episode.get_rewards(-1))

    def on_episode_end(self, *, episode, env_runner=None, **kwargs):
        self._write(
            event="end",
            id=episode.id_,
            worker=env_runner.worker_index,
            eval=bool(env_runner.config.in_evaluation),
            length=self.steps.pop(episode.id_),
            ret=self.returns.pop(episode.id_),
        )


def _events(log_dir: str) -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            out.extend(json.loads(line) for line in f if line.strip())
    return out


def _load(path: Any, split: str) -> list[dict[str, Any]]:
    builder = tfds.builder_from_directory(os.fspath(path))
    out = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split)):
        episode = dict(episode)
        episode["steps"] = [dict(s) for s in episode["steps"]]
        out.append(episode)
    return out


@pytest.fixture(scope="module")
def run(ray_session, tmp_path_factory):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env

    root = tmp_path_factory.mktemp("rllib") / "out"
    log_dir = tmp_path_factory.mktemp("events")
    register_env("CartPoleStepIndex", _make_env)
    tracker = type("Tracker", (_Tracker,), {"log_dir": str(log_dir)})
    recorder = RLDSRecorder.with_options(
        root,
        name="cartpole_ppo",
        info_keys=["step_index"],
        model_outputs=["action_dist_inputs", "action_logp"],
    )
    config = (
        PPOConfig()
        .environment("CartPoleStepIndex")
        .env_runners(
            num_env_runners=2,
            num_envs_per_env_runner=1,
            rollout_fragment_length=FRAGMENT,
            num_cpus_per_env_runner=0.5,
        )
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .evaluation(
            evaluation_interval=1,
            evaluation_duration=2,
            evaluation_duration_unit="episodes",
            evaluation_num_env_runners=0,
        )
        .fault_tolerance(restart_failed_env_runners=True)
        .callbacks([recorder, tracker])
    )
    algo = config.build_algo()
    results = [algo.train()]
    actors = algo.env_runner_group._worker_manager.actors()
    killed_pid = ray.get(actors[1].__ray_call__.remote(lambda runner: os.getpid()))
    # On a slow machine the first train() may finish no episode on this runner,
    # and it can stop exactly at an episode end: one whole episode (flushed at the
    # end of its sample()), then two steps into a fresh CartPole episode (which
    # cannot end that soon), make sure the kill hits both kinds.
    ended_before = {e["id"] for e in _events(str(log_dir)) if e["event"] == "end"}
    ray.get(
        actors[1].__ray_call__.remote(
            lambda runner: runner.sample(num_episodes=1, force_reset=True)
        )
    )
    # RLlib never sees this episode's metrics (they die with the runner).
    unmetered = {e["id"] for e in _events(str(log_dir)) if e["event"] == "end"} - ended_before
    ray.get(
        actors[1].__ray_call__.remote(
            lambda runner: runner.sample(num_timesteps=2, random_actions=True, force_reset=True)
        )
    )
    # Ray restarts the actor (same worker index, new process); RLlib probes it back in.
    ray.kill(actors[1], no_restart=False)
    new_pid = killed_pid
    for _ in range(30):
        try:
            new_pid = ray.get(actors[1].__ray_call__.remote(lambda runner: os.getpid()), timeout=20)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            continue
        if new_pid != killed_pid:
            break
    assert new_pid != killed_pid
    results.append(algo.train())
    results.append(algo.train())
    algo.stop()
    return {
        "root": root,
        "merged": root / "merged",
        "events": _events(str(log_dir)),
        "results": results,
        "killed_pid": killed_pid,
        "unmetered": unmetered,
    }


def _ends(run: dict[str, Any], evaluation: bool) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in run["events"] if e["event"] == "end" and e["eval"] == evaluation}


def test_recorded_episodes_equal_the_episodes_rllib_played(run):
    recorded = _load(run["merged"], "train")
    played = _ends(run, evaluation=False)
    ids = [e["episode_id"].decode() for e in recorded]
    assert len(ids) == len(set(ids)), "an episode was recorded twice"
    assert set(ids) == set(played)
    for episode in recorded:
        want = played[episode["episode_id"].decode()]
        steps = episode["steps"]
        assert len(steps) == want["length"] + 1
        assert sum(float(s["reward"]) for s in steps) == pytest.approx(want["ret"])
        assert episode["worker_index"] == want["worker"]
    # RLlib's own count of finished training episodes agrees.
    lifetime = run["results"][-1]["env_runners"]["num_episodes_lifetime"]
    assert len(run["unmetered"]) == 1
    assert lifetime == len(recorded) - len(run["unmetered"])


def test_episodes_longer_than_a_fragment_are_joined_from_their_chunks(run):
    recorded = _load(run["merged"], "train")
    long = [e for e in recorded if len(e["steps"]) > 2 * FRAGMENT + 1]
    assert long, "no episode spanned several chunks"
    for episode in recorded:
        steps = episode["steps"]
        # The env's own step counter: no step lost or repeated where chunks join.
        assert [int(s["step_index"]) for s in steps] == list(range(len(steps)))
        assert steps[0]["is_first"] and steps[-1]["is_last"]
        assert not any(s["is_last"] for s in steps[:-1])
        obs = np.stack([s["observation"] for s in steps])
        assert np.isfinite(obs).all()


def test_model_outputs_belong_to_the_step_of_their_action(run):
    for episode in _load(run["merged"], "train"):
        steps = episode["steps"]
        for s in steps[:-1]:
            logits = s["action_dist_inputs"].astype(np.float64)
            log_probs = logits - np.log(np.exp(logits).sum())
            assert s["action_logp"] == pytest.approx(log_probs[s["action"]], abs=1e-4)
        assert steps[-1]["action_logp"] == 0
        assert not steps[-1]["action_dist_inputs"].any()


def test_killed_env_runner_loses_only_its_unfinished_episodes(run):
    killed = [e for e in run["events"] if e["pid"] == run["killed_pid"]]
    started = {e["id"] for e in killed if e["event"] == "start"}
    ended = {e["id"] for e in killed if e["event"] == "end"}
    unfinished = started - ended
    assert ended and unfinished
    recorded = {e["episode_id"].decode() for e in _load(run["merged"], "train")}
    assert ended <= recorded
    assert not unfinished & recorded
    # The restarted runner (same worker index, new process) recorded episodes too.
    restarted = [
        e for e in run["events"]
        if e["event"] == "end" and e["worker"] == 1 and e["pid"] != run["killed_pid"]
    ]  # fmt: skip
    assert restarted and {e["id"] for e in restarted} <= recorded


def test_evaluation_episodes_go_to_the_eval_split(run):
    recorded = _load(run["merged"], "eval")
    played = _ends(run, evaluation=True)
    assert played
    assert {e["episode_id"].decode(): len(e["steps"]) - 1 for e in recorded} == {
        k: v["length"] for k, v in played.items()
    }


def test_writer_figures_show_under_env_runners_in_train_results(run):
    figures = run["results"][-1]["env_runners"]["rlds_writer"]
    # Figures of the killed runner's last sample() die with it.
    recorded = [
        e for e in _load(run["merged"], "train")
        if e["episode_id"].decode() not in run["unmetered"]
    ]  # fmt: skip
    assert figures["episodes_written"] == len(recorded)
    assert figures["steps_written"] == sum(len(e["steps"]) for e in recorded)
    assert figures["bytes_written"] > 0
    assert "episodes_written_throughput" in figures
    eval_figures = run["results"][-1]["evaluation"]["env_runners"]["rlds_writer"]
    # Evaluation results hold the figures of the last evaluation round.
    assert 0 < eval_figures["episodes_written"] <= len(_load(run["merged"], "eval"))


def test_merge_leaves_one_dataset_and_no_runner_directories(run):
    names = sorted(p.name for p in run["root"].iterdir())
    assert names == ["merged"]
    info = json.loads((run["merged"] / "dataset_info.json").read_text())
    assert {s["name"] for s in info["splits"]} == {"train", "eval"}


@pytest.fixture(scope="module")
def local_run(ray_session, tmp_path_factory):
    """A run with the EnvRunner in the driver (num_env_runners=0), runner datasets kept."""
    from ray.rllib.algorithms.ppo import PPOConfig

    root = tmp_path_factory.mktemp("rllib_local") / "out"
    log_dir = tmp_path_factory.mktemp("events_local")
    tracker = type("Tracker", (_Tracker,), {"log_dir": str(log_dir)})
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, rollout_fragment_length=FRAGMENT)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .callbacks([RLDSRecorder.with_options(root, merge=False), tracker])
    )
    algo = config.build_algo()
    results = [algo.train() for _ in range(3)]
    from rlds_writer.record.rllib import finish_recording, recorded_episode_counts

    finished = finish_recording(algo)  # merge=False: returns the runner directories
    counts = recorded_episode_counts(root)  # before stop(): everything is on disk already
    algo.stop()
    return {
        "root": root,
        "events": _events(str(log_dir)),
        "results": results,
        "finished": finished,
        "counts": counts,
    }


def test_local_env_runner_records_whole_episodes_despite_learner_changing_chunks(local_run):
    # With a local EnvRunner the learner's connectors extend and rename the very
    # chunk objects RLlib keeps in `prev_episode_chunks`; the recorder's copies are intact.
    from rlds_writer.record.rllib import runner_directories

    dirs = runner_directories(local_run["root"])
    assert [d.name for d in dirs] == ["writer-00000"]
    builder = tfds.builder_from_directories([os.fspath(d) for d in dirs])
    recorded = {
        e["episode_id"].decode(): e
        for e in tfds.as_numpy(builder.as_dataset(split="train"))
    }  # fmt: skip
    played = _ends(local_run, evaluation=False)
    assert set(recorded) == set(played)
    assert any(v["length"] > 2 * FRAGMENT for v in played.values())
    for episode_id, want in played.items():
        steps = list(recorded[episode_id]["steps"])
        assert len(steps) == want["length"] + 1
        assert sum(float(s["reward"]) for s in steps) == pytest.approx(want["ret"])
    assert local_run["results"][-1]["env_runners"]["num_episodes_lifetime"] == len(recorded)
    assert local_run["finished"] == dirs
    assert local_run["counts"] == {"train": len(recorded)}


def test_an_output_root_holding_recordings_is_refused_without_a_mode(local_run):
    from ray.rllib.algorithms.ppo import PPOConfig

    from rlds_writer.errors import DatasetExistsError

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .callbacks(RLDSRecorder.with_options(local_run["root"], merge=False))
    )
    with pytest.raises(DatasetExistsError, match="writer-00000"):
        config.build_algo()


def test_recorder_options_are_checked():
    with pytest.raises(TypeError, match="unknown RLDSRecorder options"):
        RLDSRecorder.with_options("/tmp/x", info_key=["a"])
    with pytest.raises(ValueError, match="mode='append' with merge=True"):
        RLDSRecorder.with_options("/tmp/x", mode="append")
