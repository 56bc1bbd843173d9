"""Source-independent episodes and their conversion to an RLDS dataset.

Every converter turns its source into `SourceEpisode`s: whole-episode arrays
(one row per observation or per transition). Conversion makes two passes over
the source, streaming one episode at a time in each:

1. `source_schema.infer_schema` walks every episode and merges the dtype and shape of every
   leaf (a field missing from some episodes still gets a column; a field whose
   dtype or shape changes between episodes is an error naming it);
2. `write_episodes` builds the RLDS-aligned columns of each episode and hands
   them to `DatasetWriter.write`.

RLDS alignment from a source episode with `n_obs` observations and `T`
transitions (`T == n_obs - 1` when the final observation is known, `T ==
n_obs` when it is not, as in D4RL files without `next_observations`):

* there are `n_obs` steps; step `t` holds observation `o_t` and its
  `step_metadata`, and action `a_t`, reward `r_t`, discount `d_t` and
  `transition_metadata` (e.g. RLlib's action log-probabilities) of the
  transition that followed `o_t`;
* when the final observation is known, the final step holds it with zeros for
  action, reward, discount and transition metadata (rlds_writer's own layout);
* `is_first` on step 0, `is_last` on the final step, `is_terminal` on the
  final step when the episode terminated;
* the default discount is 1, and 0 on the last transition of a terminated
  episode (dm_env's convention).

Leaves of a float64 dtype are stored as `Tensor(encoding="bytes")` so that
they keep their full precision (a plain float64 feature is stored as 32-bit
floats by `tf.train.Example`); rank-3 arrays (images) are stored as
`image_encoding` says, as in the recorders (`record.config.image_feature`):
by default uint8 (H, W, 1|3|4) become PNG `tfds.features.Image`s and uint16 /
float32 (H, W, 1) depth images PNG `Image`s of that dtype.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError, counted
from rlds_writer.interop.source_schema import dataset_config, infer_schema
from rlds_writer.record.config import (
    DEFAULT_IMAGE_ENCODING,
    DEFAULT_JPEG_QUALITY,
    check_image_encoding,
)
from rlds_writer.record.episode import StepFields, rlds_flags
from rlds_writer.record.values import cast_value
from rlds_writer.store.episodes.episode_data import Episode
from rlds_writer.store.formats.shards import DEFAULT_FILE_FORMAT
from rlds_writer.store.writing.writer import DatasetWriter

_log = logging.getLogger(__name__)

Nest = Any  # an array or a dict of nests

# Set by `interop.beam_convert` while a format's `convert` runs on a Beam
# runner: the format names its dataset, metadata and options through
# `write_episodes` as always, and this writes the episodes with a pipeline.
PIPELINE_WRITER: contextvars.ContextVar[Callable[..., ConversionReport] | None] = (
    contextvars.ContextVar("rlds_writer_pipeline_writer", default=None)
)


@dataclasses.dataclass
class SourceEpisode:
    """One episode read from a foreign format, as whole-episode arrays.

    Attributes:
      observations: nest of arrays with `n_obs` rows.
      actions: nest of arrays with `T` rows (`T` is `n_obs - 1` or `n_obs`).
      rewards: array with `T` rows.
      terminated: whether the episode ended by termination.
      discounts: array with `T` rows, or None for the default (see module doc).
      step_metadata: dict of nests with `n_obs` rows, aligned with observations.
      transition_metadata: dict of nests with `T` rows, aligned with actions.
      episode_metadata: dict of scalars (numbers, bools, strings) or arrays.
    """

    observations: Nest
    actions: Nest
    rewards: np.ndarray
    terminated: bool
    discounts: np.ndarray | None = None
    step_metadata: dict[str, Nest] = dataclasses.field(default_factory=dict)
    transition_metadata: dict[str, Nest] = dataclasses.field(default_factory=dict)
    episode_metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ConversionReport:
    """What a conversion wrote.

    Attributes:
      source: the source path or id.
      destination: the dataset directory written.
      episodes: episodes written.
      steps: RLDS steps written.
      terminated: episodes that ended by termination.
      truncated: episodes that did not.
      notes: remarks about the conversion (dropped partial episodes, ...).
    """

    source: str
    destination: str
    episodes: int = 0
    steps: int = 0
    terminated: int = 0
    truncated: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        text = (
            f"{counted(self.episodes, 'episode')} ({counted(self.steps, 'step')}; "
            f"{self.terminated} terminated, "
            f"{self.truncated} truncated) from {self.source} to {self.destination}"
        )
        return "\n".join([text, *(f"note: {n}" for n in self.notes)])


def _get(nest: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(nest, Mapping) or key not in nest:
            return None
        nest = nest[key]
    return nest


def _column(field: Any, values: Any, rows: int, pad_to: int) -> Any:
    """One RLDS column: `rows` source rows, zero-padded to `pad_to` rows."""
    if field.kind == "text":
        items = [] if values is None else [_text(v) for v in list(values)[:rows]]
        if len(items) != rows and values is not None:
            raise SpecError(f"{field.key}: expected {rows} values, got {len(items)}")
        items += [""] * (pad_to - len(items))
        return items
    out = np.zeros((pad_to, *field.shape), dtype=field.dtype)
    if values is not None:
        arr = np.asarray(values)
        if arr.shape[0] != rows or tuple(arr.shape[1:]) != tuple(field.shape):
            raise SpecError(
                f"{field.key}: expected {rows} rows of {field.describe()}, got "
                f"{arr.dtype.name}[{','.join(map(str, arr.shape))}]"
            )
        out[:rows] = arr
    return out


def _text(value: Any) -> str | bytes:
    if isinstance(value, np.ndarray):
        value = value.item()
    return value if isinstance(value, str | bytes) else str(value)


def rlds_episode(layout: Any, episode: SourceEpisode) -> Any:
    """Builds the RLDS-aligned `steps.Episode` of a source episode.

    Args:
      layout: the dataset's `record.episode.StepFields`.
      episode: the source episode.

    Returns:
      A `rlds_writer.store.episodes.episode_data.Episode` ready for `DatasetWriter.write`.

    Raises:
      SpecError: if a column has the wrong number of rows or shape, naming it.
    """
    n = _rows(episode.observations, "steps/observation")
    transitions = _rows(episode.rewards, "steps/reward")
    if transitions not in (n - 1, n) or n == 0:
        raise SpecError(
            f"an episode with {n} observations must have {n - 1} or {n} rewards, got {transitions}"
        )
    discounts = episode.discounts
    if discounts is None:
        discounts = np.ones(transitions, dtype=np.float32)
        if episode.terminated and transitions:
            discounts[-1] = 0.0
    sources = {
        "observation": (episode.observations, n),
        "action": (episode.actions, transitions),
        "reward": (episode.rewards, transitions),
        "discount": (discounts, transitions),
    }
    for key, value in episode.step_metadata.items():
        sources[key] = (value, n)
    for key, value in episode.transition_metadata.items():
        sources[key] = (value, transitions)
    columns: dict[str, Any] = {}
    flags = rlds_flags(n, episode.terminated)
    for field in layout.fields:
        if not field.in_steps:
            continue
        name = field.path[1]
        if name in flags:
            columns[field.key] = flags[name]
            continue
        nest, rows = sources.get(name, (None, n))
        values = nest if len(field.path) == 2 else _get(nest, field.path[2:])
        columns[field.key] = _column(field, values, rows, n)
    episode_values = {}
    for key, field in layout.episode_fields.items():
        value = _get(episode.episode_metadata, field.path)
        if value is None:
            episode_values[key] = field.zero()
        elif field.kind == "text":
            episode_values[key] = _text(value)
        else:
            episode_values[key] = cast_value(field, np.asarray(value, dtype=field.dtype))
    return Episode(columns, episode_values, n)


def _rows(nest: Any, path: str) -> int:
    if isinstance(nest, Mapping):
        counts = {_rows(v, f"{path}/{k}") for k, v in nest.items()}
        if len(counts) != 1:
            raise SpecError(f"{path}: leaves have different numbers of rows {sorted(counts)}")
        return counts.pop()
    return len(nest)


def write_episodes(
    make_episodes: Callable[[], Iterator[SourceEpisode]],
    destination: os.PathLike | str,
    *,
    name: str,
    source: str,
    metadata: Mapping[str, Any] | None = None,
    split: str = "train",
    mode: str = "error",
    file_format: str = DEFAULT_FILE_FORMAT,
    max_episodes_per_file: int = 1000,
    version: str = "1.0.0",
    progress: bool = False,
    config_kwargs: Mapping[str, Any] | None = None,
    image_encoding: str = DEFAULT_IMAGE_ENCODING,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
) -> ConversionReport:
    """Converts a source's episodes into an RLDS dataset (two streaming passes).

    Args:
      make_episodes: returns a fresh iterator over the source's episodes
        (called twice: once for the schema, once to write).
      destination: the dataset directory to write.
      name: the dataset name.
      source: the source, for the report.
      metadata: dataset-level metadata for `metadata.json`.
      split: the split to write.
      mode: `error`, `append` or `overwrite` if `destination` holds a dataset.
      file_format: `tfrecord` or `array_record`.
      max_episodes_per_file: episodes per shard.
      version: the dataset version.
      progress: show tqdm progress bars.
      config_kwargs: more `DatasetConfig` fields (description, homepage, citation).
      image_encoding: how images are stored: `png` (default: lossless
        `tfds.features.Image`), `jpeg` (lossy `Image`, smaller), `bytes`,
        `zlib` or `none` (`Tensor`).
      jpeg_quality: JPEG quality 1..100 for `image_encoding="jpeg"` (default 95).

    Returns:
      The `ConversionReport`.
    """
    from tqdm import tqdm

    check_image_encoding(image_encoding, jpeg_quality)
    pipeline_writer = PIPELINE_WRITER.get()
    if pipeline_writer is not None:
        return pipeline_writer(
            destination,
            name=name,
            source=source,
            metadata=metadata,
            split=split,
            mode=mode,
            file_format=file_format,
            max_episodes_per_file=max_episodes_per_file,
            version=version,
            config_kwargs=config_kwargs,
            image_encoding=image_encoding,
            jpeg_quality=jpeg_quality,
        )
    schema = infer_schema(
        tqdm(make_episodes(), desc="scan", unit="ep", disable=not progress, leave=False)
    )
    if not schema.num_episodes:
        raise ValueError(f"{source}: no episodes found")
    cfg = dataset_config(
        schema,
        name,
        image_encoding=image_encoding,
        jpeg_quality=jpeg_quality,
        **dict(config_kwargs or {}),
    )
    report = ConversionReport(source=str(source), destination=os.fspath(destination))
    writer = DatasetWriter(
        destination,
        cfg,
        version=version,
        split=split,
        mode=mode,
        file_format=file_format,
        max_episodes_per_file=max_episodes_per_file,
        metadata=dict(metadata) if metadata is not None else None,
    )
    fields = StepFields(writer.encoder.fields, empty_dicts=writer.encoder.empty_dicts)
    try:
        total = schema.num_episodes
        for episode in tqdm(
            make_episodes(), total=total, desc="write", unit="ep", disable=not progress
        ):
            rlds = rlds_episode(fields, episode)
            writer.write(rlds)
            report.episodes += 1
            report.steps += rlds.num_steps
            if episode.terminated:
                report.terminated += 1
            else:
                report.truncated += 1
    finally:
        writer.close()
    return report
