"""Columnar episode buffer and the RLDS step alignment.

A step appends each leaf value to a per-field column (`record.columns`,
after the checks of `record.values`); nothing is encoded per step. At episode
end the buffer produces RLDS-aligned columns:

* step `t` holds observation `o_t`, the action `a_t` taken after it, and the
  reward `r_t` and discount `d_t` that followed `a_t`;
* the final step holds the last observation and zeros (built from the feature
  spec) for action, reward and discount;
* `is_first` is set on step 0, `is_last` on the final step, `is_terminal` on
  the final step only when the episode ended by termination.
"""

from __future__ import annotations

import _thread
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import RecorderThreadError, StepValueError
from rlds_writer.record.appender import build_appender, compile_step_add
from rlds_writer.record.chunk_columns import LargeArrayColumn
from rlds_writer.record.columns import make_column
from rlds_writer.record.row_columns import skip
from rlds_writer.record.values import cast_value
from rlds_writer.store.episodes.episode_data import BufferPool, Episode, PackedColumn
from rlds_writer.store.features import field_specs
from rlds_writer.store.features.end_reasons import END_REASON
from rlds_writer.store.images.frame_stream import FrameCodec, FrameStream

_log = logging.getLogger(__name__)

OBSERVATION = "observation"
ACTION = "action"
REWARD = "reward"
DISCOUNT = "discount"
IS_FIRST = "is_first"
IS_LAST = "is_last"
IS_TERMINAL = "is_terminal"
_FLAGS = (IS_FIRST, IS_LAST, IS_TERMINAL)
_TRANSITION = (ACTION, REWARD, DISCOUNT)
_NUMERIC = (field_specs.FLOAT, field_specs.INT)
_BOOL = np.dtype(np.bool_)


def _tree(
    fields: list[field_specs.FieldSpec], depth: int, empty: Sequence[tuple[str, ...]] = ()
) -> dict[str, Any]:
    """Groups fields into a nested dict keyed by path components from `depth`.

    `empty` paths (empty `FeaturesDict`s) become empty dicts: their value is `{}`.
    """
    root: dict[str, Any] = {}
    for path in empty:
        node = root
        for name in path[depth:]:
            node = node.setdefault(name, {})
    for field in fields:
        node = root
        for name in field.path[depth:-1]:
            node = node.setdefault(name, {})
        node[field.path[-1]] = field
    return root


def rlds_flags(n: int, terminated: bool) -> dict[str, np.ndarray]:
    """RLDS's flags for an episode of `n` steps (the final one observation-only).

    `is_first` on step 0, `is_last` on step `n - 1`, `is_terminal` on step
    `n - 1` only if the env terminated the episode.
    """
    first, last, terminal = (np.zeros(n, dtype=np.bool_) for _ in range(3))
    first[0] = last[-1] = True
    terminal[-1] = bool(terminated)
    return {IS_FIRST: first, IS_LAST: last, IS_TERMINAL: terminal}


class StepFields:
    """How step and episode values map onto the dataset's leaf fields.

    Built once per dataset from the compiled fields; creates `EpisodeBuffer`s.

    Args:
      fields: the fields compiled by `field_specs.compile_fields`.
      buffers_in_flight: finished episodes that may wait for the writer at
        once; that many large-row buffers are kept for reuse.
      empty_dicts: paths of empty `FeaturesDict`s (`field_specs.empty_dict_paths`),
        whose value is `{}`.
      streamed: image field key -> (codec, threads) for the fields whose frames
        are encoded while the episode runs (`EpisodeEncoder.streamed`); each
        buffer gets its own `FrameStream` for them.
    """

    def __init__(
        self,
        fields: list[field_specs.FieldSpec],
        buffers_in_flight: int = 6,
        empty_dicts: Sequence[tuple[str, ...]] = (),
        streamed: Mapping[str, tuple[FrameCodec, int]] | None = None,
    ):
        self.fields = fields
        self.streamed = dict(streamed or {})
        step_fields = [f for f in fields if f.in_steps]
        in_steps = [p for p in empty_dicts if p[0] == field_specs.STEPS]
        groups = _tree(step_fields, 1, in_steps)
        self.step_groups = groups
        self.metadata_keys = [k for k in groups if k not in (OBSERVATION, *_TRANSITION, *_FLAGS)]
        self.episode_tree = _tree(
            [f for f in fields if not f.in_steps],
            0,
            [p for p in empty_dicts if p[0] != field_specs.STEPS],
        )
        self.episode_fields = {f.key: f for f in fields if not f.in_steps}
        self.flag_keys = {name: f"{field_specs.STEPS}/{name}" for name in _FLAGS if name in groups}
        # Scalar zeros as Python scalars: the columns take those without a cast.
        self.zeros = {
            f.key: f.zero().item() if f.shape == () and f.kind in _NUMERIC else f.zero()
            for f in step_fields
            if f.path[1] in _TRANSITION
        }
        self._flags: dict[tuple[int, bool], dict[str, np.ndarray]] = {}
        self._warned_missing_episode = False
        # Enough recycled buffers for every episode the writer may hold at once.
        self.pool = BufferPool(buffers_in_flight)

    def new_buffer(self) -> EpisodeBuffer:
        return EpisodeBuffer(self)

    def flags(self, n: int, terminated: bool) -> dict[str, PackedColumn]:
        """`rlds_flags` under the dataset's keys, packed and kept per episode length."""
        flags = self._flags.get((n, terminated))
        if flags is None:
            if len(self._flags) >= 64:  # episode lengths vary: keep the recent ones
                self._flags.clear()
            flags = {}
            for name, values in rlds_flags(n, terminated).items():
                if name in self.flag_keys:
                    # Bools are one-byte varints: handed over packed, built once per length.
                    flags[self.flag_keys[name]] = PackedColumn(values.tobytes(), n, (), _BOOL)
            self._flags[n, terminated] = flags
        return flags


def other_thread_error() -> RecorderThreadError:
    """The error of a step from another thread than the one that began the episode."""
    return RecorderThreadError(
        f"a step from thread {threading.current_thread().name!r} in an episode another "
        "thread records (it began it with reset): a recorder records one env loop; step "
        "it from one thread, or give each thread an env and recorder of its own"
    )


class EpisodeBuffer:
    """Collects the steps of one episode in per-field columns.

    Call `start` with the first observation, `add` once per transition, then
    `finish`, after which the buffer is empty and can record the next episode.
    A step that fails validation is rolled back entirely: the buffer stays as
    it was before the call, and the error propagates.
    """

    # Slots: `num_steps` is read and written at every step, by the C step too
    # (record/step_kernel.py), which reaches a slot without an attribute lookup.
    __slots__ = (
        "layout", "columns", "_obs_columns", "_transition_columns", "_obs", "_action",
        "_reward", "_discount", "_meta", "_episode_values", "_large_columns", "_other_columns",
        "add", "num_steps", "_zero_appends", "_column_items", "_resets", "owner",
    )  # fmt: skip

    def __init__(self, layout: StepFields):
        self.layout = layout
        self.columns: dict[str, Any] = {}
        self._obs_columns: list[Any] = []
        self._transition_columns: list[Any] = []

        def leaf(field: field_specs.FieldSpec) -> Callable[[Any], None]:
            stream = None
            if field.key in layout.streamed:
                codec, threads = layout.streamed[field.key]
                stream = FrameStream(codec, threads)
            column = make_column(field, layout.pool, stream)
            self.columns[field.key] = column
            return column.append

        groups = layout.step_groups
        prefix = field_specs.STEPS

        def group(name: str, target: list[Any]) -> Callable[[Any], None] | None:
            if name not in groups:
                return None
            before = set(self.columns)
            appender = build_appender(groups[name], f"{prefix}/{name}", leaf)
            target.extend(self.columns[k] for k in self.columns if k not in before)
            return appender

        self._obs = group(OBSERVATION, self._obs_columns) or skip
        self._action = group(ACTION, self._transition_columns) or skip
        self._reward = group(REWARD, self._transition_columns) or skip
        self._discount = group(DISCOUNT, self._transition_columns) or skip
        meta_tree = {k: groups[k] for k in layout.metadata_keys}
        before = set(self.columns)
        self._meta = (
            build_appender(meta_tree, f"{prefix}/<step metadata>", leaf) if meta_tree else None
        )
        self._obs_columns.extend(self.columns[k] for k in self.columns if k not in before)
        self._episode_values: dict[str, Any] = {}
        self._large_columns = [c for c in self.columns.values() if isinstance(c, LargeArrayColumn)]
        self._other_columns = [c for c in self.columns.values() if c not in self._large_columns]
        # The step as one generated function; the closures check what it does not take.
        compiled = {
            argument: groups[name]
            for argument, name in (
                ("action", ACTION),
                ("reward", REWARD),
                ("discount", DISCOUNT),
                ("next_observation", OBSERVATION),
            )
            if name in groups
        }
        if meta_tree:
            compiled["step_metadata"] = meta_tree
        self.add = compile_step_add(compiled, self.columns, self, self._make_add())
        self.num_steps = 0
        # The ident of the thread that began the episode: the steps of another
        # thread are refused (the C step reads this slot too).
        self.owner = 0
        # For `finish`, which runs once per episode (per 100 steps in Catch):
        # its loops without dict lookups or bound-method lookups.
        self._zero_appends = [
            self.columns[key].zero_append(zero) for key, zero in layout.zeros.items()
        ]
        self._column_items = list(self.columns.items())
        self._resets = [c.reset for c in self._other_columns]

    def start(self, observation: Any, step_metadata: Mapping[str, Any] | None = None) -> None:
        """Records step 0: the first observation and its step metadata."""
        if self.num_steps:
            raise RuntimeError("EpisodeBuffer.start called twice")
        self.owner = _thread.get_ident()
        self._append_observation(observation, step_metadata)

    def refuse_thread(self) -> None:
        """Raises `RecorderThreadError`: a step came from another thread than the episode's."""
        raise other_thread_error()

    def _make_add(self) -> Callable[..., None]:
        # The checked form of a step: every value through its appender, which
        # takes the other forms a value may come in or says what is wrong.
        act, rew, disc = self._action, self._reward, self._discount
        obs, meta = self._obs, self._meta
        buffer = self

        def add(
            action: Any,
            reward: Any,
            discount: Any,
            next_observation: Any,
            step_metadata: Mapping[str, Any] | None = None,
        ) -> None:
            """Records one transition: `a_t, r_t, d_t` and the observation `o_{t+1}`."""
            n = buffer.num_steps
            if not n:
                raise RuntimeError("EpisodeBuffer.add called before start")
            if _thread.get_ident() != buffer.owner:
                buffer.refuse_thread()
            try:
                act(action)
                rew(reward)
                disc(discount)
                obs(next_observation)
                if meta is not None:
                    buffer._append_metadata(step_metadata)
                elif step_metadata:
                    buffer._reject_metadata(step_metadata)
                buffer.num_steps = n + 1
            except BaseException:  # a Ctrl-C too: a step is all or nothing
                buffer._rollback(n)
                buffer.num_steps = n
                raise

        return add

    def _append_observation(self, observation: Any, step_metadata: Any) -> None:
        n = self.num_steps
        try:
            self._obs(observation)
            if self._meta is not None:
                self._append_metadata(step_metadata)
            elif step_metadata:
                self._reject_metadata(step_metadata)
            self.num_steps = n + 1
        except BaseException:  # a Ctrl-C too
            self._rollback(n)
            self.num_steps = n
            raise

    def _append_metadata(self, step_metadata: Any) -> None:
        if step_metadata is None:
            raise StepValueError(
                f"{field_specs.STEPS}/<step metadata>",
                f"expected a dict with keys {sorted(self.layout.metadata_keys)}, got None",
            )
        self._meta(step_metadata)

    def _reject_metadata(self, step_metadata: Any) -> None:
        keys = sorted(step_metadata) if isinstance(step_metadata, Mapping) else step_metadata
        raise StepValueError(
            f"{field_specs.STEPS}/<step metadata>",
            f"the dataset declares no step metadata, got {keys!r:.80}",
        )

    def _rollback(self, n_steps: int) -> None:
        for column in self._obs_columns:
            column.truncate(n_steps)
        for column in self._transition_columns:
            column.truncate(max(n_steps - 1, 0))

    def clear(self) -> None:
        """Drops the steps recorded so far; the buffer can start a new episode."""
        self._rollback(0)
        self._episode_values = {}
        self.num_steps = 0

    def set_episode_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Validates and stores episode metadata (later calls replace earlier ones)."""
        tree = self.layout.episode_tree
        if END_REASON in tree and END_REASON not in metadata:
            metadata = {**metadata, END_REASON: ""}  # the recorder sets it at the episode's end
        values: dict[str, Any] = {}

        def leaf(field: field_specs.FieldSpec) -> Callable[[Any], None]:
            def store(value: Any) -> None:
                values[field.key] = cast_value(field, value)

            return store

        build_appender(tree, "<episode metadata>", leaf)(metadata)
        self._episode_values = values

    def set_episode_value(self, key: str, value: Any) -> None:
        """Sets one episode-level field, keeping the others (no-op if the dataset lacks it)."""
        field = self.layout.episode_fields.get(key)
        if field is not None:
            self._episode_values[key] = cast_value(field, value)

    def finish(self, terminated: bool) -> Episode:
        """Closes the episode and returns its RLDS-aligned columns.

        Args:
          terminated: True if the episode ended by termination (the final step
            gets `is_terminal=True`); False for truncation or a cut-short episode.

        Returns:
          The finished `Episode`.
        """
        n = self.num_steps
        if n == 0:
            raise RuntimeError("EpisodeBuffer.finish called on an empty episode")
        layout = self.layout
        for size, push, zero in self._zero_appends:
            if size() == n - 1:
                push(zero)
        out: dict[str, Any] = {}
        for key, column in self._column_items:
            if column.n != n:
                raise RuntimeError(f"internal: column {key} has {column.n} values for {n} steps")
            out[key] = column.values()
        out.update(layout.flags(n, terminated))
        episode_values = self._episode_values  # the buffer starts a new dict below
        if len(episode_values) != len(layout.episode_fields):  # its keys are declared ones
            missing = [k for k in layout.episode_fields if k not in episode_values]
            if not layout._warned_missing_episode:
                _log.warning(
                    "no episode metadata was given for %s in an episode; storing zeros "
                    "(this warning is shown once)",
                    missing,
                )
                layout._warned_missing_episode = True
            for key in missing:
                episode_values[key] = layout.episode_fields[key].zero()
        # The columns give their storage away: the buffer is empty and reusable.
        buffers = []
        for column in self._large_columns:
            buffers.extend(column.detach())
        for reset in self._resets:
            reset()
        self._episode_values = {}
        self.num_steps = 0
        return Episode(out, episode_values, n, buffers, layout.pool)
