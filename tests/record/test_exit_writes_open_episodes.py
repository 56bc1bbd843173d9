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


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_open_episodes_are_written_cut_short_at_interpreter_exit(tmp_path, kind):
    out = tmp_path / "ds"
    code = f"OUT = {str(out)!r}\n" + textwrap.dedent(SCRIPTS[kind])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    episodes = list(tfds.builder_from_directory(str(out)).as_dataset(split="train"))
    assert len(episodes) == (2 if kind == "vector" else 1)
    for episode in episodes:
        steps = list(episode["steps"])
        assert len(steps) == 4  # three transitions and the final observation
        assert bool(steps[-1]["is_last"]) and not bool(steps[-1]["is_terminal"])
        assert episode["end_reason"].numpy() == b"cut_short"
