"""close() of a batched recording: its last batch written by the closing thread."""

from __future__ import annotations

import queue
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from rlds_writer import RecordRLDSVector, open_dataset
from rlds_writer.errors import WriterClosedError
from rlds_writer.store.writing import batch_lane, split_shards, writer

_Queue = queue.Queue


def test_close_writes_the_queued_episodes_on_the_closing_thread_and_lists_them(
    tmp_path, monkeypatch
):
    # The writer thread is held before it takes anything off its queue (as a
    # busy machine holds it): close() must write the episodes cut short itself,
    # not wait for the thread to wake, and list them; the thread still ends.
    gate = threading.Event()

    class HeldQueue(_Queue):
        def get(self, *args, **kwargs):
            if threading.current_thread().name.startswith("rlds_writer["):
                gate.wait(30)
            return super().get(*args, **kwargs)

    appended = []

    def noting_the_thread(write):
        def noted(self, *args):
            appended.append(threading.current_thread().name)
            return write(self, *args)

        return noted

    monkeypatch.setattr(writer.queue, "Queue", HeldQueue)
    for name in ("append_records", "write_run"):  # the records' writes, wherever they go
        write = getattr(split_shards.SplitShards, name)
        monkeypatch.setattr(split_shards.SplitShards, name, noting_the_thread(write))
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    before = set(threading.enumerate())
    env = RecordRLDSVector(env, tmp_path / "ds")
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name.startswith("rlds_w")]
    env.reset(seed=0)
    for _ in range(3):  # CartPole ends no episode in 3 steps
        env.step(np.zeros(4, np.int64))
    threading.Timer(0.2, gate.set).start()  # the thread goes on while close() runs
    env.close()
    assert appended == [threading.current_thread().name]
    assert not thread.is_alive()
    episodes = list(open_dataset(tmp_path / "ds").episodes("train"))
    assert [len(e["steps"]["reward"]) for e in episodes] == [4] * 4
    assert {e["end_reason"] for e in episodes} == {b"cut_short"}


def test_close_while_another_thread_moves_the_lanes_batches_does_not_deadlock(
    tmp_path, monkeypatch
):
    # flush() on one thread moves the lane's batches to the writer's queue holding
    # the lane's lock, then takes the queue's mutex; close() on another took the
    # queue's mutex and then the lane's lock: each waited for the other forever.
    _recorded(tmp_path / "reference").close()
    # The writer thread never takes from the lane here: every batch waits there.
    monkeypatch.setattr(batch_lane.BatchLane, "take", lambda self: [])
    env = _recorded(tmp_path / "ds")
    lane = env.recorder.writer.lane
    assert lane.waiting
    moving = threading.Event()
    pop_all = lane._pop_all

    def slow_pop_all():
        moving.set()
        time.sleep(0.5)  # close() takes its locks meanwhile
        return pop_all()

    monkeypatch.setattr(lane, "_pop_all", slow_pop_all)

    def flush():
        try:
            env.recorder.writer.flush()
        except WriterClosedError:  # it ended after close() did: what it moved is written
            pass

    flushing = threading.Thread(target=flush, daemon=True)
    flushing.start()
    assert moving.wait(30)
    closing = threading.Thread(target=env.close, daemon=True)
    closing.start()
    closing.join(30)
    flushing.join(30)
    assert not closing.is_alive() and not flushing.is_alive()

    def lengths(name):
        return [len(e["steps"]["reward"]) for e in open_dataset(tmp_path / name).episodes("train")]

    assert lengths("ds") == lengths("reference")


def _recorded(path):
    env = RecordRLDSVector(
        gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="vector_entry_point"), path
    )
    env.reset(seed=0)
    for action in np.random.default_rng(0).integers(0, 2, (60, 8)):
        env.step(action)
    return env


class _SlowStep(gym.vector.VectorEnv):
    """Two sub-envs whose 3rd step asks another thread to close the recorder, then takes
    a while: a close() then ran in the middle of the step (stress runs: a frame chunk's
    handle read before the step stored it, `TypeError` and the open episodes lost)."""

    def __init__(self):
        self.num_envs = 2
        self.single_observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 2)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.t = 0
        self.recorder = None
        self.closer: threading.Thread | None = None

    def reset(self, *, seed=None, options=None):
        return np.zeros((2, 3), np.float32), {}

    def step(self, actions):
        self.t += 1
        if self.t == 3:
            self.closer = threading.Thread(target=self.recorder.close)
            self.closer.start()
            time.sleep(0.3)  # room for a close() that does not wait for this step
        obs = np.full((2, 3), self.t / 10, np.float32)
        return obs, np.ones(2), np.zeros(2, bool), np.zeros(2, bool), {}


def test_close_from_another_thread_waits_for_the_step_in_progress(tmp_path):
    inner = _SlowStep()
    env = RecordRLDSVector(inner, tmp_path / "ds")
    inner.recorder = env
    env.reset(seed=0)
    env.step(np.zeros(2, np.int64))
    env.step(np.zeros(2, np.int64))
    env.step(np.zeros(2, np.int64))  # close() began meanwhile: this step is recorded whole
    inner.closer.join(30)
    with pytest.raises(WriterClosedError, match="closed"):
        env.step(np.zeros(2, np.int64))  # refused after close(), naming the recorder
    episodes = list(open_dataset(tmp_path / "ds")["train"])
    assert [len(e["steps"]["observation"]) for e in episodes] == [4, 4]  # reset + 3 steps
    assert all(e["end_reason"] == b"cut_short" for e in episodes)


def test_a_rollout_written_after_close_is_refused_with_the_projects_error(tmp_path):
    from rlds_writer.record.batch.rollout import RolloutRecorder

    rec = RolloutRecorder(tmp_path / "ds")
    rec.close()
    with pytest.raises(WriterClosedError, match="RolloutRecorder of .* is closed"):
        rec.write(
            observation=np.zeros((1, 2)),
            action=np.zeros((1, 2)),
            reward=np.zeros((1, 2)),
            terminated=np.zeros((1, 2), bool),
        )  # a RuntimeError, not the project's, before
