"""Helpers shared by the core writer tests.

They load datasets the way a user does (`tfds.builder_from_directory`), write
reference datasets through TFDS's own path (`rlds_base.build_info`,
`FeaturesDict.encode_example`, `ExampleSerializer` inside
`tfds.core.SequentialWriter`), and compare decoded values exactly.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass
class EpisodeSpec:
    """One episode as a user would feed it to a recorder.

    `observations` has one more entry than `actions`: o_0 .. o_T and a_0 ..
    a_{T-1}, with `rewards[t]`/`discounts[t]` following `actions[t]`.
    `step_metadata`, if given, has one entry per observation.
    """

    observations: list[Any]
    actions: list[Any]
    rewards: list[Any]
    discounts: list[Any]
    step_metadata: list[Any] | None = None
    episode_metadata: Mapping[str, Any] | None = None
    terminated: bool = True


def load_episodes(path: Any, split: str = "train") -> list[dict[str, Any]]:
    """Loads every episode of a split as numpy, steps as a list of step dicts."""
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(path))
    out = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split)):
        episode = dict(episode)
        episode["steps"] = [dict(step) for step in episode["steps"]]
        out.append(episode)
    return out


def spec_zero(feature: Any) -> Any:
    """Zero of a feature built independently of rlds_writer (reference side)."""
    import tensorflow_datasets as tfds

    if isinstance(feature, Mapping | tfds.features.FeaturesDict):
        return {k: spec_zero(v) for k, v in feature.items()}
    if isinstance(feature, tfds.features.Text):
        return ""
    if not isinstance(feature, tfds.features.FeatureConnector):
        feature = tfds.features.Tensor(shape=(), dtype=feature)
    return np.zeros(feature.shape, dtype=feature.np_dtype)


def rlds_example(config: Any, episode: EpisodeSpec) -> dict[str, Any]:
    """Builds the RLDS-aligned TFDS example of an episode, step by step."""
    n = len(episode.observations)
    assert len(episode.actions) == n - 1
    steps = []
    for t in range(n):
        last = t == n - 1
        step = {
            "observation": episode.observations[t],
            "is_first": t == 0,
            "is_last": last,
            "is_terminal": last and episode.terminated,
        }
        if config.action_info is not None:
            step["action"] = spec_zero(config.action_info) if last else episode.actions[t]
        if config.reward_info is not None:
            step["reward"] = spec_zero(config.reward_info) if last else episode.rewards[t]
        if config.discount_info is not None:
            step["discount"] = spec_zero(config.discount_info) if last else episode.discounts[t]
        if episode.step_metadata is not None:
            step.update(episode.step_metadata[t])
        steps.append(step)
    example = {"steps": steps}
    example.update(episode.episode_metadata or {})
    return example


def write_with_tfds(
    path: Any,
    config: Any,
    episodes: Sequence[EpisodeSpec],
    *,
    name: str | None = None,
    version: str = "0.0.1",
    split: str = "train",
    max_episodes_per_file: int = 1000,
    file_format: str = "tfrecord",
) -> None:
    """Writes episodes with TFDS's own encoder and `SequentialWriter`."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    os.makedirs(path, exist_ok=True)
    identity = tfds.core.DatasetIdentity(
        name=name or config.name,
        version=tfds.core.Version(version),
        data_dir=os.fspath(path),
        module_name="",
    )
    info = rlds_base.build_info(config, identity)
    writer = tfds.core.SequentialWriter(
        info, max_examples_per_shard=max_episodes_per_file, file_format=file_format
    )
    writer.initialize_splits([split])
    writer.add_examples({split: [rlds_example(config, e) for e in episodes]})
    writer.close_all()


def write_with_rlds_writer(
    path: Any,
    config: Any,
    episodes: Sequence[EpisodeSpec],
    **backend_kwargs: Any,
) -> None:
    """Writes episodes through `TFDSBackendWriter`'s recorder API."""
    import rlds_writer

    with rlds_writer.TFDSBackendWriter(path, config, **backend_kwargs) as backend:
        for episode in episodes:
            meta = episode.step_metadata
            backend.begin_episode(episode.observations[0], meta[0] if meta else None)
            for t, action in enumerate(episode.actions):
                backend.add_step(
                    action,
                    episode.rewards[t] if episode.rewards else None,
                    episode.discounts[t] if episode.discounts else None,
                    episode.observations[t + 1],
                    meta[t + 1] if meta else None,
                )
            if episode.episode_metadata is not None:
                backend.set_episode_metadata(episode.episode_metadata)
            backend.end_episode(terminated=episode.terminated)


def assert_same(actual: Any, expected: Any, path: str = "") -> None:
    """Asserts two decoded values are identical: keys, types, dtypes, shapes, values.

    NaNs compare equal to NaNs; nothing else is approximate.
    """
    where = path or "<root>"
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{where}: expected a dict, got {type(actual)}"
        assert sorted(actual) == sorted(expected), (
            f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        )
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}/{key}")
        return
    if isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {type(actual)}"
        assert len(actual) == len(expected), f"{where}: {len(actual)} != {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
        return
    if isinstance(expected, bytes):
        assert isinstance(actual, bytes), f"{where}: expected bytes, got {type(actual)}"
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
        return
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.dtype == e.dtype, f"{where}: dtype {a.dtype} != {e.dtype}"
    assert a.shape == e.shape, f"{where}: shape {a.shape} != {e.shape}"
    if e.dtype.kind == "f":
        same = np.array_equal(a, e, equal_nan=True)
    else:
        same = np.array_equal(a, e)
    assert same, f"{where}: {a!r} != {e!r}"
