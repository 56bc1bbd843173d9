"""Record Gymnasium episodes (a single env and a vector env) as RLDS datasets.

    python examples/gymnasium_record.py --output /tmp/gym_rlds --episodes 20

Writes `<output>/cartpole` (one CartPole env, with a discount column and the
step counter from `info` as step metadata) and `<output>/cartpole_vector`
(4 CartPole sub-envs, `same_step` autoreset), then loads both back with
`tfds.builder_from_directory` and prints what they hold.
"""

from __future__ import annotations

import argparse
import os

import gymnasium as gym
import numpy as np

from rlds_writer.record.gymnasium import RecordRLDS
from rlds_writer.record.gymnasium.gymnasium_vector import RecordRLDSVector


class StepCounter(gym.Wrapper):
    """Puts the step index into `info` (custom env data to record)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.t = 0
        return obs, {**info, "t": self.t}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, truncated, {**info, "t": self.t}


def record_single(path: str, episodes: int, seed: int) -> None:
    env = RecordRLDS(
        StepCounter(gym.make("CartPole-v1")),
        path,
        name="cartpole",
        discount=True,
        info_keys=["t"],
        episode_fn=lambda obs, action, reward, te, tr, info: {"length": info["t"]},
        metadata={"policy": "uniform random"},
        mode="overwrite",
    )
    env.action_space.seed(seed)
    for i in range(episodes):
        env.reset(seed=seed + i)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.close()


def record_vector(path: str, steps: int, seed: int) -> None:
    venv = gym.make_vec(
        "CartPole-v1",
        num_envs=4,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    env = RecordRLDSVector(venv, path, name="cartpole_vector", mode="overwrite")
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        env.step(rng.integers(0, 2, size=4))
    env.close()  # episodes still running are recorded as cut short


def describe(path: str) -> None:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(path)
    lengths = [
        int(episode["steps"].cardinality())
        for episode in builder.as_dataset(split="train")
    ]  # fmt: skip
    print(f"{path}: {len(lengths)} episodes, {sum(lengths)} steps, lengths {lengths[:10]}...")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="/tmp/gym_rlds")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    single = os.path.join(args.output, "cartpole")
    vector = os.path.join(args.output, "cartpole_vector")
    record_single(single, args.episodes, args.seed)
    record_vector(vector, 200, args.seed)
    describe(single)
    describe(vector)


if __name__ == "__main__":
    main()
