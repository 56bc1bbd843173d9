"""A forked child that records with its parent's recorder is refused; the parent loses nothing.

A child of `os.fork()` shares the parent's open shard descriptors, and with
them the file offset: an episode it wrote went into the middle of the
parent's shard, whose `close()` then cut it where it thought its records
ended (14 of 17 episodes read back). Now the child's first `reset`, the end
of an episode it stepped, `flush` and `close` raise `ForkedRecorderError`,
and the parent's dataset holds exactly the parent's episodes, with nothing
for `recover` to repair.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow_datasets as tfds

import rlds_writer
from rlds_writer.record import step_kernel
from rlds_writer.store.dataset import layout

# The parent records 8 episodes, forks with one open, and records 8 more; the
# child tries every way of writing. One line per refusal on the child's stdout.
_DM_ENV = """
import os, sys
import rlds_writer
from rlds_writer.errors import ForkedRecorderError
from rlds_writer.record import appender
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats.tfrecord import write_ahead
appender.COMPILE_AFTER = 0  # the compiled Python step from the first step
if {zeros_here}:
    write_ahead.ZeroAhead = None  # zeros written on the recording thread, no zeros thread
OUT = {out!r}
env = rlds_writer.EnvLogger(rlds_writer.Catch(rows=40, seed=0), data_directory=OUT)

def record(n):
    for _ in range(n):
        ts = env.reset()
        while not ts.last():
            ts = env.step(1)

def refused(what, fn):
    try:
        fn()
    except ForkedRecorderError as e:
        print("refused", what, "|", e, flush=True)
    else:
        print("accepted", what, flush=True)

record(8)
env.reset()
env.step(1)  # an episode open at the fork, with its steps in the shard's future
pid = os.fork()
if pid == 0:
    try:
        def finish_open_episode():  # the inherited episode, stepped to its end
            ts = env.step(1)
            while not ts.last():
                ts = env.step(1)
        refused("end", finish_open_episode)
        refused("reset", lambda: record(3))
        refused("flush", env.flush)
        refused("close", env.close)
    finally:
        sys.stdout.flush()
        os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
assert os.path.exists(os.path.join(OUT, layout.LOCK)), "the child released the lock"
record(8)
env.close()
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def _episodes(path) -> list:
    builder = tfds.builder_from_directory(str(path))
    return list(tfds.as_numpy(builder.as_dataset(split="train")))


@pytest.mark.parametrize("zeros", ["thread", "here"])
def test_a_forked_child_recording_with_its_parents_env_logger_is_refused_the_parent_loses_nothing(
    tmp_path, step_path, zeros
):
    out = tmp_path / "ds"
    code = textwrap.dedent(_DM_ENV).format(out=str(out), zeros_here=zeros == "here")
    result = _run(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "refused end",
        "refused reset",
        "refused flush",
        "refused close",
    ], result.stdout + result.stderr
    assert "a forked child" in lines[0] and "data_directory of its own" in lines[0]
    assert not rlds_writer.recover(out).changed
    episodes = _episodes(out)
    # 8, the one open at the fork (cut short by the next reset), 8: all the parent's.
    assert len(episodes) == 17
    assert [len(e["steps"]) for e in episodes].count(2) == 1  # the cut-short one
    assert all(len(e["steps"]) == 40 for e in episodes if len(e["steps"]) != 2)


def test_a_forked_child_that_only_closes_its_copy_leaves_the_parent_alone(tmp_path):
    # A child that never recorded (it inherited the env with the rest of the
    # parent's memory) may close it: nothing is written, nothing unlocked.
    out = tmp_path / "ds"
    code = textwrap.dedent(
        f"""
        import os
        import rlds_writer
        from rlds_writer.store.dataset import layout
        env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory={str(out)!r})
        ts = env.reset()
        while not ts.last():
            ts = env.step(1)
        env.reset()
        env.step(1)
        pid = os.fork()
        if pid == 0:
            env.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.exists(os.path.join({str(out)!r}, layout.LOCK))
        ts = env.step(1)
        while not ts.last():
            ts = env.step(1)
        env.close()
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert not rlds_writer.recover(out).changed
    assert len(_episodes(out)) == 2
    assert not (out / layout.LOCK).exists()


@pytest.mark.skipif(not step_kernel.available(), reason="the C step is not built")
def test_a_multiprocessing_fork_worker_stepping_an_inherited_gymnasium_recorder_is_refused(
    tmp_path,
):
    out = tmp_path / "ds"
    code = textwrap.dedent(
        f"""
        import multiprocessing as mp
        import gymnasium as gym
        from rlds_writer import RecordRLDS
        from rlds_writer.errors import ForkedRecorderError
        env = RecordRLDS(gym.make("CartPole-v1"), {str(out)!r}, name="cartpole")

        def episodes(n, seed):
            for i in range(n):
                env.reset(seed=seed + i)
                done = False
                while not done:
                    _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                    done = terminated or truncated

        def worker(queue):
            try:
                episodes(3, 100)
            except ForkedRecorderError as e:
                queue.put("refused: " + str(e))
            else:
                queue.put("accepted")

        if __name__ == "__main__":
            env.action_space.seed(0)
            episodes(5, 0)
            ctx = mp.get_context("fork")
            queue = ctx.Queue()
            child = ctx.Process(target=worker, args=(queue,))
            child.start()
            print(queue.get(timeout=60), flush=True)
            child.join(60)
            episodes(5, 50)
            env.close()
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("refused: "), result.stdout + result.stderr
    assert not rlds_writer.recover(out).changed
    assert len(_episodes(out)) == 10
