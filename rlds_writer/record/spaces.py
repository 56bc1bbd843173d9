"""TFDS features and RLDS `DatasetConfig`s inferred from Gymnasium spaces and values.

Space -> feature rules:

* `Box` of any numeric dtype -> `Tensor(shape, dtype)`, except images (boxes
  of rank 2 or 3 with at least `IMAGE_MIN_SIZE` values), stored as
  `image_encoding` says (see `image_feature`): by default ("png") a uint8
  (H, W, 1|3|4) box becomes a lossless PNG `tfds.features.Image`, which
  TFDS-based robot loaders decode, and a uint16 or float32 (H, W, 1) depth
  image a PNG `Image` of that dtype (TFDS stores float32 bitcast to four
  uint8 channels); other uint8 images (rank 2, 2 channels) are bytes-encoded
  `Tensor`s. A float64 box is bytes-encoded too, because `tf.train.Example`
  has no double list and would keep only 32 bits.
* `Discrete` -> scalar `Tensor` of the space's dtype (int64).
* `MultiDiscrete` / `MultiBinary` -> `Tensor` of the space's shape and dtype.
* `Dict` -> a dict of features; `Tuple` -> a dict keyed by the element index
  (`"0"`, `"1"`, ...); values are converted the same way (`space_converter`).
* `Text` -> `tfds.features.Text`.

Values with no declared feature (info entries, `step_fn` results) are typed
from the values seen (`feature_from_values`): Python floats become float32
(what the wire format keeps), ints int64, bools bool, strings text, numpy
arrays keep their dtype and shape.

The recorders use `space_def`, `values_def` and `spaces_config`, which give
`store.features.feature_defs` features (TFDS stays unimported); `feature_from_space`,
`feature_from_values` and `config_from_spaces` give the same as TFDS's objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.record.config import (
    DEFAULT_IMAGE_ENCODING,
    DEFAULT_JPEG_QUALITY,
    IMAGE_ENCODINGS,
    IMAGE_MIN_SIZE,
    as_tfds_config,
    check_image_encoding,
    image_def,
    image_feature,
    is_image,
    recording_config,
    tfds_builder,
)
from rlds_writer.store.features import feature_defs

__all__ = [
    "DEFAULT_IMAGE_ENCODING",
    "DEFAULT_JPEG_QUALITY",
    "IMAGE_ENCODINGS",
    "IMAGE_MIN_SIZE",
    "config_from_spaces",
    "feature_from_space",
    "feature_from_values",
    "image_feature",
    "is_image",
    "space_converter",
]


def _tensor(shape: Sequence[int], dtype: Any, encoding: str = "none") -> Any:
    return feature_defs.Tensor(tuple(shape), dtype, encoding)


def _array_feature(
    shape: Sequence[int],
    dtype: Any,
    image_encoding: str,
    path: str,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> Any:
    """Feature of a fixed-shape numeric array, choosing its wire encoding."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    if dtype.kind not in "biuf":
        raise SpecError(f"{path}: dtype {dtype} is not supported by TFDS tensors")
    if is_image(shape, dtype):
        return image_def(shape, dtype, image_encoding, jpeg_quality)
    if dtype == np.float64:
        return _tensor(shape, dtype, "bytes")
    return _tensor(shape, dtype)


def space_def(
    space: Any,
    path: str = "space",
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> Any:
    """Turns a Gymnasium space into a feature (or a dict of them).

    Args:
      space: a `gymnasium.spaces.Space`.
      path: the space's name, for error messages.
      image_encoding: how image boxes are stored: `png` (default), `jpeg`,
        `bytes`, `zlib` or `none` (see `image_feature`).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.

    Returns:
      A `store.features.feature_defs` feature, or a dict of them for `Dict` and `Tuple`.

    Raises:
      SpecError: if the space (or a part of it) cannot be stored.
    """
    from gymnasium import spaces

    check_image_encoding(image_encoding, jpeg_quality)
    if isinstance(space, spaces.Dict):
        return {
            str(k): space_def(v, f"{path}/{k}", image_encoding, jpeg_quality)
            for k, v in space.spaces.items()
        }
    if isinstance(space, spaces.Tuple):
        return {
            str(i): space_def(v, f"{path}/{i}", image_encoding, jpeg_quality)
            for i, v in enumerate(space.spaces)
        }
    if isinstance(space, spaces.Text):
        return feature_defs.Text()
    if isinstance(space, spaces.Discrete):
        return _tensor((), space.dtype)
    if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary | spaces.Box):
        return _array_feature(space.shape, space.dtype, image_encoding, path, jpeg_quality)
    raise SpecError(
        f"{path}: {type(space).__name__} spaces are not supported (supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict, Tuple, Text); pass the feature explicitly"
    )


feature_from_space = tfds_builder(space_def, "feature_from_space")


def _has_tuple(space: Any) -> bool:
    from gymnasium import spaces

    if isinstance(space, spaces.Tuple):
        return True
    if isinstance(space, spaces.Dict):
        return any(_has_tuple(s) for s in space.spaces.values())
    return False


def space_converter(space: Any) -> Callable[[Any], Any]:
    """Returns a function turning a value of `space` into the feature's value.

    `Tuple` values become dicts keyed by the element index; everything else
    is passed through. Spaces without a `Tuple` get the identity function.

    Args:
      space: a `gymnasium.spaces.Space`.

    Returns:
      The converter.
    """
    from gymnasium import spaces

    if not _has_tuple(space):
        return _identity
    if isinstance(space, spaces.Tuple):
        subs = [space_converter(s) for s in space.spaces]

        def convert_tuple(value: Any) -> Any:
            if not isinstance(value, Sequence) or len(value) != len(subs):
                return value  # left for the buffer to reject with a clear message
            return {str(i): f(v) for i, (f, v) in enumerate(zip(subs, value))}

        return convert_tuple
    subs_by_key = {str(k): space_converter(s) for k, s in space.spaces.items()}

    def convert_dict(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {k: subs_by_key.get(str(k), _identity)(v) for k, v in value.items()}

    return convert_dict


def _identity(value: Any) -> Any:
    return value


def passes_through(converter: Callable[[Any], Any]) -> bool:
    """Whether a converter from `space_converter` returns every value as it is."""
    return converter is _identity


def reward_feature() -> Any:
    """The default reward feature: a float32 scalar."""
    return _tensor((), np.float32)


def discount_feature() -> Any:
    """The discount feature written when a discount column is asked for."""
    return _tensor((), np.float32)


def spaces_config(
    observation_space: Any,
    action_space: Any,
    name: str = "rlds_dataset",
    *,
    observation_info: Any = None,
    action_info: Any = None,
    reward_info: Any = None,
    discount: bool = False,
    step_metadata_info: Mapping[str, Any] | None = None,
    episode_metadata_info: Mapping[str, Any] | None = None,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    **config_kwargs: Any,
) -> Any:
    """Builds an RLDS dataset config from Gymnasium spaces.

    Args:
      observation_space: the (single-env) observation space.
      action_space: the (single-env) action space.
      name: the dataset name.
      observation_info: a feature replacing the one inferred from the space.
      action_info: a feature replacing the one inferred from the space.
      reward_info: the reward feature (default: float32 scalar).
      discount: add a float32 `discount` column.
      step_metadata_info: features of the step metadata.
      episode_metadata_info: features of the episode metadata.
      image_encoding: how image boxes are stored: `png` (default, lossless
        `Image`), `jpeg` (lossy `Image`), `bytes`, `zlib` or `none` (`Tensor`).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.
      **config_kwargs: other `DatasetConfig` fields (description, citation, ...).

    Returns:
      A `record.config.RecordingConfig` (TFDS's `DatasetConfig` where
      `config_kwargs` name a field only it has); features given as TFDS's
      objects are kept as they are.
    """
    if observation_info is None:
        observation_info = space_def(observation_space, "observation", image_encoding, jpeg_quality)
    if action_info is None:
        action_info = space_def(action_space, "action", image_encoding, jpeg_quality)
    return recording_config(
        name=name,
        observation_info=observation_info,
        action_info=action_info,
        reward_info=reward_info if reward_info is not None else reward_feature(),
        discount_info=discount_feature() if discount else None,
        step_metadata_info=dict(step_metadata_info or {}),
        episode_metadata_info=dict(episode_metadata_info or {}),
        **config_kwargs,
    )


config_from_spaces = tfds_builder(spaces_config, "config_from_spaces", as_tfds_config)


def _scalar_dtype(values: list[Any]) -> np.dtype | None:
    """Common dtype of Python / numpy scalars, or None if they are not all scalars."""
    kinds = set()
    np_dtypes = []
    for v in values:
        if isinstance(v, bool | np.bool_):
            kinds.add("b")
        elif isinstance(v, np.generic) and v.dtype.kind in "iuf":
            np_dtypes.append(v.dtype)
            kinds.add("f" if v.dtype.kind == "f" else "i")
        elif isinstance(v, int):
            kinds.add("i")
        elif isinstance(v, float):
            kinds.add("f")
        else:
            return None
    if kinds == {"b"}:
        return np.dtype(np.bool_)
    if "b" in kinds:
        return None
    if np_dtypes and all(isinstance(v, np.generic) for v in values):
        dtype = np.result_type(*np_dtypes)
        return np.dtype(np.float32) if dtype == np.float64 else dtype
    return np.dtype(np.float32 if "f" in kinds else np.int64)


def values_def(
    values: Sequence[Any],
    path: str,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> Any:
    """Infers a feature from the values one field took in an episode.

    Args:
      values: the values seen (at least one).
      path: the field path, for error messages.
      image_encoding: how image-like arrays are stored (see `image_feature`).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.

    Returns:
      A `store.features.feature_defs` feature, or a dict of them for dict values.

    Raises:
      SpecError: if the values have no common type, shape or nesting.
    """
    if not values:
        raise SpecError(f"{path}: no value was seen; declare its feature")
    first = values[0]
    if isinstance(first, Mapping):
        keys = set(first)
        for v in values:
            if not isinstance(v, Mapping) or set(v) != keys:
                raise SpecError(
                    f"{path}: a dict with keys {sorted(map(str, keys))} in one step and "
                    f"{_kind(v)} in another; declare its feature"
                )
        return {
            str(k): values_def([v[k] for v in values], f"{path}/{k}", image_encoding, jpeg_quality)
            for k in first
        }
    if all(isinstance(v, str | bytes | np.str_ | np.bytes_) for v in values):
        return feature_defs.Text()
    scalar = _scalar_dtype(values)
    if scalar is not None:
        return _tensor((), scalar)
    arrays = []
    for v in values:
        try:
            arr = np.asarray(v)
        except (ValueError, TypeError) as e:
            raise SpecError(f"{path}: cannot infer a feature from {_kind(v)} ({e})") from None
        arrays.append(arr)
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise SpecError(
            f"{path}: values have different shapes {sorted(shapes)}; declare its feature"
        )
    dtypes = [a.dtype for a in arrays]
    if any(d.kind not in "biuf" for d in dtypes):
        raise SpecError(
            f"{path}: cannot infer a feature from {_kind(first)} (dtype {dtypes[0]}); "
            "declare its feature"
        )
    from_python = not isinstance(first, np.ndarray)
    dtype = np.result_type(*dtypes)
    if from_python and dtype == np.float64:
        dtype = np.dtype(np.float32)  # Python float lists: keep what the wire keeps
    if from_python and dtype.kind == "i":
        dtype = np.dtype(np.int64)
    return _array_feature(arrays[0].shape, dtype, image_encoding, path, jpeg_quality)


feature_from_values = tfds_builder(values_def, "feature_from_values")


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name}[{','.join(map(str, value.shape))}]"
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(map(str, value))}"
    return type(value).__name__
