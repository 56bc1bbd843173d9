"""Datasets written the way RL Unplugged's are: TFDS's own RLDS config, encoder and writer.

`rlds_base.DatasetConfig` with the published features of RL Unplugged's
Atari (`Image(shape=(84, 84, 1))` frames, PNG) and RWRL (rewards and
discounts of shape `(1,)`) datasets, encoded by `FeaturesDict.encode_example`
and written by `tfds.core.SequentialWriter` (`helpers_core.write_with_tfds`).
No rlds_writer code writes them (the exporters tests read them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds
from helpers_core import EpisodeSpec, write_with_tfds
from tensorflow_datasets.rlds import rlds_base

END = "end_reason"  # what rlds_writer's recorders name the episode-level end field


def atari_frames(rng: np.random.Generator, n: int, size: int = 84) -> list[np.ndarray]:
    """Grey frames of Atari's (84, 84, 1) layout: a flat background and a moving block."""
    frames = []
    for t in range(n):
        frame = np.full((size, size, 1), 40, np.uint8)
        frame[(3 * t) % (size - 8) :][:8, 10:18] = 200
        frame[rng.integers(0, size, 5), rng.integers(0, size, 5)] = 255
        frames.append(frame)
    return frames


def write_atari_like(
    path: object,
    lengths: Sequence[int],
    *,
    ends: Sequence[str] | None = None,
    channels: int = 1,
    encoding: str = "png",
    episode_fields: bool = True,
) -> None:
    """RL Unplugged Atari's features; episode `i` has `lengths[i]` RLDS steps.

    `ends` (optional) gives each episode's `end_reason` ("terminated",
    "truncated", "cut_short"), as the recorders write it; `episode_fields=False`
    leaves out RL Unplugged's `episode_id` and `episode_return`.
    """
    rng = np.random.default_rng(len(lengths))
    episode_info = {"episode_id": np.int64, "episode_return": np.float32}
    if not episode_fields:
        episode_info = {}
    if ends is not None:
        episode_info[END] = tfds.features.Text()
    config = rlds_base.DatasetConfig(
        name="atari_like",
        observation_info=tfds.features.Image(
            shape=(84, 84, channels), dtype=np.uint8, encoding_format=encoding
        ),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        episode_metadata_info=episode_info,
    )
    episodes = []
    for i, n in enumerate(lengths):
        frames = atari_frames(rng, n)
        if channels != 1:
            frames = [np.repeat(f, channels, axis=-1) + np.uint8(c) for c, f in enumerate(frames)]
        metadata = {"episode_id": np.int64(100 + i), "episode_return": np.float32(n - 1)}
        if not episode_fields:
            metadata = {}
        if ends is not None:
            metadata[END] = ends[i]
        episodes.append(
            EpisodeSpec(
                observations=frames,
                actions=[np.int64(t % 4) for t in range(n - 1)],
                rewards=[np.float32(1.0)] * (n - 1),
                discounts=[np.float32(1.0)] * (n - 1),
                episode_metadata=metadata,
                terminated=ends is None or ends[i] == "terminated",
            )
        )
    write_with_tfds(path, config, episodes)


def write_rwrl_like(path: object, lengths: Sequence[int], reward_shape: tuple = (1,)) -> None:
    """RL Unplugged RWRL's layout: dict observations, vector actions, `(1,)` rewards."""
    rng = np.random.default_rng(0)
    config = rlds_base.DatasetConfig(
        name="rwrl_like",
        observation_info={
            "position": tfds.features.Tensor(shape=(3,), dtype=np.float32),
            "velocity": tfds.features.Tensor(shape=(2,), dtype=np.float32),
        },
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        reward_info=tfds.features.Tensor(shape=reward_shape, dtype=np.float32),
        discount_info=tfds.features.Tensor(shape=(1,), dtype=np.float32),
    )
    episodes = []
    for n in lengths:
        episodes.append(
            EpisodeSpec(
                observations=[
                    {
                        "position": rng.normal(size=3).astype(np.float32),
                        "velocity": rng.normal(size=2).astype(np.float32),
                    }
                    for _ in range(n)
                ],
                actions=[rng.uniform(-1, 1, 2).astype(np.float32) for _ in range(n - 1)],
                rewards=[rng.random(reward_shape).astype(np.float32) for _ in range(n - 1)],
                discounts=[np.ones(1, np.float32)] * (n - 1),
                terminated=False,
            )
        )
    write_with_tfds(path, config, episodes)
