"""Time-major columns of a batch of sub-envs: one ring `[L, N, ...]` per field.

Row `t` of the ring holds what vector step `t` returned for every sub-env:
the action taken, the reward and discount that followed and the observation
(and step metadata) it led to. Writing a step is one slice assignment per
field, whatever `N`. An episode of sub-env `i` is its first observation (its
*head*, kept in `heads[key][i]`, since a reset's observation may share a row
with the end of the previous episode) and the contiguous rows
`start[i] .. e` of column `i`, gathered once when it ends.

The rows of every episode that ends on the same step are gathered together:
one fancy index per field for all of them, into one array per field that the
episodes' columns are slices of (`gather`). Each episode comes out in RLDS's
layout: observations and step metadata `[head, rows...]`, actions, rewards
and discounts `[rows..., zero]`. Where the writer encodes batches of
episodes (`gather(later=True)`), nothing is gathered: the writer thread
writes each record straight from the ring's rows
(`store.writing.ring_records`), unless the ring must overwrite them first.

A ring is `chunks` chunks of `K` rows. Before a chunk is overwritten, the
sub-envs whose open episode still has rows in it copy their rows out
(`spill`), so a long episode pins no chunk: memory is the ring, the rows
spilled by open episodes and what the writer holds.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from rlds_writer.store.episodes.episode_data import ChunkedRows
from rlds_writer.store.features import field_specs
from rlds_writer.store.features.field_specs import BYTES
from rlds_writer.store.writing import batch_records

OBSERVATION_LIKE = "observation"  # a head, then one row per transition
TRANSITION = "transition"  # one row per transition, then the zero of the final step

# The ring's size: big enough that usual episodes never spill, small enough
# to stay a fixed cost next to the writer's queue.
DEFAULT_RING_BYTES = 32 << 20
CHUNKS = 4
_MIN_CHUNK_STEPS = 8
_MAX_CHUNK_STEPS = 1024
# Raw bytes rows of at least this many bytes leave a spilled episode in parts
# (`ChunkedRows`).
LARGE_ROWS = 8192


class BatchField:
    """One leaf field recorded per step, with its role in RLDS's alignment."""

    __slots__ = ("spec", "key", "role", "zero")

    def __init__(self, spec: field_specs.FieldSpec, role: str, zero: Any = None):
        self.spec = spec
        self.key = spec.key
        self.role = role
        self.zero = zero


def chunk_steps(fields: list[BatchField], num_envs: int, ring_bytes: int) -> int:
    """Rows per chunk for a ring of about `ring_bytes` over `CHUNKS` chunks."""
    step_bytes = max(1, num_envs * sum(f.spec.row_nbytes for f in fields))
    rows = ring_bytes // (step_bytes * CHUNKS)
    return int(min(_MAX_CHUNK_STEPS, max(_MIN_CHUNK_STEPS, rows)))


class TimeRing:
    """The ring of every field, the heads, and where each sub-env's open episode starts.

    Args:
      fields: the per-step leaf fields, in the order their values come in.
      num_envs: the batch size `N`.
      chunk: rows per chunk (`chunk_steps`).
      per_env: sub-envs are stepped apart (`write_some`), each at its own row.
      behind: called when a batch still pending (`defer`) would be cut out at the
        next chunk: the writer thread's wake-up (its batch lane), a chunk ahead.
    """

    def __init__(
        self,
        fields: list[BatchField],
        num_envs: int,
        chunk: int,
        per_env: bool = False,
        behind: Any = None,
    ):
        self.fields = fields
        self.num_envs = num_envs
        self.chunk = chunk
        self.size = chunk * CHUNKS
        self.ring = {
            f.key: np.empty((self.size, num_envs, *f.spec.shape), f.spec.dtype) for f in fields
        }
        self.heads = {
            f.key: np.zeros((num_envs, *f.spec.shape), f.spec.dtype)
            for f in fields
            if f.role == OBSERVATION_LIKE
        }
        # Each transition field's final-step row (its zero), as the C gather takes it.
        self.zeros = {}
        for f in fields:
            if f.role == TRANSITION:
                self.zeros[f.key] = np.empty((1, *f.spec.shape), f.spec.dtype)
                self.zeros[f.key][0] = f.zero
        self.start = np.zeros(num_envs, np.int64)  # first transition row of the open episode
        self.open = np.zeros(num_envs, np.bool_)
        self.t = 0  # the next row to write (all sub-envs stepped together)
        # Or each sub-env's next row, where they are stepped apart (`write_some`).
        self.tvec: np.ndarray | None = np.zeros(num_envs, np.int64) if per_env else None
        # sub-env -> field key -> rows copied out of the ring, in order
        self.spilled: dict[int, dict[str, list[np.ndarray]]] = {}
        # The keys of `spilled` as a mask, for the C step (`vector_step.py`).
        self.spilled_mask = np.zeros(num_envs, np.bool_)
        # Batches still only rows of the ring (`gather(later=True)`): (their oldest
        # row, the batch); cut out before a chunk holding their rows is overwritten,
        # if the writer thread has not encoded them by then.
        self.deferred: collections.deque[tuple[int, Any]] = collections.deque()
        self.behind = behind
        self._plan = np.empty((6, num_envs), np.int64)  # `end_masked`'s, reused (and the C step's)
        self.can_defer = (
            per_env is False
            and batch_records.native is not None
            and not any(f.spec.dtype.hasobject for f in fields)
        )

    # ------------------------------------------------------------ per step

    def begin(self, envs: np.ndarray, values: dict[str, np.ndarray], rows: Any = None) -> None:
        """Episodes begin in sub-envs `envs` with these first values.

        `values` are whole batches (`rows=None`: row `i` is sub-env `i`'s) or
        `rows`, the batch rows of `envs`.
        """
        take = envs if rows is None else rows
        for key, head in self.heads.items():
            head[envs] = values[key][take]
        self.start[envs] = self.t if self.tvec is None else self.tvec[envs]
        self.open[envs] = True
        if self.spilled:
            for i in envs.tolist():
                self.spilled.pop(i, None)
            self.spilled_mask[envs] = False

    def write(self, values: dict[str, np.ndarray]) -> None:
        """Writes one step's row for every sub-env."""
        t = self.t
        if t % self.chunk == 0 and t >= self.size - self.chunk:
            self._spill_before_overwrite(t)
        row = t % self.size
        for key, column in self.ring.items():
            column[row] = values[key]
        self.t = t + 1

    def write_some(self, values: dict[str, np.ndarray], envs: np.ndarray) -> None:
        """Writes one step of the sub-envs `envs` (each at its own time: EnvPool's async recv)."""
        tvec = self.tvec
        rows = tvec[envs] % self.size
        for key, column in self.ring.items():
            column[rows, envs] = values[key]
        tvec[envs] += 1
        # A sub-env whose next row would overwrite its episode's first copies it out.
        full = envs[self.open[envs] & (tvec[envs] - self.start[envs] >= self.size)]
        for i in full.tolist():
            self.spill(i)

    def defer(self, oldest: int, batch: Any) -> None:
        """Keeps `batch` (its episodes are rows from `oldest` on) until encoded or cut out."""
        self.deferred.append((oldest, batch))

    def _spill_before_overwrite(self, t: int) -> None:
        # The next chunk's rows overwrite rows t - size ... t + chunk - 1 - size.
        limit = t + self.chunk - self.size
        if self.deferred:
            kept: collections.deque[tuple[int, Any]] = collections.deque()
            soon = limit + self.chunk  # cut out at the next chunk if still pending then
            for oldest, batch in self.deferred:
                if oldest < limit:  # the writer thread is behind: cut them out here
                    batch.materialize()
                elif batch.pending:
                    kept.append((oldest, batch))
                    if oldest < soon and self.behind is not None:
                        self.behind()  # once: a wake-up not yet seen is not repeated
            self.deferred = kept
        for i in np.flatnonzero(self.open & (self.start < limit)):
            self.spill(int(i))

    def _next(self, i: int) -> int:
        return self.t if self.tvec is None else int(self.tvec[i])

    def spill(self, i: int) -> None:
        """Copies sub-env `i`'s rows out of the ring; its episode's rows then start anew."""
        start, end = int(self.start[i]), self._next(i)
        if start >= end:
            return
        rows = np.arange(start, end) % self.size
        out = self.spilled.setdefault(i, {})
        self.spilled_mask[i] = True
        for key, column in self.ring.items():
            out.setdefault(key, []).append(column[rows, i])
        self.start[i] = end

    # ------------------------------------------------------- episode ends

    def gather(
        self, envs: np.ndarray, later: bool = False
    ) -> tuple[Any, list[tuple[int, int, dict[str, np.ndarray]]]]:
        """Ends the open episodes of `envs` at their last written row; returns their columns.

        Args:
          envs: the sub-envs.
          later: where `can_defer`, `together`'s columns stay in the ring: its
            fourth item is where (`(envs, starts, counts, firsts)` of a
            `store.writing.ring_records.RingCut`; the episodes' first
            observations are copied now), its fifth the oldest ring row they
            hold: give the batch made of it to `defer`.

        Returns:
          `(together, apart)`: `together` is `(envs, offsets, steps, columns)`
          (`later`: `(envs, offsets, steps, cut, oldest)`) for the episodes
          wholly in the ring, episode `j` being rows
          `offsets[j] .. offsets[j] + steps[j] - 1` of each column (or None);
          `apart` is `(env, num_steps, columns)` for each spilled one. Both
          RLDS-aligned: the final step's transition values are zeros.
        """
        envs = np.asarray(envs, np.int64)
        self.open[envs] = False
        apart = []
        if self.spilled:
            spilled = np.array([i in self.spilled for i in envs.tolist()], np.bool_)
            apart = [self._gather_spilled(i) for i in envs[spilled].tolist()]
            envs = envs[~spilled]
        if not len(envs):
            return None, apart
        if later and self.can_defer:
            return self._gather_later(envs), apart
        return self._gather_ring(envs), apart

    def _gather_ring(self, envs: np.ndarray) -> tuple[Any, ...]:
        # Every episode's rows in one index per field: episode j is steps
        # offsets[j] .. offsets[j] + steps[j] - 1 of one array per field.
        last = self.t - 1 if self.tvec is None else self.tvec[envs] - 1
        starts = self.start[envs]
        rows_per = last - starts + 1  # transitions of each episode
        steps = rows_per + 1
        offsets = np.cumsum(steps) - steps
        total = int(steps[-1] + offsets[-1])
        columns: dict[str, np.ndarray] = {}
        native = batch_records.native
        if native is not None:  # one C call per field of plain values, without the GIL
            for field in self.fields:
                key, spec = field.key, field.spec
                if spec.dtype.hasobject:  # references: numpy copies them, counted
                    continue
                column = columns[key] = np.empty((total, *spec.shape), spec.dtype)
                head = field.role == OBSERVATION_LIKE
                first = self.heads[key] if head else self.zeros[key]
                native.gather(column, self.ring[key], first, envs, starts, rows_per, offsets, head)
            if len(columns) == len(self.fields):
                return envs, offsets, steps, columns
        transitions = int(rows_per.sum())
        if transitions:
            first_of = np.repeat(np.cumsum(rows_per) - rows_per, rows_per)
            k = np.arange(transitions) - first_of
            ring_rows = (np.repeat(starts, rows_per) + k) % self.size
            ring_envs = np.repeat(envs, rows_per)
            at = np.repeat(offsets, rows_per) + k  # transition rows; observations one later
        else:  # episodes that ended before any step (cut short at once)
            ring_rows = ring_envs = at = np.zeros(0, np.int64)
        finals = offsets + steps - 1
        for field in self.fields:
            key, spec = field.key, field.spec
            if key in columns:
                continue
            column = np.empty((total, *spec.shape), spec.dtype)
            if field.role == OBSERVATION_LIKE:
                column[offsets] = self.heads[key][envs]
                column[at + 1] = self.ring[key][ring_rows, ring_envs]
            else:
                column[at] = self.ring[key][ring_rows, ring_envs]
                column[finals] = field.zero
            columns[key] = column
        return envs, offsets, steps, columns

    def end_masked(self, mask: np.ndarray, terminated: np.ndarray | None) -> tuple[Any, ...] | None:
        """`gather(later=True)` of the open episodes of the sub-envs in `mask`, in one C call.

        For a ring that `can_defer` with nothing spilled (the caller checks);
        `mask` and `terminated` (None: cut short) C-contiguous bool `[N]`.

        Returns:
          None if no episode ends, else `(envs, offsets, steps, reasons, cut,
          oldest)`: `gather`'s, with each episode's end reason (0 terminated,
          1 truncated, 2 cut short) from one pass over the sub-envs.
        """
        plan = self._plan
        count, _, oldest = batch_records.native.plan(
            plan, mask, self.open, self.start, terminated, self.t
        )
        if not count:
            return None
        # A small copy of the reused plan's rows (the batch keeps them): a fresh
        # [6, N] array each step would cost a page fault per row.
        envs, starts, rows_per, offsets, steps, reasons = self._plan[:, :count].copy()
        return envs, offsets, steps, reasons, self._cut(envs, starts, rows_per), oldest

    def _gather_later(self, envs: np.ndarray) -> tuple[Any, ...]:
        last = self.t - 1
        starts = self.start[envs]
        rows_per = last - starts + 1
        steps = rows_per + 1
        offsets = np.cumsum(steps) - steps
        return envs, offsets, steps, self._cut(envs, starts, rows_per), int(starts.min())

    def _cut(self, envs: np.ndarray, starts: np.ndarray, rows_per: np.ndarray) -> tuple[Any, ...]:
        # Where the episodes' rows are, and their first observations copied now:
        # a reset on this step overwrites them (`store.writing.ring_records.RingCut`).
        return envs, starts, rows_per, tuple(head[envs] for head in self.heads.values())

    def _gather_spilled(self, i: int) -> tuple[int, int, dict[str, np.ndarray]]:
        spilled = self.spilled.pop(i)
        self.spilled_mask[i] = False
        rows = np.arange(int(self.start[i]), self._next(i)) % self.size
        columns = {}
        for field in self.fields:
            key = field.key
            parts = [*spilled[key], self.ring[key][rows, i]]
            if field.role == OBSERVATION_LIKE:
                parts.insert(0, self.heads[key][i : i + 1])
            else:
                zero = np.empty((1, *field.spec.shape), field.spec.dtype)
                zero[...] = field.zero  # (an object field's zero is a 0-d holder)
                parts.append(zero)
            if getattr(field.spec, "kind", None) == BYTES and field.spec.row_nbytes >= LARGE_ROWS:
                # Raw frames: the encoder writes the parts' rows as they are
                # (joining them would copy the episode once more).
                columns[key] = ChunkedRows(parts, sum(map(len, parts)))
            else:
                columns[key] = np.concatenate(parts)
        n = len(next(iter(columns.values())))
        return i, n, columns

    @property
    def spilled_rows(self) -> int:
        """Rows held by spilled episodes (for memory accounting)."""
        return sum(len(p) for d in self.spilled.values() for p in next(iter(d.values()), []))
