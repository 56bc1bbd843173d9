"""`BatchRecorder`: a batch of sub-envs recorded with one call per vector step.

    begin(observation, step_metadata, mask)      # episodes start where mask
    add(action, reward, discount, observation, step_metadata)   # one row per step
    replace(i, observation, step_metadata)       # sub-env i's row, where it differs
    end(mask, terminated)                        # episodes end where mask
    flush(); close()

Every value is a whole batch with a leading env axis (numpy, torch, JAX or
anything `record.batch.arrays` takes), kept column-wise in a time-major ring
(`record.batch.ring`): one slice assignment per field per step, no Python
object per sub-env. An episode is gathered once, when it ends, and handed to
the `DatasetWriter` as the same `store.episodes.episode_data.Episode` the single-env
`Recorder` makes, with the same values, so its record is byte for byte the
one `RecordRLDS` writes for that sub-env alone. Episodes still open at
`close()` (or at interpreter exit) are written cut short, as today.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer.errors import WriterClosedError
from rlds_writer.record.batch import objects
from rlds_writer.record.batch.arrays import check_batch, done_flags, host_array
from rlds_writer.record.batch.fields import (
    cast_single,
    check_kept,
    leaf_paths,
    pick,
    with_end_reason,
)
from rlds_writer.record.batch.frames import POSITION, BatchFrames, streamable
from rlds_writer.record.batch.inputs import StepInputs
from rlds_writer.record.batch.ring import (
    DEFAULT_RING_BYTES,
    OBSERVATION_LIKE,
    TRANSITION,
    BatchField,
    TimeRing,
    chunk_steps,
)
from rlds_writer.record.episode import ACTION, DISCOUNT, OBSERVATION, REWARD, StepFields
from rlds_writer.record.values import cast_value
from rlds_writer.store.episodes.episode_data import Episode
from rlds_writer.store.features import end_reasons
from rlds_writer.store.storage.object_path import as_path
from rlds_writer.store.writing.batch_records import EpisodeBatch
from rlds_writer.store.writing.exit_close import close_at_exit
from rlds_writer.store.writing.ring_records import RingCut, RingSource, flag_columns
from rlds_writer.store.writing.writer import DatasetWriter

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)

_GROUPS = (ACTION, REWARD, DISCOUNT)
METADATA = "metadata"


class BatchRecorder:
    """Records the episodes of `num_envs` sub-envs stepped together into one dataset.

    Args:
      data_directory: the dataset directory (local, or an fsspec URL).
      config: the `DatasetConfig` (`record.spaces.spaces_config` builds one from
        spaces); its episode metadata gets `end_reason` as the recorders' does.
      num_envs: the batch size `N`.
      split: the split episodes go to.
      per_env: sub-envs are stepped apart, a few at a time (`env_ids` at
        every `add`, as EnvPool's async `recv` gives them).
      ring_bytes: about how much memory the time-major ring takes (rows of
        longer episodes are copied out of it, never pinned).
      **writer_kwargs: `DatasetWriter` arguments (`mode`, `metadata`,
        `max_episodes_per_file`, `file_format`, `fsync`, `queue_size`, ...).

    Raises:
      UnsupportedFeatureError: a numeric or image per-step field of an open
        shape (text and TFDS-encoded fields are kept per sub-env: `objects.py`).
    """

    def __init__(
        self,
        data_directory: epath.PathLike,
        config: Any,
        num_envs: int,
        *,
        split: str = "train",
        per_env: bool = False,
        ring_bytes: int = DEFAULT_RING_BYTES,
        **writer_kwargs: Any,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.data_directory = as_path(data_directory)
        self.num_envs = num_envs
        self.split = split
        self._closed = False
        config = with_end_reason(config)
        self.writer = DatasetWriter(self.data_directory, config, split=split, **writer_kwargs)
        try:
            self._layout = StepFields(
                self.writer.encoder.fields, empty_dicts=self.writer.encoder.empty_dicts
            )
            self._fields, self._groups = self._batch_fields()
        except BaseException:
            self.writer.close()
            raise
        self._per_env = per_env
        # PNG/JPEG observations are encoded as they come, on the encoding
        # threads (`frames.py`); the ring keeps where each frame's bytes will
        # be (raw-bytes frames: their bytes).
        workers = self.writer.image_workers
        streamed = [f for f in self._fields if streamable(f.spec, f.role, workers)]
        self._frames = None
        if streamed:
            self._frames = BatchFrames(
                [f.spec for f in streamed], self.writer.image_workers, num_envs
            )
        # Text and fallback fields: a Python value per sub-env (`objects.py`).
        self._object_keys = [f.key for f in self._fields if f.spec.kind in objects.KINDS]
        self._inputs = StepInputs(self._groups, self._object_keys, num_envs)
        ring_fields = []
        for f in self._fields:
            if self._frames is not None and f in streamed:
                ring_fields += self._frames.ring_fields(f)
            else:
                ring_fields.append(objects.ring_field(f) if f.key in self._object_keys else f)
        rows = chunk_steps(ring_fields, num_envs, ring_bytes)
        self._ring = TimeRing(ring_fields, num_envs, rows, per_env, self.writer.lane.wake)
        # By index: 0 terminated, 1 truncated, 2 cut short.
        self._reason_values = [
            self._episode_values_for(reason)
            for reason in (end_reasons.TERMINATED, end_reasons.TRUNCATED, end_reasons.CUT_SHORT)
        ]
        # Episodes that end together are encoded together where every field allows.
        self._batched = self.writer.batch_encoder is not None
        # Ends of sub-envs stepped together in one C call, their records encoded
        # straight from the ring by the writer thread.
        self._plan_ends = self._batched and self._ring.can_defer
        self._source = None
        if self._plan_ends:
            ring = self._ring
            self._source = RingSource(
                ring.ring, ring.zeros, list(ring.heads), self._layout.flag_keys, self._reason_values
            )
        # A batch's memory per step (its columns and flags), for the writer's queue budget.
        self._row_nbytes = sum(f.spec.row_nbytes for f in self._fields) + 3 if self._batched else 0
        self._metadata_keys = list(self._layout.metadata_keys)
        close_at_exit(self)

    # ------------------------------------------------------------ set-up

    def _batch_fields(self) -> tuple[list[BatchField], dict[str, list[tuple[Any, BatchField]]]]:
        layout = self._layout
        fields: list[BatchField] = []
        groups: dict[str, list[tuple[Any, BatchField]]] = {}
        names = [OBSERVATION, *_GROUPS, *layout.metadata_keys]
        for name in names:
            if name not in layout.step_groups:
                continue
            role = TRANSITION if name in _GROUPS else OBSERVATION_LIKE
            group = METADATA if name in layout.metadata_keys else name
            prefix = (name,) if group == METADATA else ()
            for sub_path, spec in leaf_paths(layout.step_groups[name]):
                check_kept(spec)
                zero = layout.zeros.get(spec.key) if role == TRANSITION else None
                field = BatchField(spec, role, zero)
                fields.append(field)
                groups.setdefault(group, []).append(((*prefix, *sub_path), field))
        return fields, groups

    def _episode_values_for(self, reason: str) -> dict[str, Any]:
        values = {}
        for key, field in self._layout.episode_fields.items():
            values[key] = cast_value(field, reason) if key == end_reasons.END_REASON else None
        missing = [k for k, v in values.items() if v is None]
        if missing:
            _log.warning(
                "the batch recorder records no episode metadata; storing zeros for %s", missing
            )
            for key in missing:
                values[key] = self._layout.episode_fields[key].zero()
        return values

    # ------------------------------------------------------------- public

    @property
    def open(self) -> np.ndarray:
        """Which sub-envs have an episode open (a read-only view)."""
        view = self._ring.open.view()
        view.setflags(write=False)
        return view

    def begin(
        self,
        observation: Any,
        step_metadata: Mapping[str, Any] | None = None,
        mask: Any = None,
        env_ids: Any = None,
    ) -> None:
        """Starts episodes in the sub-envs of `mask` (default: all) with step 0 of each.

        An episode still open in one of them is written first, cut short.

        Args:
          observation: the batch of first observations (every row of the
            batch; only those in `mask` are read).
          step_metadata: step metadata key -> batch.
          mask: a boolean array over the batch's rows, or None for all.
          env_ids: the sub-env of each row, for a batch of some sub-envs
            (EnvPool's async `recv`); None: row `i` is sub-env `i`.
        """
        self._check_open()
        ids = self._inputs.ids(env_ids)
        rows = len(ids) if ids is not None else self.num_envs
        mask = self._inputs.mask(mask, rows)
        values = self._inputs.values(
            OBSERVATION_LIKE, rows, observation=observation, metadata=step_metadata
        )
        picked = np.flatnonzero(mask)
        envs = picked if ids is None else ids[picked]
        if self._frames is not None:
            self._frames.encode(values, picked, rows, begun=ids is None, ids=ids)
        reopen = envs[self._ring.open[envs]]
        if len(reopen):
            self._end_envs(reopen, False, cut_short=True)
        self._ring.begin(envs, values, None if ids is None else picked)

    def add(
        self,
        action: Any,
        reward: Any,
        discount: Any,
        observation: Any,
        step_metadata: Mapping[str, Any] | None = None,
        env_ids: Any = None,
    ) -> None:
        """Records one vector step: `a_t, r_t, d_t` and `o_{t+1}` of every sub-env.

        The rows of sub-envs without an open episode are ignored (the reset
        step of Gymnasium's next-step autoreset, a sub-env waiting for its reset).
        A refused value raises `StepValueError` naming the field, and the step
        is not recorded for any sub-env.

        Args:
          action, reward, discount, observation, step_metadata: batches.
          env_ids: as for `begin`; a recorder made with `per_env=True` takes
            them (each sub-env then has its own time).
        """
        self._check_open()
        ids = self._inputs.ids(env_ids)
        if (ids is not None) != self._per_env:
            raise ValueError(
                "env_ids are for a BatchRecorder made with per_env=True (sub-envs stepped "
                "apart), and it needs them at every add"
            )
        values = self._inputs.values(
            None,
            self.num_envs if ids is None else len(ids),
            observation=observation,
            metadata=step_metadata,
            action=action,
            reward=reward,
            discount=discount,
        )
        if self._frames is not None:  # the frames of the sub-envs in an episode
            live = self._ring.open if ids is None else self._ring.open[ids]
            self._frames.encode(values, np.flatnonzero(live), len(live), added=ids is None, ids=ids)
        if ids is None:
            self._ring.write(values)
        else:
            self._ring.write_some(values, ids)

    def replace(self, i: int, observation: Any, step_metadata: Mapping[str, Any] | None) -> None:
        """Replaces sub-env `i`'s observation and metadata (None: kept) in the step just added.

        For Gymnasium's same-step autoreset, whose batch holds the next
        episode's first observation where an episode ended (the final one
        comes in `info["final_obs"]`).
        """
        ring = self._ring
        row = (ring._next(i) - 1) % ring.size
        sources = {OBSERVATION: observation, METADATA: step_metadata}
        for group, leaves in self._groups.items():
            if sources.get(group) is None:
                continue
            for path, field in leaves:
                value = pick(sources[group], path, field.key)
                if field.key in self._object_keys:
                    ring.ring[field.key][row, i] = objects.one_value(field.spec, value)
                    continue
                value = cast_single(field.spec, value)
                if self._frames is not None and field.key in self._frames.specs:
                    self._frames.moved(field.key, i)
                    handle, place = self._frames.encode_one(field.key, value, i)
                    ring.ring[field.key][row, i] = handle
                    ring.ring[field.key + POSITION][row, i] = place
                else:
                    ring.ring[field.key][row, i] = value

    def replace_rows(
        self, envs: np.ndarray, observation: Any, step_metadata: Mapping[str, Any] | None = None
    ) -> bool:
        """`replace` for the sub-envs `envs` at once (batches of their rows; None: kept).

        False, nothing written: a field takes one value at a time (frames, object
        values) or the sub-envs are stepped apart; `replace` each one then.
        """
        ring, frames = self._ring, self._frames
        sources = {OBSERVATION: observation, METADATA: step_metadata}
        leaves = [
            (sources[g], p, f)
            for g, group in self._groups.items()
            if sources.get(g) is not None
            for p, f in group
        ]
        if ring.tvec is not None or any(
            f.key in self._object_keys or (frames is not None and f.key in frames.specs)
            for _, _, f in leaves
        ):
            return False
        n, batches = len(envs), []
        for source, p, f in leaves:
            value = host_array(pick(source, p, f.key) if p else source, f.key)
            batches.append((f.key, check_batch(f.spec, value, n)))
        row = (ring.t - 1) % ring.size
        for key, batch in batches:
            ring.ring[key][row, envs] = batch
        return True

    def end(
        self,
        mask: Any,
        terminated: Any = False,
        *,
        cut_short: bool = False,
        env_ids: Any = None,
    ) -> None:
        """Ends the open episodes of the sub-envs in `mask` after their last step added.

        Args:
          mask: a boolean array over the batch's rows (sub-envs without an
            open episode are skipped).
          terminated: a boolean array over the rows, or a bool: the env
            terminated the episode (`is_terminal`); else it was truncated.
          cut_short: the recorder, not the env, ended them (`end_reason`).
          env_ids: as for `begin`.
        """
        if (
            env_ids is None
            and self._plan_ends
            and not self._ring.spilled
            and type(mask) is np.ndarray
            and mask.dtype == np.bool_
            and mask.shape == (self.num_envs,)
            and mask.flags.c_contiguous
        ):
            if cut_short:
                self._end_planned(mask, None)
                return
            if (
                type(terminated) is np.ndarray
                and terminated.dtype == np.bool_
                and terminated.shape == mask.shape
                and terminated.flags.c_contiguous
            ):
                self._end_planned(mask, terminated)
                return
        ids = self._inputs.ids(env_ids)
        rows = self.num_envs if ids is None else len(ids)
        picked = np.flatnonzero(self._inputs.mask(mask, rows))
        if not len(picked):
            return
        if type(terminated) is not np.ndarray or terminated.dtype != np.bool_:
            terminated = done_flags(terminated, "terminated")  # 0.5 is refused, not True
        if terminated.shape != (rows,):
            terminated = np.broadcast_to(terminated, (rows,))
        terminated = terminated[picked].astype(np.bool_, copy=False)  # a copy of its own
        envs = picked if ids is None else ids[picked]
        keep = self._ring.open[envs]
        if keep.all():  # the usual case: every sub-env named has an episode open
            self._end_envs(envs, terminated, cut_short=cut_short)
        elif keep.any():
            self._end_envs(envs[keep], terminated[keep], cut_short=cut_short)

    def _end_envs(self, envs: np.ndarray, terminated: Any, cut_short: bool) -> None:
        if cut_short:
            terminated = np.zeros(envs.shape, np.bool_)
        elif type(terminated) is not np.ndarray or terminated.shape != envs.shape:
            terminated = np.broadcast_to(np.asarray(terminated, np.bool_), envs.shape)
        together, apart = self._ring.gather(envs, later=self._batched)
        write, split = self.writer.write, self.split
        if together is not None:
            ids, offsets, steps, columns = together[:4]
            if len(ids) == len(envs):  # none spilled: the same sub-envs, in order
                ended = terminated
            else:
                by_slot = np.zeros(self.num_envs, np.bool_)
                by_slot[envs] = terminated
                ended = by_slot[ids]
            if cut_short:
                reasons = np.full(len(ids), 2, np.int64)
            else:
                reasons = np.where(ended, 0, 1)
            if len(together) == 5:  # encoded from the ring later, by the writer thread
                self._defer(columns, offsets, steps, reasons, together[4])
            elif self._batched:
                columns.update(flag_columns(self._layout.flag_keys, offsets, steps, ended))
                write(EpisodeBatch(columns, offsets, steps, reasons, self._reason_values), split)
            else:
                columns.update(flag_columns(self._layout.flag_keys, offsets, steps, ended))
                frames = self._frames
                for j, (lo, n) in enumerate(zip(offsets.tolist(), steps.tolist())):
                    values = dict(self._reason_values[reasons[j]])
                    episode = {key: column[lo : lo + n] for key, column in columns.items()}
                    if frames is not None:
                        frames.episode_columns(episode)
                    if self._object_keys:
                        objects.as_lists(episode, self._object_keys)
                    write(Episode(episode, values, n), split)
        if apart:
            codes = [2] * len(envs) if cut_short else [0 if e else 1 for e in terminated.tolist()]
            self._write_apart(apart, dict(zip(envs.tolist(), codes)))

    def _write_apart(
        self, apart: list[tuple[int, int, dict[str, Any]]], reasons: dict[int, int]
    ) -> None:
        # Spilled episodes, one at a time (`TimeRing.gather`'s `apart`); `reasons`:
        # sub-env -> end reason (0 terminated, 1 truncated, 2 cut short).
        write, split = self.writer.write, self.split
        for i, n, columns in apart:
            reason = reasons[i]
            columns.update(self._layout.flags(n, reason == 0))
            if self._frames is not None:
                self._frames.episode_columns(columns)
            if self._object_keys:
                objects.as_lists(columns, self._object_keys)
            write(Episode(columns, dict(self._reason_values[reason]), n), split)

    def _end_planned(self, mask: np.ndarray, terminated: np.ndarray | None) -> None:
        # The usual vector step's ends: the episodes' bookkeeping in one C
        # call (`TimeRing.end_masked`), their columns cut by the writer thread.
        planned = self._ring.end_masked(mask, terminated)
        if planned is None:
            return
        envs, offsets, steps, reasons, fill, oldest = planned
        self._defer(fill, offsets, steps, reasons, oldest)

    def _defer(
        self, cut: Any, offsets: np.ndarray, steps: np.ndarray, reasons: np.ndarray, oldest: int
    ) -> None:
        # A batch whose records the writer thread encodes from the ring's rows
        # (`cut`: `TimeRing.gather`'s); the ring cuts its columns out first if it
        # would overwrite row `oldest` before then.
        envs, starts, counts, firsts = cut
        rows = int(offsets[-1] + steps[-1])  # the episodes' steps in all (no numpy sum)
        ring_cut = RingCut(self._source, envs, starts, counts, offsets, steps, reasons, firsts)
        values, nbytes = self._reason_values, rows * self._row_nbytes
        batch = EpisodeBatch(None, offsets, steps, reasons, values, ring_cut, nbytes, rows)
        self._ring.defer(oldest, batch)
        self.writer.write_deferred(batch, self.split)

    def flush(self) -> None:
        """Blocks until every ended episode is on disk and listed (`dataset_info.json`)."""
        self.writer.flush()

    def close(self) -> None:
        """Writes the open episodes, cut short, then closes the dataset."""
        if self._closed:
            return
        try:
            if self._ring.open.any():
                self._end_envs(np.flatnonzero(self._ring.open), False, cut_short=True)
        finally:
            self._closed = True
            self.writer.close()

    @property
    def episodes_written(self) -> int:
        return self.writer.episodes_written

    @property
    def steps_written(self) -> int:
        return self.writer.steps_written

    # ------------------------------------------------------------ private

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(f"the batch recorder of {self.data_directory} is closed")
