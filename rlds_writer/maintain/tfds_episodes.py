"""Episodes decoded by TFDS itself, as a user's pipeline decodes them (`validate`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from rlds_writer.store.formats import shards


def _tfds_reader(builder: Any) -> str:
    """The builder method TFDS reads the builder's shard format with."""
    fmt = builder.info.file_format
    name = getattr(fmt, "value", fmt) or shards.DEFAULT_FILE_FORMAT
    return shards.adapter(name).tfds_reader if name in shards.names() else "as_dataset"


def stack_steps(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Turns a list of step dicts into a dict of arrays (lists where shapes vary)."""
    import numpy as np

    if not steps:
        return {}
    out: dict[str, Any] = {}
    for key, first in steps[0].items():
        values = [step[key] for step in steps]
        if isinstance(first, dict):
            out[key] = stack_steps(values)
            continue
        try:
            out[key] = np.stack(values)
        except ValueError:
            out[key] = values
    return out


def decoded_episodes(builder: Any, split: str) -> Iterator[dict[str, Any]]:
    """Yields every episode of a split through TFDS, as numpy, steps batched into arrays.

    Args:
      builder: a TFDS builder, or a dataset directory to open with
        `tfds.builder_from_directory`.
      split: the split.

    Yields:
      Episode dicts whose `steps` is a dict of arrays with one row per step.
    """
    import tensorflow as tf

    if not hasattr(builder, "as_dataset"):
        import tensorflow_datasets as tfds

        builder = tfds.builder_from_directory(os.fspath(builder))
    if _tfds_reader(builder) == "as_data_source":
        # TFDS reads this format (array_record) through a random-access data source only.
        for episode in builder.as_data_source(split=split):
            episode = dict(episode)
            episode["steps"] = stack_steps(list(episode["steps"]))
            yield episode
        return

    steps_feature = builder.info.features["steps"]
    ragged = any(
        None in tuple(info.shape)
        for info in tf.nest.flatten(steps_feature.feature.get_tensor_info())
    )

    @tf.autograph.experimental.do_not_convert
    def batch_steps(episode: dict[str, Any]) -> dict[str, Any]:
        episode = dict(episode)
        steps = episode["steps"]
        batched = steps.ragged_batch(1 << 30) if ragged else steps.batch(1 << 30)
        episode["steps"] = batched.get_single_element()
        return episode

    ds = builder.as_dataset(split=split, shuffle_files=False).map(batch_steps)
    yield from ds.as_numpy_iterator()
