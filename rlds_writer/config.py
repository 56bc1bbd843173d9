"""Dataset configs: TFDS's RLDS `DatasetConfig` and building one from env specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError


def dataset_config_class() -> type:
    """Returns `tfds.rlds.rlds_base.DatasetConfig` (imported lazily)."""
    from tensorflow_datasets.rlds import rlds_base

    return rlds_base.DatasetConfig


def is_image_like(shape: Sequence[int], dtype: Any) -> bool:
    """True for uint8 arrays of rank 3 (H, W, C): stored as raw bytes by default."""
    return np.dtype(dtype) == np.uint8 and len(shape) == 3


def feature_from_spec(spec: Any, path: str = "spec", image_encoding: str = "bytes") -> Any:
    """Turns a dm_env spec (or a nest of specs) into a TFDS feature.

    Args:
      spec: a `dm_env.specs.Array` (or `BoundedArray`, `DiscreteArray`,
        `StringArray`), or a dict / list / tuple of them.
      path: the spec's name, for error messages.
      image_encoding: `Tensor` encoding for rank-3 uint8 arrays (`bytes`,
        `zlib` or `none`).

    Returns:
      A TFDS feature connector, or a dict of them for nested specs (lists and
      tuples become dicts keyed by the element index as a string).

    Raises:
      SpecError: if a spec cannot be represented.
    """
    import tensorflow_datasets as tfds
    from dm_env import specs

    if isinstance(spec, Mapping):
        return {
            str(k): feature_from_spec(v, f"{path}/{k}", image_encoding) for k, v in spec.items()
        }
    if isinstance(spec, list | tuple):
        return {
            str(i): feature_from_spec(v, f"{path}/{i}", image_encoding) for i, v in enumerate(spec)
        }
    if isinstance(spec, specs.StringArray):
        if tuple(spec.shape) == ():
            return tfds.features.Text()
        return tfds.features.Tensor(shape=tuple(spec.shape), dtype=np.object_)
    if isinstance(spec, specs.Array):
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
        if dtype.kind in "SUO":
            if shape == ():
                return tfds.features.Text()
            return tfds.features.Tensor(shape=shape, dtype=np.object_)
        if dtype.kind not in "biuf":
            raise SpecError(f"{path}: dtype {dtype} is not supported by TFDS tensors")
        if is_image_like(shape, dtype) and image_encoding != "none":
            return tfds.features.Tensor(shape=shape, dtype=dtype, encoding=image_encoding)
        return tfds.features.Tensor(shape=shape, dtype=dtype)
    raise SpecError(f"{path}: expected a dm_env spec or a nest of them, got {type(spec).__name__}")


def config_from_env(
    env: Any,
    name: str,
    *,
    step_metadata_info: Mapping[str, Any] | None = None,
    episode_metadata_info: Mapping[str, Any] | None = None,
    image_encoding: str = "bytes",
    **config_kwargs: Any,
) -> Any:
    """Builds an RLDS `DatasetConfig` from a dm_env environment's specs.

    Args:
      env: a `dm_env.Environment`.
      name: the dataset name.
      step_metadata_info: features of the step metadata, as in `DatasetConfig`.
      episode_metadata_info: features of the episode metadata.
      image_encoding: `Tensor` encoding used for rank-3 uint8 observations.
      **config_kwargs: other `DatasetConfig` fields (description, homepage, ...).

    Returns:
      A `tfds.rlds.rlds_base.DatasetConfig`.
    """
    reward_spec = env.reward_spec() if hasattr(env, "reward_spec") else None
    discount_spec = env.discount_spec() if hasattr(env, "discount_spec") else None
    dataset_config = dataset_config_class()
    return dataset_config(
        name=name,
        observation_info=feature_from_spec(env.observation_spec(), "observation", image_encoding),
        action_info=feature_from_spec(env.action_spec(), "action", image_encoding),
        reward_info=(
            feature_from_spec(reward_spec, "reward", image_encoding)
            if reward_spec is not None
            else None
        ),
        discount_info=(
            feature_from_spec(discount_spec, "discount", image_encoding)
            if discount_spec is not None
            else None
        ),
        step_metadata_info=dict(step_metadata_info or {}),
        episode_metadata_info=dict(episode_metadata_info or {}),
        **config_kwargs,
    )
