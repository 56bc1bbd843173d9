"""EnvPool's sync and async APIs recorded: each sub-env's episodes, aligned with its raw results."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

envpool = pytest.importorskip("envpool")

from rlds_writer.record.batch.envpool import RecordRLDSEnvPool  # noqa: E402

N = 4


def _make(path, batch_size: int | None = None) -> RecordRLDSEnvPool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EnvPool's Box bounds, cast to float32
        kwargs = {"batch_size": batch_size} if batch_size else {}
        env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=N, seed=3, **kwargs)
        return RecordRLDSEnvPool(env, path, info_keys=["elapsed_step"])


class _Reference:
    """Each sub-env's episodes built from the raw results (EnvPool resets at the next step)."""

    def __init__(self):
        self.open: dict[int, dict] = {}
        self.done: list[dict] = []
        self.pending = set(range(N))

    def results(self, ids, actions, obs, rewards, terms, truncs):
        for row, i in enumerate(ids.tolist()):
            if i in self.pending:
                self.open[i] = {"obs": [obs[row]], "actions": [], "rewards": []}
                self.pending.discard(i)
                continue
            ep = self.open[i]
            ep["actions"].append(int(actions[i]))
            ep["rewards"].append(float(rewards[row]))
            ep["obs"].append(obs[row])
            if terms[row] or truncs[row]:
                ep["reason"] = b"terminated" if terms[row] else b"truncated"
                self.done.append(self.open.pop(i))
                self.pending.add(i)

    def episodes(self) -> list[dict]:
        return self.done + [{**ep, "reason": b"cut_short"} for ep in self.open.values()]


def _check(path, want: list[dict]) -> None:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(path))
    got = list(tfds.as_numpy(builder.as_dataset(split="train")))
    assert len(got) == len(want) > 10
    by_key = {(np.asarray(w["obs"][0]).tobytes(), len(w["obs"])): w for w in want}
    for episode in got:
        steps = list(episode["steps"])
        w = by_key.pop((steps[0]["observation"].tobytes(), len(steps)))
        np.testing.assert_array_equal(np.stack([s["observation"] for s in steps]), w["obs"])
        assert [int(s["action"]) for s in steps[:-1]] == w["actions"]
        assert [float(s["reward"]) for s in steps[:-1]] == w["rewards"]
        # EnvPool's own step counter: 0 at the reset, then one per step.
        assert [int(s["elapsed_step"]) for s in steps] == list(range(len(steps)))
        assert episode["end_reason"] == w["reason"]
        assert bool(steps[-1]["is_terminal"]) == (w["reason"] == b"terminated")
    assert not by_key


def test_envpool_sync_api_records_every_sub_env_episode(tmp_path):
    env = _make(tmp_path / "ds")
    ref = _Reference()
    obs, info = env.reset()
    ref.results(info["env_id"], None, obs, None, None, None)
    rng = np.random.default_rng(0)
    for _ in range(120):
        actions = rng.integers(0, 2, N).astype(np.int32)
        obs, rew, te, tr, info = env.step(actions)
        ref.results(info["env_id"], actions, obs, rew, te, tr)
    env.close()
    _check(tmp_path / "ds", ref.episodes())


def test_envpool_async_send_recv_records_every_sub_env_episode(tmp_path):
    env = _make(tmp_path / "ds", batch_size=2)
    ref = _Reference()
    sent = np.zeros(N, np.int32)
    rng = np.random.default_rng(1)
    env.async_reset()
    for _ in range(250):
        obs, rew, te, tr, info = env.recv()
        ids = info["env_id"]
        ref.results(ids, sent, obs, rew, te, tr)
        actions = rng.integers(0, 2, len(ids)).astype(np.int32)
        sent[ids] = actions
        env.send(actions, ids)
    env.close()
    _check(tmp_path / "ds", ref.episodes())


@pytest.mark.parametrize(
    "env_id, message",
    [
        ([0, 0, 1], "distinct"),  # EnvPool would step sub-env 0 twice
        ([0, 1, N], "ids in 0"),
        ([-1, 0, 1], "ids in 0"),  # EnvPool aborts the process on this one
        ([0.0, 1.0, 2.0], "expected int"),
        ([0, 1], "expected int"),
    ],
)
def test_bad_env_ids_are_refused_before_envpool_sees_them(tmp_path, env_id, message):
    from rlds_writer.errors import StepValueError

    env = _make(tmp_path / "ds", batch_size=3)
    env.async_reset()
    env.recv()
    with pytest.raises(StepValueError, match=f"env_id.*{message}"):
        env.send(np.zeros(3, np.int32), np.array(env_id))
    env.close()


@pytest.mark.parametrize(
    "action, with_ids, message",
    [
        (np.full(3, 0.7), True, r"expected int\d+ actions, got float64\[3\], which does not cast"),
        (np.zeros((3, 2), np.int32), True, r"expected a batch int\d+\[3\] .* got int32\[3,2\]"),
        (np.zeros(3, np.int32), False, r"expected a batch int\d+\[4\] .*every sub-env"),
        # EnvPool steps CartPole with it; it was recorded as given.
        (np.array([0, 5, 1], np.int32), True, r"expected actions in 0\.\.1 .*got 5 at \[1\]"),
    ],
    ids=["float", "shape", "no-env_id", "out-of-range"],
)
def test_bad_actions_are_refused_by_field_and_nothing_written_is_lost(
    tmp_path, action, with_ids, message
):
    # They reached EnvPool (a float cast to an int action and recorded so) or numpy's
    # own broadcasting error.
    from rlds_writer.errors import StepValueError

    env = _make(tmp_path / "ds", batch_size=3)
    env.async_reset()
    for _ in range(30):
        info = env.recv()[-1]
        env.send(np.ones(3, np.int32), info["env_id"])
    info = env.recv()[-1]
    env.flush()
    written = env.recorder.episodes_written
    with pytest.raises(StepValueError, match=f"^steps/action: {message}"):
        env.send(action, info["env_id"] if with_ids else None)
    env.send(np.ones(3, np.int32), info["env_id"])  # the run goes on
    env.recv()
    env.close()
    assert written and env.recorder.episodes_written >= written + N
