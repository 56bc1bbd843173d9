"""What the batch recorder's tests share: an env with every episode length, and shard records."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.writing.batch_lane import LANE
from rlds_writer.store.writing.batch_records import EpisodeBatch


class Hops(gym.Env):
    """Episodes of random lengths, 1 step included, a long one now and then.

    Observations float32[3], Box actions float32[2], float rewards; info
    `t` (the step in the episode) and `x` (a float). An episode ends by
    termination or truncation at random.
    """

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        rng = self.np_random
        self.t = 0
        self.length = int(rng.choice([1, 1, 2, 3, 5, 8, 80]))
        self.terminates = bool(rng.integers(2))
        return self._obs(), {"t": 0, "x": float(rng.random())}

    def _obs(self):
        return self.np_random.standard_normal(3).astype(np.float32)

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        reward = float(np.sum(action)) + self.t
        info = {"t": self.t, "x": float(self.np_random.random())}
        return self._obs(), reward, done and self.terminates, done and not self.terminates, info


def waiting_batches(writer: Any) -> list[EpisodeBatch]:
    """The batches handed over to `writer` and not taken by its thread, in order: on
    its queue (alone, or moved there off the batch lane), then on the lane."""
    out = []
    for kind, payload in writer._queue.queue:
        out += [b for _, b in payload] if kind is LANE else [payload]
    out += [b for _, b in writer.lane._items]
    return [b for b in out if type(b) is EpisodeBatch]


def records(path: Path) -> collections.Counter:
    """Every TFRecord record of a dataset directory, as a multiset of bytes."""
    out: collections.Counter = collections.Counter()
    for shard in sorted(Path(path).glob("*.tfrecord-*")):
        with open(shard, "rb") as f:
            out.update(data for _, data in tfrecord.iter_records(f))
    return out


def play_alone(
    make_env: Any,
    path: Path,
    seed: int,
    actions: list[Any],
    autoreset: str,
    reset_after: list[bool] | None = None,
    **options: Any,
) -> None:
    """Records sub-env `i` alone with `RecordRLDS`, playing the actions it received.

    `autoreset` is the vector env's mode: `NextStep` (the step after an
    episode's end is its reset, the action ignored), `SameStep` (reset at
    once), `Disabled` (reset where `reset_after[t]`).
    """
    from rlds_writer import RecordRLDS

    env = RecordRLDS(make_env(), path, **options)
    env.reset(seed=seed)
    pending = False
    for t, action in enumerate(actions):
        if pending:
            env.reset()
            pending = False
            continue
        if autoreset == "Disabled" and reset_after is not None and t and reset_after[t - 1]:
            env.reset()
        _, _, te, tr, _ = env.step(action)
        if te or tr:
            if autoreset == "NextStep":
                pending = True
            elif autoreset == "SameStep":
                env.reset()
    env.close()


class Camera(Hops):
    """`Hops` whose observation is a uint8 camera frame (32x32 RGB)."""

    observation_space = gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)

    def _obs(self):
        return self.np_random.integers(0, 256, (32, 32, 3), dtype=np.uint8)


class WideCamera(Hops):
    """`Hops` whose observation is a 48x64 RGB frame: 9,216 bytes, a raw-bytes row
    the batch recorder copies into a `bytes` of its own at the step (`frames.py`)."""

    observation_space = gym.spaces.Box(0, 255, (48, 64, 3), np.uint8)

    def _obs(self):
        frame = self.np_random.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        frame[-1, -4:] = 0  # a frame ending in zero bytes is kept whole
        return frame


class Words(Hops):
    """`Hops` whose observation is a dict of a float32[3] and a `Text` word, and whose
    info has a str `said` (text fields, kept per sub-env by the batch recorder)."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10.0, 10.0, (3,), np.float32),
            "word": gym.spaces.Text(8),
        }
    )

    def _obs(self):
        rng = self.np_random
        word = "".join(rng.choice(list("abcdefgh"), int(rng.integers(1, 9))))
        return {"pos": rng.standard_normal(3).astype(np.float32), "word": word}

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs, {**info, "said": obs["word"] * 2}

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "said": obs["word"] * 2}
