"""Dataset configs: TFDS's RLDS `DatasetConfig` and building one from env specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.store.image_codecs import DEFAULT_JPEG_QUALITY


def dataset_config_class() -> type:
    """Returns `tfds.rlds.rlds_base.DatasetConfig` (imported lazily)."""
    from tensorflow_datasets.rlds import rlds_base

    return rlds_base.DatasetConfig


# Boxes of rank 2 or 3 at least this large are treated as images.
IMAGE_MIN_SIZE = 256
# "png" / "jpeg": tfds.features.Image; "bytes" / "zlib" / "none": Tensor encodings.
IMAGE_ENCODINGS = ("png", "jpeg", "bytes", "zlib", "none")
DEFAULT_IMAGE_ENCODING = "png"


def check_image_encoding(image_encoding: str, jpeg_quality: int = DEFAULT_JPEG_QUALITY) -> None:
    """Raises `SpecError` for an unknown image encoding or a JPEG quality outside 1..100."""
    if image_encoding not in IMAGE_ENCODINGS:
        raise SpecError(
            f"image_encoding: expected one of {', '.join(IMAGE_ENCODINGS)}, got "
            f"{image_encoding!r}; use 'png' (lossless Image), 'jpeg' (smaller, lossy Image) "
            "or 'bytes' (raw Tensor)"
        )
    if isinstance(jpeg_quality, bool) or not isinstance(jpeg_quality, int | np.integer):
        raise SpecError(f"jpeg_quality: expected an int in 1..100, got {jpeg_quality!r}")
    if not 1 <= int(jpeg_quality) <= 100:
        raise SpecError(f"jpeg_quality: expected 1..100, got {jpeg_quality}; 95 is TF's default")


def is_image(shape: Sequence[int], dtype: Any) -> bool:
    """True for boxes stored as images: rank 2 or 3, uint8/uint16/float32, >= IMAGE_MIN_SIZE."""
    dtype = np.dtype(dtype)
    return (
        dtype in (np.uint8, np.uint16, np.float32)
        and len(shape) in (2, 3)
        and int(np.prod(shape)) >= IMAGE_MIN_SIZE
    )


def image_feature(
    shape: Sequence[int],
    dtype: Any,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> Any:
    """The feature an image of this shape and dtype is stored as.

    * "png": uint8 and uint16 (H, W, 1|3|4) -> PNG `Image`;
      float32 (H, W, 1) -> PNG `Image` (TFDS bitcasts it to 4 uint8 channels).
    * "jpeg": uint8 (H, W, 1|3) -> JPEG `Image` of quality `jpeg_quality`;
      uint16 and float32 depth images -> PNG `Image` (JPEG cannot hold them).
    * Anything else TFDS's `Image` cannot hold or decode (rank 2, 2 channels,
      float32 with several channels) with "png"/"jpeg": a bytes-encoded uint8 `Tensor`, or a plain
      `Tensor` for uint16/float32. "bytes", "zlib", "none": a `Tensor` with
      that encoding (uint8 only; uint16/float32 keep encoding none).

    Args:
      shape: the image shape.
      dtype: the image dtype.
      image_encoding: one of `IMAGE_ENCODINGS`.
      jpeg_quality: JPEG quality, 1..100 (kept on the feature as
        `jpeg_quality` for the encoder; `features.json` does not store it).

    Returns:
      A `tfds.features.Image` or `tfds.features.Tensor`.
    """
    import tensorflow_datasets as tfds

    check_image_encoding(image_encoding, jpeg_quality)
    shape = tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    channels = shape[-1] if len(shape) == 3 else None
    if image_encoding in ("png", "jpeg"):
        fmt = None
        if dtype == np.uint8 and channels in (1, 3) and image_encoding == "jpeg":
            fmt = "jpeg"
        elif dtype in (np.uint8, np.uint16) and channels in (1, 3, 4):
            # not 2: tf.image.decode_image (TFDS's decoder) refuses 2 channels
            fmt = "png"
        elif dtype == np.float32 and channels == 1:
            fmt = "png"
        if fmt is not None:
            feature = tfds.features.Image(shape=shape, dtype=dtype, encoding_format=fmt)
            if fmt == "jpeg":
                feature.jpeg_quality = int(jpeg_quality)
            return feature
        return _tensor(tfds, shape, dtype, "bytes" if dtype == np.uint8 else "none")
    return _tensor(tfds, shape, dtype, image_encoding if dtype == np.uint8 else "none")


def _tensor(tfds: Any, shape: tuple[int, ...], dtype: np.dtype, encoding: str) -> Any:
    if encoding == "none":
        return tfds.features.Tensor(shape=shape, dtype=dtype)
    return tfds.features.Tensor(shape=shape, dtype=dtype, encoding=encoding)


def is_image_like(shape: Sequence[int], dtype: Any) -> bool:
    """True for specs stored as images: rank-3 uint8 arrays of any size, and
    rank-3 uint16 / float32 arrays that `is_image` accepts (depth images)."""
    return len(shape) == 3 and (np.dtype(dtype) == np.uint8 or is_image(shape, dtype))


def feature_from_spec(
    spec: Any,
    path: str = "spec",
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> Any:
    """Turns a dm_env spec (or a nest of specs) into a TFDS feature.

    Args:
      spec: a `dm_env.specs.Array` (or `BoundedArray`, `DiscreteArray`,
        `StringArray`), or a dict / list / tuple of them.
      path: the spec's name, for error messages.
      image_encoding: how rank-3 image arrays are stored: `png` (default),
        `jpeg`, `bytes`, `zlib` or `none` (see `image_feature`).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.

    Returns:
      A TFDS feature connector, or a dict of them for nested specs (lists and
      tuples become dicts keyed by the element index as a string).

    Raises:
      SpecError: if a spec cannot be represented.
    """
    import tensorflow_datasets as tfds
    from dm_env import specs

    # Leaves first: a spec's first `isinstance(spec, Mapping)` walks every
    # Mapping subclass loaded (0.1-0.25 ms per spec class with TFDS imported).
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
        if is_image_like(shape, dtype):
            return image_feature(shape, dtype, image_encoding, jpeg_quality)
        return tfds.features.Tensor(shape=shape, dtype=dtype)
    if isinstance(spec, list | tuple):
        return {
            str(i): feature_from_spec(v, f"{path}/{i}", image_encoding, jpeg_quality)
            for i, v in enumerate(spec)
        }
    if isinstance(spec, Mapping):
        return {
            str(k): feature_from_spec(v, f"{path}/{k}", image_encoding, jpeg_quality)
            for k, v in spec.items()
        }
    raise SpecError(f"{path}: expected a dm_env spec or a nest of them, got {type(spec).__name__}")


def config_from_env(
    env: Any,
    name: str,
    *,
    step_metadata_info: Mapping[str, Any] | None = None,
    episode_metadata_info: Mapping[str, Any] | None = None,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    **config_kwargs: Any,
) -> Any:
    """Builds an RLDS `DatasetConfig` from a dm_env environment's specs.

    Args:
      env: a `dm_env.Environment`.
      name: the dataset name.
      step_metadata_info: features of the step metadata, as in `DatasetConfig`.
      episode_metadata_info: features of the episode metadata.
      image_encoding: how rank-3 image observations are stored: `png`
        (default, lossless `tfds.features.Image`), `jpeg` (lossy `Image`),
        `bytes`, `zlib` or `none` (`Tensor` encodings).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.
      **config_kwargs: other `DatasetConfig` fields (description, homepage, ...).

    Returns:
      A `tfds.rlds.rlds_base.DatasetConfig`.
    """
    check_image_encoding(image_encoding, jpeg_quality)
    enc = (image_encoding, jpeg_quality)
    reward_spec = env.reward_spec() if hasattr(env, "reward_spec") else None
    discount_spec = env.discount_spec() if hasattr(env, "discount_spec") else None
    dataset_config = dataset_config_class()
    return dataset_config(
        name=name,
        observation_info=feature_from_spec(env.observation_spec(), "observation", *enc),
        action_info=feature_from_spec(env.action_spec(), "action", *enc),
        reward_info=(
            feature_from_spec(reward_spec, "reward", *enc) if reward_spec is not None else None
        ),
        discount_info=(
            feature_from_spec(discount_spec, "discount", *enc)
            if discount_spec is not None
            else None
        ),
        step_metadata_info=dict(step_metadata_info or {}),
        episode_metadata_info=dict(episode_metadata_info or {}),
        **config_kwargs,
    )
