"""`DeferredWriter`: a dataset writer whose metadata features come from the data.

A TFDS dataset's features must be known when its `DatasetWriter` is created,
but the types of custom env data (Gymnasium `info` entries, `step_fn`
results, RLlib model outputs) are often only known once the env has run. A
`DeferredWriter` keeps the raw values of the first episode, infers the
missing step and episode metadata features from them when that episode ends
(or after `infer_max_steps` steps, or at `close()`), creates the
`DatasetWriter`, replays what it kept, and from then on feeds episodes
straight into columnar `EpisodeBuffer`s.

It records several episodes at once, one per *slot* (a vector env's
sub-env, an RLlib episode), all into the same dataset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
from etils import epath

from rlds_writer.errors import SpecError, StepValueError

_log = logging.getLogger(__name__)


class _Zero:
    """Sentinel: store the zero value of the field's feature."""

    def __repr__(self) -> str:
        return "ZERO"


ZERO = _Zero()

MakeConfig = Callable[[dict[str, Any], dict[str, Any]], Any]


def _snapshot(value: Any) -> Any:
    """Copies numpy arrays in a nest (envs may reuse their output arrays)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_snapshot(v) for v in value)
    if isinstance(value, list):
        return [_snapshot(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _snapshot(v) for k, v in value.items()}
    return value


class _PendingEpisode:
    """The raw values of one episode recorded before the writer exists."""

    __slots__ = ("steps", "episode_metadata")

    def __init__(self) -> None:
        self.steps: list[tuple] = []
        self.episode_metadata: Mapping[str, Any] | None = None


class DeferredWriter:
    """Records episodes into one dataset, inferring metadata features first.

    Args:
      data_directory: the dataset directory.
      make_config: `make_config(step_metadata_info, episode_metadata_info)`
        returns the `DatasetConfig`, given the step and episode metadata
        features (declared ones plus inferred ones).
      step_metadata_info: declared step metadata features (key -> feature).
      episode_metadata_info: declared episode metadata features.
      infer: infer the features of metadata keys that are not declared. If
        False, the writer is created at once from the declared features.
      image_encoding: `Tensor` encoding of inferred image-like uint8 arrays.
      infer_max_steps: create the writer after this many buffered steps even
        if no episode has ended yet.
      split: the default split.
      **writer_kwargs: `DatasetWriter` arguments (`mode`, `version`,
        `max_episodes_per_file`, `file_format`, `metadata`, `fsync`, ...).
    """

    def __init__(
        self,
        data_directory: epath.PathLike,
        make_config: MakeConfig,
        *,
        step_metadata_info: Mapping[str, Any] | None = None,
        episode_metadata_info: Mapping[str, Any] | None = None,
        infer: bool = True,
        image_encoding: str = "bytes",
        infer_max_steps: int = 10_000,
        split: str = "train",
        **writer_kwargs: Any,
    ):
        self.data_directory = epath.Path(data_directory)
        self.split = split
        self._make_config = make_config
        self._declared_step = dict(step_metadata_info or {})
        self._declared_episode = dict(episode_metadata_info or {})
        self._image_encoding = image_encoding
        self._infer_max_steps = infer_max_steps
        self._writer_kwargs = writer_kwargs
        self._metadata = writer_kwargs.pop("metadata", None)
        self.writer: Any = None
        self._buffers: dict[Hashable, Any] = {}
        self._pending: dict[Hashable, _PendingEpisode] = {}
        # Finished episodes waiting for the writer: (split, terminated, episode).
        self._pending_done: list[tuple[str, bool, _PendingEpisode]] = []
        self._pending_steps = 0
        self._zeros: dict[str, Any] = {}
        self._closed = False
        if not infer:
            self._create_writer(self._declared_step, self._declared_episode)

    # ---------------------------------------------------------------- public

    @property
    def ready(self) -> bool:
        """Whether the dataset writer exists (features are known)."""
        return self.writer is not None

    def in_episode(self, slot: Hashable) -> bool:
        return slot in self._buffers or slot in self._pending

    def begin(
        self, slot: Hashable, observation: Any, step_metadata: Mapping[str, Any] | None
    ) -> None:
        """Starts an episode in `slot`; an open one there is ended as cut short."""
        self._check_open()
        if self.in_episode(slot):
            self.end(slot, terminated=False)
        if self.writer is None:
            pending = _PendingEpisode()
            pending.steps.append(_snapshot((observation, step_metadata)))
            self._pending[slot] = pending
            self._count_pending()
            return
        buffer = self.writer.new_buffer()
        buffer.start(observation, self._resolve(step_metadata))
        self._buffers[slot] = buffer

    def add(
        self,
        slot: Hashable,
        action: Any,
        reward: Any,
        discount: Any,
        observation: Any,
        step_metadata: Mapping[str, Any] | None,
    ) -> None:
        """Adds one transition (`a_t, r_t, d_t, o_{t+1}`) to the episode in `slot`."""
        buffer = self._buffers.get(slot)
        if buffer is not None:
            buffer.add(action, reward, discount, observation, self._resolve(step_metadata))
            return
        pending = self._pending.get(slot)
        if pending is None:
            raise RuntimeError(f"no episode is open in slot {slot!r}: begin one first")
        pending.steps.append(_snapshot((action, reward, discount, observation, step_metadata)))
        self._count_pending()

    def set_episode_metadata(self, slot: Hashable, metadata: Mapping[str, Any]) -> None:
        """Sets the metadata of the episode in `slot` (a later call replaces it)."""
        buffer = self._buffers.get(slot)
        if buffer is not None:
            buffer.set_episode_metadata(metadata)
        elif slot in self._pending:
            self._pending[slot].episode_metadata = metadata
        else:
            raise RuntimeError(f"no episode is open in slot {slot!r}")

    def end(self, slot: Hashable, terminated: bool, split: str | None = None) -> None:
        """Ends the episode in `slot` and hands it to the writer."""
        split = split or self.split
        buffer = self._buffers.pop(slot, None)
        if buffer is not None:
            self.writer.write(buffer.finish(terminated), split)
            return
        pending = self._pending.pop(slot, None)
        if pending is None:
            return
        self._pending_done.append((split, terminated, pending))
        self._materialize()

    def discard(self, slot: Hashable) -> None:
        """Drops the episode open in `slot` without writing it."""
        self._buffers.pop(slot, None)
        pending = self._pending.pop(slot, None)
        if pending is not None:
            self._pending_steps -= len(pending.steps)

    def flush(self) -> None:
        """Blocks until every ended episode is on disk (once the writer exists)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Ends open episodes (cut short), writes everything and closes."""
        if self._closed:
            return
        try:
            for slot in list(self._buffers) + list(self._pending):
                self.end(slot, terminated=False)
            if self.writer is None:
                if self._pending_done:
                    self._materialize()
                else:
                    self._create_empty()
        finally:
            self._closed = True
            if self.writer is not None:
                self.writer.close()

    @property
    def episodes_written(self) -> int:
        return self.writer.episodes_written if self.writer is not None else 0

    @property
    def steps_written(self) -> int:
        return self.writer.steps_written if self.writer is not None else 0

    @property
    def bytes_written(self) -> int:
        return self.writer.bytes_written if self.writer is not None else 0

    # --------------------------------------------------------------- private

    def _check_open(self) -> None:
        if self._closed:
            from rlds_writer.errors import WriterClosedError

            raise WriterClosedError(f"the recorder of {self.data_directory} is closed")

    def _count_pending(self) -> None:
        self._pending_steps += 1
        if self._pending_steps >= self._infer_max_steps:
            self._materialize()

    def _resolve(self, step_metadata: Mapping[str, Any] | None) -> Any:
        if not step_metadata or not self._zeros:
            return step_metadata
        if not any(v is ZERO for v in step_metadata.values()):
            return step_metadata
        out = dict(step_metadata)
        for key, value in out.items():
            if value is ZERO:
                if key not in self._zeros:
                    raise StepValueError(f"steps/{key}", "the dataset declares no such field")
                out[key] = self._zeros[key]
        return out

    def _create_empty(self) -> None:
        """At close with nothing recorded: create the dataset if features are known."""
        try:
            self._create_writer(self._declared_step, self._declared_episode)
        except Exception as e:  # noqa: BLE001
            _log.warning(
                "no episode was recorded and the metadata features are not all declared; "
                "no dataset was created in %s (%s)",
                self.data_directory,
                e,
            )

    def _create_writer(self, step_info: dict[str, Any], episode_info: dict[str, Any]) -> None:
        from rlds_writer import encoding
        from rlds_writer.writer import DatasetWriter

        config = self._make_config(dict(step_info), dict(episode_info))
        kwargs = dict(self._writer_kwargs)
        self.writer = DatasetWriter(
            self.data_directory,
            config,
            split=self.split,
            metadata=self._metadata,
            **kwargs,
        )
        steps_feature = self.writer.features[encoding.STEPS].feature
        self._zeros = {
            key: encoding.zero_value(steps_feature[key])
            for key in step_info
            if key in steps_feature
        }

    def _infer(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Features of undeclared metadata keys, from the buffered episodes."""
        from rlds_writer.spaces import feature_from_values

        episodes = [p for _, _, p in self._pending_done] + list(self._pending.values())
        step_values: dict[str, list[Any]] = {}
        episode_values: dict[str, list[Any]] = {}
        for episode in episodes:
            for step in episode.steps:
                meta = step[-1]
                for key, value in (meta or {}).items():
                    if key not in self._declared_step and value is not ZERO:
                        step_values.setdefault(key, []).append(value)
            for key, value in (episode.episode_metadata or {}).items():
                if key not in self._declared_episode:
                    episode_values.setdefault(key, []).append(value)
        step_info = dict(self._declared_step)
        for key, values in step_values.items():
            step_info[key] = feature_from_values(values, f"steps/{key}", self._image_encoding)
        # A key that only ever held ZERO has no type to infer.
        for episode in episodes:
            for step in episode.steps:
                for key, value in (step[-1] or {}).items():
                    if value is ZERO and key not in step_info:
                        raise SpecError(
                            f"steps/{key}: no value was seen in the first episode to infer "
                            "its type from; declare its feature"
                        )
        episode_info = dict(self._declared_episode)
        for key, values in episode_values.items():
            episode_info[key] = feature_from_values(values, key, self._image_encoding)
        return step_info, episode_info

    def _materialize(self) -> None:
        """Creates the writer from the buffered data and replays it."""
        if self.writer is not None:
            return
        step_info, episode_info = self._infer()
        self._create_writer(step_info, episode_info)
        done, self._pending_done = self._pending_done, []
        open_, self._pending = self._pending, {}
        self._pending_steps = 0
        for split, terminated, pending in done:
            buffer = self._replay(pending)
            self.writer.write(buffer.finish(terminated), split)
        for slot, pending in open_.items():
            self._buffers[slot] = self._replay(pending)

    def _replay(self, pending: _PendingEpisode) -> Any:
        buffer = self.writer.new_buffer()
        first, *rest = pending.steps
        buffer.start(first[0], self._resolve(first[1]))
        for action, reward, discount, observation, meta in rest:
            buffer.add(action, reward, discount, observation, self._resolve(meta))
        if pending.episode_metadata is not None:
            buffer.set_episode_metadata(pending.episode_metadata)
        return buffer
