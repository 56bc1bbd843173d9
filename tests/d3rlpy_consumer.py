"""Runs in the d3rlpy consumer venv (tests/consumer_venv.py), not under pytest.

    python d3rlpy_consumer.py load FILE.h5 OUT.npz       # ReplayBuffer.load, dumped as arrays
    python d3rlpy_consumer.py to_d3rlpy SRC OUT.npz      # rlds_writer.interop.to_d3rlpy, same dump
    python d3rlpy_consumer.py train FILE.h5 OUT.json     # DiscreteBC on CartPole expert data
    python d3rlpy_consumer.py fit FILE.h5 OUT.json       # a few DiscreteBC steps, any data

The dump holds each episode's arrays and flag as d3rlpy sees them, and every
transition d3rlpy's own `BasicTransitionPicker` makes of them; the tests
compare those with the source dataset.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def expert_action(observation: np.ndarray) -> int:
    """The CartPole rule the tests record (push towards where the pole falls)."""
    return int(3.0 * observation[2] + observation[3] > 0)


def _stack(values: list) -> np.ndarray | list[np.ndarray]:
    if isinstance(values[0], (list, tuple)):
        return [np.stack([v[j] for v in values]) for j in range(len(values[0]))]
    return np.stack(values)


def _put(arrays: dict, name: str, value) -> None:
    if isinstance(value, list):
        for j, part in enumerate(value):
            arrays[f"{name}_{j}"] = part
    else:
        arrays[name] = value


def dump(buffer, out: str) -> None:
    info = {
        "action_space": buffer.dataset_info.action_space.name,
        "action_size": int(buffer.dataset_info.action_size),
        "transition_count": int(buffer.transition_count),
        "episodes": [],
    }
    arrays: dict = {}
    columns: dict = {k: [] for k in ("observation", "action", "reward", "next", "terminal")}
    for i, episode in enumerate(buffer.episodes):
        observations = episode.observations
        _put(
            arrays,
            f"episode{i}_observations",
            list(observations) if isinstance(observations, (list, tuple)) else observations,
        )
        arrays[f"episode{i}_actions"] = episode.actions
        arrays[f"episode{i}_rewards"] = episode.rewards
        info["episodes"].append(
            {
                "size": int(episode.size()),
                "terminated": bool(episode.terminated),
                "transition_count": int(episode.transition_count),
            }
        )
        for t in range(episode.transition_count):
            transition = buffer.transition_picker(episode, t)
            columns["observation"].append(transition.observation)
            columns["action"].append(transition.action)
            columns["reward"].append(transition.reward)
            columns["next"].append(transition.next_observation)
            columns["terminal"].append(transition.terminal)
    for key, values in columns.items():
        _put(arrays, f"transition_{key}", _stack(values))
    buffer.sample_transition_batch(8)  # what every Q-learning algorithm calls
    arrays["info"] = np.array(json.dumps(info))
    np.savez(out, **arrays)


def train(path: str, out: str) -> None:
    import d3rlpy
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)  # far faster than 2 threads on a shared 2-core machine
    d3rlpy.seed(0)
    dataset = d3rlpy.dataset.ReplayBuffer.load(path, d3rlpy.dataset.InfiniteBuffer())
    bc = d3rlpy.algos.DiscreteBCConfig(batch_size=64).create(device="cpu:0")
    bc.build_with_dataset(dataset)

    # Held-out states: where a random policy takes CartPole (not in the expert data).
    env = gym.make("CartPole-v1")
    env.action_space.seed(7)
    states = []
    for seed in range(100, 130):
        observation, _ = env.reset(seed=seed)
        done = False
        while not done:
            states.append(observation)
            observation, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    states = np.asarray(states, np.float32)
    expert = np.array([expert_action(s) for s in states])

    def evaluate() -> dict:
        with torch.no_grad():
            logits = bc.impl.modules.imitator(torch.from_numpy(states)).logits
        probability = torch.softmax(logits, dim=1).numpy()[np.arange(len(states)), expert]
        return {
            "accuracy": float(np.mean(bc.predict(states) == expert)),
            "expert_probability": float(np.mean(probability)),
        }

    before = evaluate()
    bc.fit(
        dataset,
        n_steps=300,
        n_steps_per_epoch=300,
        show_progress=False,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    after = evaluate()
    returns = {}
    for name, act in (
        ("bc", lambda o: int(bc.predict(o[None].astype(np.float32))[0])),
        ("random", lambda o: int(env.action_space.sample())),
    ):
        total = 0.0
        for seed in range(200, 205):
            observation, _ = env.reset(seed=seed)
            done = False
            while not done:
                observation, reward, terminated, truncated, _ = env.step(act(observation))
                total += reward
                done = terminated or truncated
        returns[name] = total / 5
    with open(out, "w") as f:
        json.dump({"before": before, "after": after, "returns": returns}, f)


def fit(path: str, out: str) -> None:
    """A few DiscreteBC steps with d3rlpy's default encoder: proves the shapes fit it."""
    import d3rlpy

    dataset = d3rlpy.dataset.ReplayBuffer.load(path, d3rlpy.dataset.InfiniteBuffer())
    bc = d3rlpy.algos.DiscreteBCConfig(batch_size=4).create(device="cpu:0")
    bc.fit(
        dataset,
        n_steps=3,
        n_steps_per_epoch=3,
        show_progress=False,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    with open(out, "w") as f:
        json.dump(
            {
                "observation_shape": list(dataset.dataset_info.observation_signature.shape[0]),
                "encoder": type(bc.impl.modules.imitator._encoder).__name__,
            },
            f,
        )


def main(argv: list[str]) -> None:
    import d3rlpy

    command, source, out = argv
    if command == "load":
        dump(d3rlpy.dataset.ReplayBuffer.load(source, d3rlpy.dataset.InfiniteBuffer()), out)
    elif command == "to_d3rlpy":
        import rlds_writer

        dataset = rlds_writer.interop.to_d3rlpy(source)
        assert isinstance(dataset, d3rlpy.dataset.MDPDataset), type(dataset)
        dump(dataset, out)
    elif command == "train":
        train(source, out)
    elif command == "fit":
        fit(source, out)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
