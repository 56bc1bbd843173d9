"""One recorder records one env loop: a second thread's steps are refused, nothing is lost.

Two threads stepping one recorder used to interleave their appends in the
same columns, and now and then an episode was lost at its end to
`internal: column steps/observation has N values for M steps`. The thread
that begins an episode (`reset`) owns it; a step from another thread raises
`RecorderThreadError` before the env is touched (in the C step and in the
Python step), and the episode goes on as if it had not been tried. A thread
that resets takes the recorder over.
"""

from __future__ import annotations

import threading

import dm_env
import gymnasium as gym
import numpy as np
from dm_env import specs
from helpers_core import load_episodes

import rlds_writer
from rlds_writer.errors import RecorderThreadError

LENGTH = 40  # steps per episode


class _CounterEnv(dm_env.Environment):
    """Observes the step count: an episode's observations are 0..LENGTH, in order."""

    def __init__(self) -> None:
        self.t = 0

    def reset(self) -> dm_env.TimeStep:
        self.t = 0
        return dm_env.restart(np.array([0.0], np.float32))

    def step(self, action) -> dm_env.TimeStep:
        if self.t >= LENGTH:
            return self.reset()
        self.t += 1
        obs = np.array([self.t], np.float32)
        return dm_env.termination(1.0, obs) if self.t == LENGTH else dm_env.transition(1.0, obs)

    def observation_spec(self):
        return specs.Array((1,), np.float32, "observation")

    def action_spec(self):
        return specs.BoundedArray((), np.int64, 0, 2, "action")


class _CounterGym(gym.Env):
    """The same as a Gymnasium env: truncated after LENGTH steps."""

    observation_space = gym.spaces.Box(0, LENGTH, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, False, self.t >= LENGTH, {}


def _record_with_an_intruder(reset, step, episodes: int) -> dict:
    """Records `episodes` on this thread while another thread tries to step mid-episode.

    The other thread steps only while this one is inside an episode (`gate`):
    a step between episodes would be a reset, which takes the recorder over.
    """
    gate, stop, tried = threading.Lock(), threading.Event(), threading.Event()
    outcome = {"refused": 0, "accepted": 0}

    def intrude() -> None:
        while not stop.is_set():
            if not gate.acquire(timeout=0.01):
                continue
            if stop.is_set():  # the gate was opened to let this thread end
                gate.release()
                return
            try:
                step()
            except RecorderThreadError as e:
                outcome["refused"] += 1
                outcome["message"] = str(e)
            except Exception as e:  # noqa: BLE001 - anything else fails the test
                outcome["other"] = repr(e)
                return
            else:
                outcome["accepted"] += 1
            finally:
                gate.release()
                tried.set()

    gate.acquire()
    intruder = threading.Thread(target=intrude, name="intruder")
    intruder.start()
    try:
        for _ in range(episodes):
            reset()
            tried.clear()
            gate.release()  # mid-episode: the intruder may try
            for i in range(LENGTH - 1):
                step()
                if i == LENGTH // 2:
                    tried.wait(10)  # at least one try in every episode
            gate.acquire()  # its last step, and the next reset, are this thread's alone
            step()
    finally:
        stop.set()
        gate.release()
        intruder.join(30)
    return outcome


def _assert_whole(path, episodes: int, outcome: dict) -> None:
    assert "other" not in outcome, outcome["other"]
    assert outcome["refused"] > 0 and outcome["accepted"] == 0, outcome
    assert "'intruder' in an episode another thread records" in outcome["message"]
    loaded = load_episodes(path)
    assert len(loaded) == episodes
    for episode in loaded:  # every step of the owner, none of the intruder's, in order
        observed = [float(step["observation"][0]) for step in episode["steps"]]
        assert observed == list(range(LENGTH + 1))


def test_a_second_thread_stepping_an_env_logger_is_refused_and_no_episode_is_lost(
    tmp_path, step_path
):
    env = rlds_writer.EnvLogger(_CounterEnv(), data_directory=tmp_path)
    outcome = _record_with_an_intruder(env.reset, lambda: env.step(1), episodes=10)
    env.close()
    _assert_whole(tmp_path, 10, outcome)


def test_a_second_thread_stepping_a_gymnasium_recorder_is_refused_and_no_episode_is_lost(
    tmp_path, step_path
):
    env = rlds_writer.RecordRLDS(_CounterGym(), tmp_path, name="counter")
    outcome = _record_with_an_intruder(env.reset, lambda: env.step(1), episodes=10)
    env.close()
    _assert_whole(tmp_path, 10, outcome)


def test_a_thread_that_resets_takes_the_recorder_over(tmp_path, step_path):
    # Made on one thread, recorded on another, then on a third: each resets first.
    env = rlds_writer.EnvLogger(_CounterEnv(), data_directory=tmp_path)

    def record(n: int) -> None:
        for _ in range(n):
            ts = env.reset()
            while not ts.last():
                ts = env.step(0)

    for n in (2, 3):
        worker = threading.Thread(target=record, args=(n,))
        worker.start()
        worker.join(30)
    record(1)
    env.close()
    assert [len(e["steps"]) for e in load_episodes(tmp_path)] == [LENGTH + 1] * 6


def test_threads_with_a_recorder_each_record_side_by_side(tmp_path, step_path):
    def record(i: int) -> None:
        env = rlds_writer.EnvLogger(_CounterEnv(), data_directory=tmp_path / str(i))
        for _ in range(5):
            ts = env.reset()
            while not ts.last():
                ts = env.step(1)
        env.close()

    threads = [threading.Thread(target=record, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i in range(2):
        assert [len(e["steps"]) for e in load_episodes(tmp_path / str(i))] == [LENGTH + 1] * 5
