"""The merged schema of a source's episodes, and the RLDS features it becomes.

The first of a conversion's two passes (`episodes.write_episodes`):
`infer_schema` walks every `SourceEpisode` and merges the dtype and shape of
every leaf (a field missing from some episodes still gets a column; a field
whose dtype or shape changes between episodes is an error naming it);
`dataset_config` turns the schema into the dataset's features: float64 leaves
bytes-encoded (full precision), rank-3 arrays stored as `image_encoding` says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.record.config import (
    DEFAULT_IMAGE_ENCODING,
    DEFAULT_JPEG_QUALITY,
    check_image_encoding,
    dataset_config_class,
    image_feature,
    is_image,
)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    dtype: np.dtype
    shape: tuple[int, ...]
    text: bool = False


def _leaf_of(values: Any, path: str, per_row: bool) -> _Leaf:
    """Describes one leaf column (`per_row`) or one episode-level value."""
    if isinstance(values, list) and values and all(isinstance(v, str | bytes) for v in values):
        return _Leaf(np.dtype(object), (), text=True)
    if isinstance(values, str | bytes):
        return _Leaf(np.dtype(object), (), text=True)
    arr = np.asarray(values)
    if arr.dtype.kind in "USO":
        if arr.ndim == (1 if per_row else 0):
            return _Leaf(np.dtype(object), (), text=True)
        raise SpecError(f"{path}: arrays of strings with shape {arr.shape} are not supported")
    if arr.dtype.kind not in "biuf":
        raise SpecError(f"{path}: dtype {arr.dtype} cannot be stored in a TFDS Tensor")
    shape = tuple(int(d) for d in (arr.shape[1:] if per_row else arr.shape))
    if per_row and arr.ndim == 0:
        raise SpecError(f"{path}: expected one value per row, got a scalar")
    return _Leaf(arr.dtype, shape)


def _merge(schema: dict[str, Any], nest: Any, path: str, per_row: bool, where: str) -> None:
    if not isinstance(nest, Mapping):
        raise SpecError(f"{path}: expected a dict, got {type(nest).__name__}")
    for key, value in nest.items():
        sub = f"{path}/{key}"
        if isinstance(value, Mapping):
            node = schema.setdefault(str(key), {})
            if not isinstance(node, dict):
                raise SpecError(f"{sub}: a dict in {where}, an array before")
            _merge(node, value, sub, per_row, where)
            continue
        if value is None:
            continue
        leaf = _leaf_of(value, sub, per_row)
        known = schema.get(str(key))
        if known is None:
            schema[str(key)] = leaf
        elif isinstance(known, dict):
            raise SpecError(f"{sub}: an array in {where}, a dict before")
        elif known != leaf:
            raise SpecError(
                f"{sub}: {_describe_leaf(leaf)} in {where}, {_describe_leaf(known)} before"
            )


def _describe_leaf(leaf: _Leaf) -> str:
    if leaf.text:
        return "text"
    return f"{leaf.dtype.name}[{','.join(map(str, leaf.shape))}]"


@dataclasses.dataclass
class Schema:
    """The merged shape of every field of a source's episodes."""

    tree: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_episodes: int = 0

    def add(self, episode: Any) -> None:
        """Merges one `episodes.SourceEpisode` (not imported: episodes imports this module)."""
        where = f"episode {self.num_episodes}"
        _merge(self.tree, {"observation": episode.observations}, "steps", True, where)
        _merge(self.tree, {"action": episode.actions}, "steps", True, where)
        _merge(self.tree, {"reward": episode.rewards}, "steps", True, where)
        if episode.discounts is not None:
            _merge(self.tree, {"discount": episode.discounts}, "steps", True, where)
        _merge(self.tree, episode.step_metadata, "steps", True, where)
        _merge(self.tree, episode.transition_metadata, "steps", True, where)
        _merge(
            self.tree.setdefault("<episode>", {}),
            episode.episode_metadata,
            "<episode metadata>",
            False,
            where,
        )
        self.num_episodes += 1


def infer_schema(episodes: Iterable[Any]) -> Schema:
    """Walks every `SourceEpisode` and merges the dtype and shape of every leaf.

    Raises:
      SpecError: if a leaf changes dtype or shape between episodes, naming it.
    """
    schema = Schema()
    for episode in episodes:
        schema.add(episode)
    return schema


def _feature(
    leaf: Any, images: tuple[str, int] = (DEFAULT_IMAGE_ENCODING, DEFAULT_JPEG_QUALITY)
) -> Any:
    import tensorflow_datasets as tfds

    if isinstance(leaf, dict):
        return {k: _feature(v, images) for k, v in leaf.items()}
    if leaf.text:
        return tfds.features.Text()
    shape = tuple(leaf.shape)
    if len(shape) == 3 and (leaf.dtype == np.uint8 or is_image(shape, leaf.dtype)):
        return image_feature(shape, leaf.dtype, *images)
    if leaf.dtype == np.float64:
        return tfds.features.Tensor(shape=leaf.shape, dtype=leaf.dtype, encoding="bytes")
    return tfds.features.Tensor(shape=leaf.shape, dtype=leaf.dtype)


def dataset_config(
    schema: Schema,
    name: str,
    *,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    **config_kwargs: Any,
) -> Any:
    """Builds the RLDS `DatasetConfig` of a schema.

    Args:
      schema: the merged schema.
      name: the dataset name.
      image_encoding: how rank-3 image leaves are stored: `png` (default,
        lossless `Image`), `jpeg` (lossy `Image`), `bytes`, `zlib`, `none`.
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.
      **config_kwargs: more `DatasetConfig` fields (overall_description, homepage, citation).
    """
    check_image_encoding(image_encoding, jpeg_quality)
    images = (image_encoding, jpeg_quality)
    tree = dict(schema.tree)
    episode = tree.pop("<episode>", {})
    core = {k: tree.pop(k) for k in ("observation", "action", "reward", "discount") if k in tree}
    if "observation" not in core:
        raise SpecError("the source has no observations")
    return dataset_config_class()(
        name=name,
        observation_info=_feature(core["observation"], images),
        action_info=_feature(core["action"], images) if "action" in core else None,
        reward_info=_feature(core["reward"], images) if "reward" in core else None,
        discount_info=_feature(core["discount"], images) if "discount" in core else np.float32,
        step_metadata_info={k: _feature(v, images) for k, v in tree.items()},
        episode_metadata_info={k: _feature(v, images) for k, v in episode.items()},
        **config_kwargs,
    )
