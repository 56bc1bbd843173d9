"""`Recorder`: the one contract every adapter talks to.

    begin(slot, observation, step_metadata)
    add(slot, action, reward, discount, observation, step_metadata)
    set_episode_metadata(slot, metadata)
    end(slot, terminated)            # or discard(slot)
    flush(); close()

A slot is one episode in progress (a vector env's sub-env, an RLlib
episode; the dm_env `TFDSBackendWriter` uses one). The recorder owns the
episode buffers (`EpisodeBuffer`, which checks every value and aligns steps
to RLDS) and hands each finished `store.episodes.episode_data.Episode` to its
`DatasetWriter`; it writes open episodes, cut short, at close and at
interpreter exit.

A TFDS dataset's features must be known when its `DatasetWriter` is created,
but the types of custom env data (Gymnasium `info` entries, `step_fn`
results, RLlib model outputs) are often only known once the env has run.
With `infer=True` the recorder keeps the raw values of the first episode,
infers the missing step and episode metadata features from them when that
episode ends (or after `infer_max_steps` steps, or at `close()`), creates the
writer, replays what it kept, and from then on feeds columnar buffers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import ForkedRecorderError, StepValueError, WriterClosedError
from rlds_writer.record.episode import StepFields
from rlds_writer.record.pending import ZERO, PendingEpisode, infer, snapshot
from rlds_writer.record.spaces import DEFAULT_IMAGE_ENCODING, DEFAULT_JPEG_QUALITY
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.features import end_reasons, feature_defs, field_specs
from rlds_writer.store.storage.object_path import as_path
from rlds_writer.store.writing.dataset_setup import check_mode
from rlds_writer.store.writing.exit_close import close_at_exit, forked_message, process_id
from rlds_writer.store.writing.writer import DatasetWriter

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)


def _env_end(terminated: bool) -> str:
    return end_reasons.TERMINATED if terminated else end_reasons.TRUNCATED


MakeConfig = Callable[[dict[str, Any], dict[str, Any]], Any]


class Recorder:
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
      image_encoding: how inferred image-like arrays are stored (`png`, `jpeg`,
        `bytes`, `zlib`, `none`).
      jpeg_quality: JPEG quality for `image_encoding="jpeg"`.
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
        image_encoding: str = DEFAULT_IMAGE_ENCODING,
        jpeg_quality: int = DEFAULT_JPEG_QUALITY,
        infer_max_steps: int = 10_000,
        split: str = "train",
        **writer_kwargs: Any,
    ):
        self.data_directory = as_path(data_directory)  # local: epath; scheme://: the seam
        self.split = split
        self._make_config = make_config
        self._declared_step = dict(step_metadata_info or {})
        self._declared_episode = dict(episode_metadata_info or {})
        self._image_encoding = image_encoding
        self._jpeg_quality = jpeg_quality
        self._infer_max_steps = infer_max_steps
        self._writer_kwargs = writer_kwargs
        self._metadata = writer_kwargs.pop("metadata", None)
        self.writer: Any = None
        self._fields: StepFields | None = None
        self._free: list[Any] = []  # finished buffers, empty again, for reuse
        self._buffers: dict[Hashable, Any] = {}
        self._stopped: set[Hashable] = set()
        self._pending: dict[Hashable, PendingEpisode] = {}
        # Finished episodes waiting for the writer: (split, terminated, end reason, episode).
        self._pending_done: list[tuple[str, bool, str, PendingEpisode]] = []
        self._pending_steps = 0
        self._zeros: dict[str, Any] = {}
        self._closed = False
        self._pid = process_id()  # a forked child gets an error, never the parent's files
        self._steps_at_fork: int | None = None
        if not infer:
            self._create_writer(self._declared_step, self._declared_episode)
        else:  # the writer comes with the first episode: refuse a taken directory now
            check_mode(self.data_directory, writer_kwargs.get("mode", "error"))
        # At exit, open episodes are written cut short before the writer closes.
        close_at_exit(self)

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
        if self._closed or self._pid != process_id():
            self._check_open()
        self._stopped.discard(slot)
        if slot in self._buffers or slot in self._pending:
            self.end(slot, terminated=False, cut_short=True)
        if self.writer is None:
            pending = PendingEpisode()
            pending.steps.append(snapshot((observation, step_metadata)))
            self._pending[slot] = pending
            self._count_pending()
            return
        buffer = self._new_buffer()
        try:
            buffer.start(observation, self._resolve(step_metadata))
        except BaseException:
            self._free.append(buffer)
            raise
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
        if slot in self._stopped:
            return  # the episode was cut short by a bad value; wait for begin()
        self._check_open()
        pending = self._pending.get(slot)
        if pending is None:
            raise RuntimeError(
                f"a step was added outside an episode (slot {slot!r}): begin one first "
                "(begin_episode / env.reset())"
            )
        pending.steps.append(snapshot((action, reward, discount, observation, step_metadata)))
        self._count_pending()

    def step_adder(self, slot: Hashable) -> Callable[[Any, Any, Any, Any, Any], None]:
        """`add` bound to the episode open in `slot`, for a per-step loop.

        Valid until that episode ends (`end`, `discard`, a cut short); call it
        again after the next `begin`. Where nothing has to be resolved per step
        it is the episode buffer's own `add`, one call less per step.
        """
        buffer = self._buffers.get(slot)
        if buffer is not None and not self._zeros:
            return buffer.add
        return functools.partial(self.add, slot)

    def prepared_adders(self) -> list[Callable[[Any, Any, Any, Any, Any], None]]:
        """The `step_adder`s the next episodes will get, where known before they begin.

        The buffers made ahead (the first one comes with the writer) and their
        compiled `add`: a recorder's per-step fast path can be built from them
        when it is created instead of at the first reset. Empty until the
        writer exists, and where `step_adder` resolves values per step.
        """
        if self.writer is None or self._zeros:
            return []
        return [buffer.add for buffer in self._free]

    def stopped(self, slot: Hashable) -> bool:
        """Whether a bad value ended the episode in `slot` early (until the next `begin`)."""
        return slot in self._stopped

    def set_episode_metadata(self, slot: Hashable, metadata: Mapping[str, Any]) -> None:
        """Sets the metadata of the episode in `slot` (a later call replaces it)."""
        if slot in self._stopped:
            return
        buffer = self._buffers.get(slot)
        if buffer is not None:
            buffer.set_episode_metadata(metadata)
        elif slot in self._pending:
            self._pending[slot].episode_metadata = metadata
        else:
            raise RuntimeError(f"no episode is open in slot {slot!r}")

    @interrupts.held
    def end(
        self,
        slot: Hashable,
        terminated: bool,
        split: str | None = None,
        *,
        cut_short: bool = False,
    ) -> None:
        """Ends the episode in `slot` and hands it to the writer.

        Args:
          slot: the episode's slot.
          terminated: the env terminated the episode (else it was truncated).
          split: the split to write it to (default: the recorder's).
          cut_short: the recorder, not the env, ended it (`end_reason`).
        """
        if self._pid != process_id():
            self._check_open()
        split = split or self.split
        reason = end_reasons.CUT_SHORT if cut_short else _env_end(terminated)
        if slot in self._stopped:
            self._stopped.discard(slot)
            return
        buffer = self._buffers.pop(slot, None)
        if buffer is not None:
            self._write(buffer, terminated, split, reason)
            return
        pending = self._pending.pop(slot, None)
        if pending is None:
            return
        self._pending_done.append((split, terminated, reason, pending))
        self._materialize()

    def discard(self, slot: Hashable) -> None:
        """Drops the episode open in `slot` without writing it."""
        buffer = self._buffers.pop(slot, None)
        if buffer is not None:
            buffer.clear()
            self._free.append(buffer)
        pending = self._pending.pop(slot, None)
        if pending is not None:
            self._pending_steps -= len(pending.steps)

    @interrupts.held
    def flush(self) -> None:
        """Blocks until every ended episode is on disk (once the writer exists)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Ends open episodes (cut short), writes everything and closes."""
        if self._closed:
            return
        if self._pid != process_id():
            # A forked child's copy: what it holds is the parent's to write.
            self._closed = True
            if self._open_steps() != self._steps_at_fork:
                raise ForkedRecorderError(
                    forked_message(self.data_directory, self._pid)
                    + " (the steps recorded here were not saved)"
                )
            return
        with interrupts.deferred(f"writing the open episodes and closing {self.data_directory}"):
            self._close()

    def _close(self) -> None:
        try:
            for slot in list(self._buffers) + list(self._pending):
                self.end(slot, terminated=False, cut_short=True)
            if self.writer is None:
                if self._pending_done:
                    self._materialize()
                else:
                    self._create_empty()
        finally:
            self._closed = True
            try:
                if self.writer is not None:
                    self.writer.close()
            finally:
                if self._fields is not None:
                    # Every episode is written: the chunks go to the next recording.
                    self._fields.pool.close()

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

    def inherited(self) -> None:
        """Called in a forked child: notes what the parent's open episodes held at the fork."""
        self._steps_at_fork = self._open_steps()

    def _open_steps(self) -> int:
        buffered = sum(buffer.num_steps for buffer in self._buffers.values())
        return buffered + sum(len(p.steps) for p in self._pending.values())

    def _check_open(self) -> None:
        if self._pid != process_id():
            raise ForkedRecorderError(forked_message(self.data_directory, self._pid))
        if self._closed:
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
        # Declared first so a user's own `end_reason` feature wins the name.
        episode_info = {end_reasons.END_REASON: feature_defs.Text(), **episode_info}
        config = self._make_config(dict(step_info), episode_info)
        kwargs = dict(self._writer_kwargs)
        self.writer = DatasetWriter(
            self.data_directory,
            config,
            split=self.split,
            metadata=self._metadata,
            **kwargs,
        )
        # Queued episodes, the one being written and the one being filled.
        self._fields = StepFields(
            self.writer.encoder.fields,
            buffers_in_flight=self.writer.queue_size + 2,
            empty_dicts=self.writer.encoder.empty_dicts,
            streamed=self.writer.encoder.streamed,
        )
        # The first episode's buffer (its step compiled) is made with the writer, not
        # at the first reset.
        self._free.append(self._fields.new_buffer())
        steps_feature = self.writer.features[field_specs.STEPS].feature
        self._zeros = {
            key: field_specs.zero_value(steps_feature[key])
            for key in step_info
            if key in steps_feature
        }

    @interrupts.held
    def _materialize(self) -> None:
        """Creates the writer from the buffered data and replays it."""
        if self.writer is not None:
            return
        step_info, episode_info = infer(
            [p for *_, p in self._pending_done] + list(self._pending.values()),
            self._declared_step,
            self._declared_episode,
            self._image_encoding,
            self._jpeg_quality,
        )
        self._create_writer(step_info, episode_info)
        done, self._pending_done = self._pending_done, []
        open_, self._pending = self._pending, {}
        self._pending_steps = 0
        for split, terminated, reason, pending in done:
            self._write(self._replay(pending), terminated, split, reason)
        for slot, pending in open_.items():
            self._buffers[slot] = self._replay(pending)

    @interrupts.held
    def cut_short(self, slot: Hashable, error: StepValueError) -> StepValueError:
        """Ends the episode in `slot` at its last good step; returns the error to raise.

        For adapters whose env has already moved on when a step's value is
        refused: leaving the episode open would record the next step after a
        missing one. Ending it here keeps every recorded episode whole; the
        rest of the env's episode is not recorded (`add` and `end` are no-ops
        for the slot until the next `begin`).
        """
        buffer = self._buffers.pop(slot, None)
        self._pending.pop(slot, None)
        self._stopped.add(slot)
        if buffer is not None:
            self._write(buffer, False, self.split, end_reasons.CUT_SHORT)
        message = str(error)[len(error.path) + 2 :]
        return StepValueError(
            error.path,
            f"{message}; the episode was recorded up to the last good step (cut short) "
            "and recording resumes at the next reset",
        )

    def _new_buffer(self) -> Any:
        return self._free.pop() if self._free else self._fields.new_buffer()

    def _write(self, buffer: Any, terminated: bool, split: str, reason: str) -> None:
        buffer.set_episode_value(end_reasons.END_REASON, reason)
        episode = buffer.finish(terminated)
        self._free.append(buffer)  # empty again: reused for the next episode
        self.writer.write(episode, split)

    def _replay(self, pending: PendingEpisode) -> Any:
        buffer = self._new_buffer()
        first, *rest = pending.steps
        buffer.start(first[0], self._resolve(first[1]))
        for action, reward, discount, observation, meta in rest:
            buffer.add(action, reward, discount, observation, self._resolve(meta))
        if pending.episode_metadata is not None:
            buffer.set_episode_metadata(pending.episode_metadata)
        return buffer
