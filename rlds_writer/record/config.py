"""Dataset configs: TFDS's RLDS `DatasetConfig` and building one from env specs.

The recorders build their features from env specs and spaces as
`store.features.feature_defs` (`spec_def`, `image_def`, `env_config`, and
`record.spaces`), so a recording leaves TFDS unimported (about 135 ms of a
short recording); the public builders (`feature_from_spec`, `image_feature`,
`config_from_env`) give the same features as TFDS's own objects.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.store.features import feature_defs
from rlds_writer.store.features.feature_defs import DEFAULT_JPEG_QUALITY


def dataset_config_class() -> type:
    """Returns `tfds.rlds.rlds_base.DatasetConfig` (imported lazily)."""
    from tensorflow_datasets.rlds import rlds_base

    return rlds_base.DatasetConfig


@dataclasses.dataclass
class RecordingConfig:
    """The fields of TFDS's RLDS `DatasetConfig` that the writer reads, without TFDS.

    The writer takes either; `as_tfds_config` gives TFDS's.
    """

    name: str
    observation_info: Any = None
    action_info: Any = None
    reward_info: Any = None
    discount_info: Any = None
    step_metadata_info: dict[str, Any] | None = None
    episode_metadata_info: dict[str, Any] | None = None
    overall_description: str = ""
    homepage: str = ""
    citation: str = ""
    supervised_keys: Any = None


_FEATURE_FIELDS = (
    "observation_info",
    "action_info",
    "reward_info",
    "discount_info",
    "step_metadata_info",
    "episode_metadata_info",
)


def recording_config(**fields: Any) -> Any:
    """A `RecordingConfig` of `fields`, or TFDS's `DatasetConfig` for fields it alone has."""
    names = {f.name for f in dataclasses.fields(RecordingConfig)}
    if set(fields) <= names:
        return RecordingConfig(**fields)
    return as_tfds_config(fields)


def as_tfds_config(config: Any) -> Any:
    """TFDS's `DatasetConfig` of a `RecordingConfig` (or of its fields as a dict)."""
    if isinstance(config, RecordingConfig):  # not `asdict`: it would unmake the features
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    elif isinstance(config, Mapping):
        fields = dict(config)
    else:
        return config  # TFDS's already
    for name in _FEATURE_FIELDS:
        fields[name] = feature_defs.as_tfds(fields.get(name))
    return dataset_config_class()(**fields)


def tfds_builder(
    build: Callable[..., Any], name: str, convert: Callable[[Any], Any] = feature_defs.as_tfds
) -> Callable[..., Any]:
    """The public form of one of the builders here: what `build` makes, as TFDS's objects.

    It takes `build`'s arguments (`inspect.signature` and `help` show them).
    """

    @functools.wraps(build)
    def public(*args: Any, **kwargs: Any) -> Any:
        return convert(build(*args, **kwargs))

    public.__name__ = public.__qualname__ = name
    public.__doc__ = f"`{build.__name__}` (the same arguments), as TFDS's own objects."
    return public


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


def image_def(
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
      A `store.features.feature_defs` `Image` or `Tensor`.
    """
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
            quality = int(jpeg_quality) if fmt == "jpeg" else None
            return feature_defs.Image(shape, dtype, fmt, quality)
        return feature_defs.Tensor(shape, dtype, "bytes" if dtype == np.uint8 else "none")
    return feature_defs.Tensor(shape, dtype, image_encoding if dtype == np.uint8 else "none")


image_feature = tfds_builder(image_def, "image_feature")


def is_image_like(shape: Sequence[int], dtype: Any) -> bool:
    """True for specs stored as images: rank-3 uint8 arrays of any size, and
    rank-3 uint16 / float32 arrays that `is_image` accepts (depth images)."""
    return len(shape) == 3 and (np.dtype(dtype) == np.uint8 or is_image(shape, dtype))


def spec_def(
    spec: Any,
    path: str = "spec",
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> Any:
    """Turns a dm_env spec (or a nest of specs) into a feature.

    Args:
      spec: a `dm_env.specs.Array` (or `BoundedArray`, `DiscreteArray`,
        `StringArray`), or a dict / list / tuple of them.
      path: the spec's name, for error messages.
      image_encoding: how rank-3 image arrays are stored: `png` (default),
        `jpeg`, `bytes`, `zlib` or `none` (see `image_feature`).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"`.

    Returns:
      A `store.features.feature_defs` feature (TFDS's `Tensor` for a string array with
      a shape, which they do not hold), or a dict of them for nested specs
      (lists and tuples become dicts keyed by the element index as a string).

    Raises:
      SpecError: if a spec cannot be represented.
    """
    from dm_env import specs

    # Leaves first: a spec's first `isinstance(spec, Mapping)` walks every
    # Mapping subclass loaded (0.1-0.25 ms per spec class with TFDS imported).
    if isinstance(spec, specs.StringArray):
        return _string_feature(tuple(spec.shape))
    if isinstance(spec, specs.Array):
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
        if dtype.kind in "SUO":
            return _string_feature(shape)
        if dtype.kind not in "biuf":
            raise SpecError(f"{path}: dtype {dtype} is not supported by TFDS tensors")
        if is_image_like(shape, dtype):
            return image_def(shape, dtype, image_encoding, jpeg_quality)
        return feature_defs.Tensor(shape, dtype)
    if isinstance(spec, list | tuple):
        return {
            str(i): spec_def(v, f"{path}/{i}", image_encoding, jpeg_quality)
            for i, v in enumerate(spec)
        }
    if isinstance(spec, Mapping):
        return {
            str(k): spec_def(v, f"{path}/{k}", image_encoding, jpeg_quality)
            for k, v in spec.items()
        }
    raise SpecError(f"{path}: expected a dm_env spec or a nest of them, got {type(spec).__name__}")


feature_from_spec = tfds_builder(spec_def, "feature_from_spec")


def _string_feature(shape: tuple[int, ...]) -> Any:
    if shape == ():
        return feature_defs.Text()
    import tensorflow_datasets as tfds

    return tfds.features.Tensor(shape=shape, dtype=np.object_)


def env_config(
    env: Any,
    name: str,
    *,
    step_metadata_info: Mapping[str, Any] | None = None,
    episode_metadata_info: Mapping[str, Any] | None = None,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    **config_kwargs: Any,
) -> Any:
    """Builds an RLDS dataset config from a dm_env environment's specs.

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
      A `RecordingConfig` of `store.features.feature_defs` features (TFDS's
      `DatasetConfig` where `config_kwargs` name a field only it has).
    """
    check_image_encoding(image_encoding, jpeg_quality)
    enc = (image_encoding, jpeg_quality)
    reward_spec = env.reward_spec() if hasattr(env, "reward_spec") else None
    discount_spec = env.discount_spec() if hasattr(env, "discount_spec") else None
    return recording_config(
        name=name,
        observation_info=spec_def(env.observation_spec(), "observation", *enc),
        action_info=spec_def(env.action_spec(), "action", *enc),
        reward_info=spec_def(reward_spec, "reward", *enc) if reward_spec is not None else None,
        discount_info=(
            spec_def(discount_spec, "discount", *enc) if discount_spec is not None else None
        ),
        step_metadata_info=dict(step_metadata_info or {}),
        episode_metadata_info=dict(episode_metadata_info or {}),
        **config_kwargs,
    )


config_from_env = tfds_builder(env_config, "config_from_env", as_tfds_config)
