"""The first episodes' raw values, kept until their metadata features are inferred.

A TFDS dataset's features must be known when its writer is created, but the
types of custom env data (Gymnasium `info` entries, `step_fn` results, RLlib
model outputs) are often only known once the env has run. The recorder
(`record.recorder`) keeps the raw values of the first episodes here
(`PendingEpisode`), infers the features of the undeclared metadata keys from
them (`infer`), creates the writer and replays them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.record.spaces import values_def


class _Zero:
    """Sentinel: store the zero value of the field's feature."""

    def __repr__(self) -> str:
        return "ZERO"


ZERO = _Zero()


def snapshot(value: Any) -> Any:
    """Copies numpy arrays in a nest (envs may reuse their output arrays)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(snapshot(v) for v in value)
    if isinstance(value, list):
        return [snapshot(v) for v in value]
    if isinstance(value, Mapping):
        return {k: snapshot(v) for k, v in value.items()}
    return value


class PendingEpisode:
    """The raw values of one episode recorded before the writer exists."""

    __slots__ = ("steps", "episode_metadata")

    def __init__(self) -> None:
        self.steps: list[tuple] = []
        self.episode_metadata: Mapping[str, Any] | None = None


def infer(
    episodes: list[PendingEpisode],
    declared_step: Mapping[str, Any],
    declared_episode: Mapping[str, Any],
    image_encoding: str,
    jpeg_quality: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The step and episode metadata features: the declared ones, and those of the other keys.

    Args:
      episodes: the kept episodes (each step's last item is its step metadata).
      declared_step: declared step metadata features (key -> feature).
      declared_episode: declared episode metadata features.
      image_encoding: how inferred image-like arrays are stored.
      jpeg_quality: JPEG quality for `image_encoding="jpeg"`.

    Raises:
      SpecError: a key only ever held `ZERO`, which has no type to infer.
    """
    step_values: dict[str, list[Any]] = {}
    episode_values: dict[str, list[Any]] = {}
    for episode in episodes:
        for step in episode.steps:
            for key, value in (step[-1] or {}).items():
                if key not in declared_step and value is not ZERO:
                    step_values.setdefault(key, []).append(value)
        for key, value in (episode.episode_metadata or {}).items():
            if key not in declared_episode:
                episode_values.setdefault(key, []).append(value)
    step_info = dict(declared_step)
    for key, values in step_values.items():
        step_info[key] = values_def(values, f"steps/{key}", image_encoding, jpeg_quality)
    for episode in episodes:
        for step in episode.steps:
            for key, value in (step[-1] or {}).items():
                if value is ZERO and key not in step_info:
                    raise SpecError(
                        f"steps/{key}: no value was seen in the first episode to infer "
                        "its type from; declare its feature"
                    )
    episode_info = dict(declared_episode)
    for key, values in episode_values.items():
        episode_info[key] = values_def(values, key, image_encoding, jpeg_quality)
    return step_info, episode_info
