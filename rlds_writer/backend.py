"""`TFDSBackendWriter`: the recorder every adapter talks to.

It has envlogger's TFDS backend's name and constructor arguments, and the one
call shape that all adapters (dm_env, Gymnasium, RLlib) use:

    begin_episode(observation, step_metadata)
    add_step(action, reward, discount, next_observation, step_metadata)
    set_episode_metadata(metadata)
    end_episode(terminated)

It owns the current `EpisodeBuffer` and a `DatasetWriter`.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from etils import epath

from rlds_writer import steps
from rlds_writer import writer as _writer
from rlds_writer.writer import DatasetWriter

_OPEN_RECORDERS: weakref.WeakSet = weakref.WeakSet()


def _close_open_recorders() -> None:
    for recorder in list(_OPEN_RECORDERS):
        recorder.close()


_writer._EXIT_HOOKS.append(_close_open_recorders)


class TFDSBackendWriter:
    """Records episodes into an RLDS dataset in TFDS format.

    Args:
      data_directory: the dataset directory (created if missing).
      ds_config: a `tfds.rlds.rlds_base.DatasetConfig`.
      max_episodes_per_file: episodes per shard file.
      split_name: the split episodes are written to.
      version: the dataset version.
      store_ds_metadata: write dataset-level metadata to `metadata.json`.
      ds_metadata: initial dataset-level metadata.
      file_format: `tfrecord` or `array_record`.
      mode: `error`, `append` or `overwrite` when the directory holds a dataset.
      **writer_kwargs: further `DatasetWriter` options (`fsync`, `queue_size`,
        `commit_interval`, `image_workers`, `name`).
    """

    def __init__(
        self,
        data_directory: epath.PathLike,
        ds_config: Any,
        max_episodes_per_file: int = 1000,
        split_name: str = "train",
        version: str = "0.0.1",
        store_ds_metadata: bool = True,
        ds_metadata: Mapping[str, Any] | None = None,
        file_format: str = "tfrecord",
        mode: str = "error",
        **writer_kwargs: Any,
    ):
        self.store_ds_metadata = store_ds_metadata
        self.split_name = split_name
        self.writer = DatasetWriter(
            data_directory,
            ds_config,
            version=version,
            split=split_name,
            max_episodes_per_file=max_episodes_per_file,
            file_format=file_format,
            mode=mode,
            metadata=(dict(ds_metadata or {}) if store_ds_metadata else None),
            **writer_kwargs,
        )
        # When appending, the writer starts from the dataset's metadata.json:
        # later updates add to the keys earlier runs wrote instead of dropping them.
        self._metadata = dict(self.writer._metadata or {}) if store_ds_metadata else {}
        self._buffer: steps.EpisodeBuffer | None = None
        self._spare: steps.EpisodeBuffer | None = None
        self._closed = False
        # At interpreter exit an open episode is ended (cut short) and written.
        _OPEN_RECORDERS.add(self)

    @property
    def data_directory(self) -> epath.Path:
        return self.writer.path

    @property
    def in_episode(self) -> bool:
        """Whether an episode has begun and not ended."""
        return self._buffer is not None

    def update_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Merges `metadata` into the dataset metadata (`metadata.json`)."""
        self._metadata.update(metadata)
        if self.store_ds_metadata:
            self.writer.set_metadata(self._metadata)

    def begin_episode(
        self, observation: Any, step_metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Starts an episode with its first observation.

        An episode still open is ended first as cut short (`is_terminal=False`).
        """
        if self._buffer is not None:
            self.end_episode(terminated=False)
        buffer = self._spare if self._spare is not None else self.writer.new_buffer()
        self._spare = None
        buffer.start(observation, step_metadata)
        self._buffer = buffer

    def add_step(
        self,
        action: Any,
        reward: Any,
        discount: Any,
        next_observation: Any,
        step_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Records action `a_t`, reward `r_t`, discount `d_t` and observation `o_{t+1}`."""
        buffer = self._buffer
        if buffer is None:
            raise RuntimeError(
                "add_step called outside an episode: call begin_episode (env.reset()) first"
            )
        buffer.add(action, reward, discount, next_observation, step_metadata)

    def set_episode_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Sets the current episode's metadata (a later call replaces it)."""
        if self._buffer is None:
            raise RuntimeError("set_episode_metadata called outside an episode")
        self._buffer.set_episode_metadata(metadata)

    def end_episode(self, terminated: bool) -> None:
        """Ends the current episode and hands it to the writer thread.

        Args:
          terminated: True if the episode ended by termination; False if it was
            truncated or cut short.
        """
        buffer, self._buffer = self._buffer, None
        if buffer is None:
            return
        episode = buffer.finish(terminated)
        self._spare = buffer  # empty again: reused for the next episode
        self.writer.write(episode, self.split_name)

    def flush(self) -> None:
        """Blocks until every ended episode is on disk and listed."""
        self.writer.flush()

    def close(self) -> None:
        """Ends an open episode (cut short), writes everything and closes."""
        if self._closed:
            return
        self._closed = True
        _OPEN_RECORDERS.discard(self)
        try:
            if self._buffer is not None:
                self.end_episode(terminated=False)
        finally:
            self.writer.close()

    def __enter__(self) -> TFDSBackendWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
