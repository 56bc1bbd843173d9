"""`VectorSteps`: a usual vector step recorded in one C call (`_vector_step.c`).

A vector env's step touches every sub-env's bookkeeping: its row in each
field's ring column, the discount from `terminated`, which episodes end (and
their plan for the writer thread), which begin (next-step autoreset's reset
sub-envs). `BatchRecorder`'s `add`, `end` and `begin` do it in a dozen numpy
calls; `VectorSteps.step` does it in one C call when the step is the usual
one: numpy batches of the fields' shapes (and dtypes, or ones numpy casts by
`same_kind`), bool `terminated`/`truncated`, sub-envs stepped together, no
frames encoded as they come and no per-sub-env Python values. For anything
else it returns None having changed nothing, and the caller takes the
general path, which records the same bytes or refuses the value by name.

Without the extension (not built, `RLDS_WRITER_PURE_PYTHON`) `make` returns
None: every step takes the general path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer import _native
from rlds_writer.record.batch.fields import pick
from rlds_writer.record.episode import ACTION, DISCOUNT, OBSERVATION, REWARD

if TYPE_CHECKING:
    from rlds_writer.record.batch.core import BatchRecorder

# None where not built, or built from other sources (`_native.load` warns once):
# the general path.
native = _native.load("rlds_writer.record.batch._vector_step")

GIVEN = "given"  # `make`'s discount: a batch of its own at each step
_METADATA = "metadata"  # core.METADATA (core imports this module's users, not this module)


def make(
    core: BatchRecorder, pending: np.ndarray | None, discount: bool | str
) -> VectorSteps | None:
    """The C step of `core`'s usual vector steps, or None where it does not apply.

    Args:
      core: the batch recorder.
      pending: next-step autoreset's sub-envs reset by the next step (bool
        [N], updated in place: the C step begins them and sets the ended ones),
        or None (the other modes).
      discount: True: the caller records a discount of `1 - terminated`;
        `GIVEN`: it gives the discount batch (`step(..., discount=)`).
    """
    if native is None or not core._plan_ends or core._frames is not None:
        return None
    if core._object_keys or core._per_env:
        return None
    ring = core._ring
    sources = {}
    for group, leaves in core._groups.items():
        for path, field in leaves:
            sources[field.key] = (group, path)
    discount_index = -1
    keys = [f.key for f in ring.fields]
    if DISCOUNT in core._groups and discount != GIVEN:
        leaves = core._groups[DISCOUNT]
        key = leaves[0][1].key
        if not discount or len(leaves) != 1 or leaves[0][0]:
            return None  # refused or nested: the general path says so
        if ring.ring[key].dtype not in (np.float32, np.float64):
            return None
        discount_index = keys.index(key)
    if set(keys) != set(sources):
        return None
    apart = np.empty((2, core.num_envs), np.int64)
    kernel = native.VectorStep(
        tuple(ring.ring[k] for k in keys),
        tuple(ring.heads.get(k) for k in keys),
        discount_index,
        ring.open,
        ring.start,
        pending,
        ring.spilled_mask,
        ring._plan,
        apart,
    )
    # Per column: (group, path in it, key), None for the discount (the C step writes it).
    columns = [None if i == discount_index else (*sources[k], k) for i, k in enumerate(keys)]
    return VectorSteps(core, kernel, columns, apart)


class VectorSteps:
    """A batch recorder's vector steps in one C call each (see `make`)."""

    def __init__(self, core: BatchRecorder, kernel: Any, sources: list[Any], apart: np.ndarray):
        self._core = core
        self._ring = core._ring
        self._kernel = kernel
        self._apart = apart
        self._sources = sources
        # The common layouts, read without `pick`: each field a whole group.
        self._plain = all(s is None or not s[1] for s in sources)

    def step(
        self,
        action: Any,
        reward: Any,
        observation: Any,
        metadata: Any,
        terminated: Any,
        truncated: Any,
        discount: Any = None,
    ) -> tuple[Any, ...] | None:
        """Writes the step's rows, begins and ends episodes; None: take the general path.

        Returns what `ended` and `finish` take: the ended sub-envs have their
        rows written and are no longer open; their episodes go to the writer
        at `finish` (same-step autoreset replaces their final rows in between).
        """
        if self._core._closed:
            return None
        by_group = {
            OBSERVATION: observation,
            ACTION: action,
            REWARD: reward,
            DISCOUNT: discount,
            _METADATA: metadata,
        }
        if self._plain:
            values = tuple(None if s is None else by_group[s[0]] for s in self._sources)
        else:
            picked = []
            for source in self._sources:
                if source is None:
                    picked.append(None)
                    continue
                group, path, key = source
                value = by_group[group]
                if value is None:
                    return None  # the general path refuses it by name
                picked.append(pick(value, path, key) if path else value)
            values = tuple(picked)
        ring = self._ring
        t = ring.t
        if t % ring.chunk == 0 and t >= ring.size - ring.chunk:
            ring._spill_before_overwrite(t)  # as `TimeRing.write` does (twice is harmless)
        ends = self._kernel.step(values, terminated, truncated, t % ring.size, t + 1)
        if ends is not None:
            ring.t = t + 1
        return ends

    def ended(self, ends: tuple[Any, ...]) -> np.ndarray | None:
        """The sub-envs whose episode `ends` ended, as a bool mask (None: none)."""
        _, _, napart, plan = ends
        if plan is None and not napart:
            return None
        mask = np.zeros(self._core.num_envs, np.bool_)
        if plan is not None:
            mask[plan[0]] = True
        mask[self._apart[0, :napart]] = True
        return mask

    def finish(self, ends: tuple[Any, ...]) -> None:
        """Hands the episodes `step` ended to the writer, as `BatchRecorder.end` would."""
        _, oldest, napart, plan = ends
        core, ring = self._core, self._ring
        if plan is not None:
            envs, starts, rows_per, offsets, steps, reasons, firsts = plan
            core._defer((envs, starts, rows_per, firsts), offsets, steps, reasons, oldest)
        if napart:
            envs, codes = self._apart[:, :napart].tolist()
            core._write_apart([ring._gather_spilled(i) for i in envs], dict(zip(envs, codes)))
