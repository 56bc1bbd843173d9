"""Every kind of recorder writes its open episode, cut short, when the interpreter exits."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow_datasets as tfds

import rlds_writer

SCRIPTS = {
    "dm_env": """
        import rlds_writer
        env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=OUT)
        ts = env.reset()
        for _ in range(3):
            ts = env.step(1)
        # no close(): the interpreter exits with the episode open
    """,
    "gymnasium": """
        import gymnasium as gym
        from rlds_writer import RecordRLDS
        env = RecordRLDS(gym.make("CartPole-v1"), OUT, name="cartpole")
        env.reset(seed=0)
        for _ in range(3):
            env.step(0)
    """,
    "vector": """
        import gymnasium as gym
        from rlds_writer import RecordRLDSVector
        env = RecordRLDSVector(gym.make_vec("CartPole-v1", num_envs=2), OUT, name="cartpole")
        env.reset(seed=0)
        for _ in range(3):
            env.step(env.action_space.sample())
    """,
    # A step refused (an action out of range) before the exit: gymnasium's
    # VectorEnv.__del__ then closed it after this package's modules were torn
    # down, printing "Exception ignored ... 'NoneType' object is not callable".
    "vector_refused": """
        import gymnasium as gym
        import numpy as np
        from rlds_writer import RecordRLDSVector
        env = RecordRLDSVector(gym.make_vec("CartPole-v1", num_envs=2), OUT, name="cartpole")
        env.reset(seed=0)
        for _ in range(3):
            env.step(env.action_space.sample())
        try:
            env.step(np.array([0, 7]))
        except Exception:  # refused (here: by the recorder, before CartPole's assert)
            pass
    """,
}


@pytest.fixture(scope="module")
def exited(tmp_path_factory):
    """One interpreter that opens every kind of recorder, each on its own dataset, and exits.

    One process for all: each recorder must write its own open episode, whatever
    the others hold open at exit.
    """
    root = tmp_path_factory.mktemp("exit")
    # Each recorder stays referenced (KEEP) until the interpreter exits.
    # A large library imported first (as a training script does) changes the order
    # the interpreter tears modules down in: torch, or TF, made the above print.
    first = "import torch\n" if importlib.util.find_spec("torch") else ""
    code = (
        first
        + "KEEP = []\n"
        + "".join(
            f"OUT = {str(root / kind)!r}\n" + textwrap.dedent(SCRIPTS[kind]) + "KEEP.append(env)\n"
            for kind in sorted(SCRIPTS)
        )
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr
    return root


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_open_episodes_are_written_cut_short_at_interpreter_exit(exited, kind):
    out = exited / kind
    episodes = list(tfds.builder_from_directory(str(out)).as_dataset(split="train"))
    assert len(episodes) == (2 if kind.startswith("vector") else 1)
    for episode in episodes:
        steps = list(episode["steps"])
        assert len(steps) == 4  # three transitions and the final observation
        assert bool(steps[-1]["is_last"]) and not bool(steps[-1]["is_terminal"])
        assert episode["end_reason"].numpy() == b"cut_short"


def test_a_forked_child_that_exits_leaves_its_parents_recording_alone(tmp_path):
    # The child inherits the parent's open recorder and writer; at its exit it
    # must neither write the parent's open episode into the shared shard nor
    # release the parent's lock.
    code = textwrap.dedent(
        f"""
        import os, sys
        import rlds_writer
        from rlds_writer.store.dataset import layout
        OUT = {str(tmp_path / "ds")!r}
        env = rlds_writer.EnvLogger(rlds_writer.Catch(rows=40, seed=0), data_directory=OUT)

        def record(n):
            for _ in range(n):
                ts = env.reset()
                while not ts.last():
                    ts = env.step(1)

        record(5)
        env.reset()
        env.step(1)  # an episode open at the fork
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: the child's atexit handlers run
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.path.exists(os.path.join(OUT, layout.LOCK)), "the child released the lock"
        record(5)
        env.close()
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert not rlds_writer.recover(tmp_path / "ds").changed
    builder = tfds.builder_from_directory(str(tmp_path / "ds"))
    episodes = list(tfds.as_numpy(builder.as_dataset(split="train")))
    # 5 + the one cut short by the next reset + 5.
    assert len(episodes) == 11
