"""`TFDSBackendWriter`: envlogger's TFDS backend by name, a face on the one `Recorder`.

In envlogger, `TFDSBackendWriter` is a `BackendWriter` that `EnvLogger` drives
one `StepData(timestep, action, custom_data)` at a time, as
`record_step(data, is_new_episode)` (the backend itself turns consecutive
timesteps into RLDS steps), plus `set_episode_metadata(data)` and `close()`;
user code rarely calls it, it hands it to `EnvLogger(env, backend=...)`. This
class keeps that name and envlogger's constructor arguments (`data_directory`,
`ds_config`, `max_episodes_per_file`, `split_name`, `version`,
`store_ds_metadata`; the dataset metadata is `ds_metadata=` here where
envlogger takes the base class's `metadata=`, and `store_ds_metadata`
defaults to True here, False there), so `EnvLogger(env, backend=...)` code
moves over by changing imports. Its calls are this package's RLDS-aligned ones
instead of `record_step`:

    begin_episode(observation, step_metadata)
    add_step(action, reward, discount, next_observation, step_metadata)
    set_episode_metadata(metadata)
    end_episode(terminated)

each going to `record.recorder.Recorder` (one slot, features fixed by the
`DatasetConfig`), like every other adapter; `write_episode` records a whole
episode from arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import StepValueError
from rlds_writer.record.dm_env.whole_episodes import episode_calls
from rlds_writer.record.recorder import Recorder
from rlds_writer.store.formats.shards import DEFAULT_FILE_FORMAT

if TYPE_CHECKING:
    from etils import epath

_SLOT = 0


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
        file_format: str = DEFAULT_FILE_FORMAT,
        mode: str = "error",
        **writer_kwargs: Any,
    ):
        self.store_ds_metadata = store_ds_metadata
        self.split_name = split_name
        self.recorder = Recorder(
            data_directory,
            lambda step_info, episode_info: ds_config,
            infer=False,
            split=split_name,
            version=version,
            max_episodes_per_file=max_episodes_per_file,
            file_format=file_format,
            mode=mode,
            metadata=(dict(ds_metadata or {}) if store_ds_metadata else None),
            **writer_kwargs,
        )
        self.writer = self.recorder.writer
        # When appending, the writer starts from the dataset's metadata.json:
        # later updates add to the keys earlier runs wrote instead of dropping them.
        self._metadata = self.writer.metadata if store_ds_metadata else {}

    @property
    def data_directory(self) -> epath.Path:
        return self.writer.path

    @property
    def in_episode(self) -> bool:
        """Whether an episode has begun and not ended."""
        return self.recorder.in_episode(_SLOT)

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
        self.recorder.begin(_SLOT, observation, step_metadata)

    def add_step(
        self,
        action: Any,
        reward: Any,
        discount: Any,
        next_observation: Any,
        step_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Records action `a_t`, reward `r_t`, discount `d_t` and observation `o_{t+1}`."""
        # The recorder refuses a step outside an episode itself (per-step path).
        self.recorder.add(_SLOT, action, reward, discount, next_observation, step_metadata)

    def step_adder(self) -> Callable[[Any, Any, Any, Any, Any], None]:
        """`add_step` bound to the open episode, valid until it ends (for per-step loops)."""
        return self.recorder.step_adder(_SLOT)

    def write_episode(
        self,
        steps: Any,
        *,
        episode_metadata: Mapping[str, Any] | None = None,
        terminated: bool = False,
        split: str | None = None,
    ) -> None:
        """Writes one whole episode from arrays or step dicts, as if it were recorded.

        The episode goes through the same calls as recording (`begin_episode`,
        `add_step`, ...), so values are validated and cast the same way and
        the episode is as durable. A refused value writes nothing of this
        episode; episodes written before stay.

        Args:
          steps: a dict of columns (`observation` with n rows; `action`,
            `reward`, `discount` with n - 1; step-metadata keys with n) or a
            list of n RLDS-style step dicts; see `record.dm_env.whole_episodes`.
          episode_metadata: the episode metadata, if the dataset declares any.
          terminated: the episode ended by termination (else truncation).
          split: the split (default: this writer's `split_name`).

        Raises:
          StepValueError: the first bad column or value, by field path.
          RuntimeError: an episode is being recorded (end it first).
        """
        if self.recorder.in_episode(_SLOT):
            raise RuntimeError("write_episode called while an episode is open: end it first")
        (observation, metadata), transitions = episode_calls(steps)
        recorder = self.recorder
        try:
            recorder.begin(_SLOT, observation, metadata)
            for action, reward, discount, next_observation, step_metadata in transitions:
                recorder.add(_SLOT, action, reward, discount, next_observation, step_metadata)
            if episode_metadata is not None:
                recorder.set_episode_metadata(_SLOT, episode_metadata)
        except BaseException:
            recorder.discard(_SLOT)  # a whole episode or nothing
            raise
        recorder.end(_SLOT, terminated, split or self.split_name)

    def set_episode_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Sets the current episode's metadata (a later call replaces it)."""
        if not self.recorder.in_episode(_SLOT) and not self.recorder.stopped(_SLOT):
            raise RuntimeError("set_episode_metadata called outside an episode")
        self.recorder.set_episode_metadata(_SLOT, metadata)

    def cut_short(self, error: StepValueError) -> StepValueError:
        """Ends the episode at its last good step after `error`; returns the error to raise.

        For wrappers whose env has moved on past a refused step (see
        `Recorder.cut_short`); steps are ignored until the next `begin_episode`.
        """
        return self.recorder.cut_short(_SLOT, error)

    def end_episode(self, terminated: bool) -> None:
        """Ends the current episode and hands it to the writer.

        Args:
          terminated: True if the episode ended by termination; False if it was
            truncated or cut short.
        """
        self.recorder.end(_SLOT, terminated)

    def flush(self) -> None:
        """Blocks until every ended episode is on disk and listed."""
        self.recorder.flush()

    def close(self) -> None:
        """Ends an open episode (cut short), writes everything and closes."""
        self.recorder.close()

    def __enter__(self) -> TFDSBackendWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
