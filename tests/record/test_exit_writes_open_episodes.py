"""Every kind of recorder writes its open episode, cut short, when the interpreter exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow_datasets as tfds

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
}


@pytest.fixture(scope="module")
def exited(tmp_path_factory):
    """One interpreter that opens every kind of recorder, each on its own dataset, and exits.

    One process for all: each recorder must write its own open episode, whatever
    the others hold open at exit.
    """
    root = tmp_path_factory.mktemp("exit")
    # Each recorder stays referenced (KEEP) until the interpreter exits.
    code = "KEEP = []\n" + "".join(
        f"OUT = {str(root / kind)!r}\n" + textwrap.dedent(SCRIPTS[kind]) + "KEEP.append(env)\n"
        for kind in sorted(SCRIPTS)
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return root


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_open_episodes_are_written_cut_short_at_interpreter_exit(exited, kind):
    out = exited / kind
    episodes = list(tfds.builder_from_directory(str(out)).as_dataset(split="train"))
    assert len(episodes) == (2 if kind == "vector" else 1)
    for episode in episodes:
        steps = list(episode["steps"])
        assert len(steps) == 4  # three transitions and the final observation
        assert bool(steps[-1]["is_last"]) and not bool(steps[-1]["is_terminal"])
        assert episode["end_reason"].numpy() == b"cut_short"
