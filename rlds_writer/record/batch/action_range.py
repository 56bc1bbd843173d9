"""`ActionRange`: a batch of discrete actions held against the space's range.

A `Discrete(n, start)` action is stored as a plain int (a scalar `Tensor`),
so 5 for `Discrete(2)` would be written as it is and read back as a valid-looking
action no env took; many envs (EnvPool's, custom ones) do not refuse it either.
The batched recorders check each batch before the env or the dataset sees it:
one vectorised min/max per batch, nothing per sub-env. `Box` actions are not
checked (policies' unclipped actions are common and the env clips them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError

_UNSIGNED = {np.dtype(f"{k}{n}"): np.dtype(f"u{n}") for k in "iu" for n in (1, 2, 4, 8)}
_max = np.maximum.reduce


class ActionRange:
    """The inclusive range of a `Discrete` or `MultiDiscrete` space's actions.

    Args:
      space: the single-env action space (a Gymnasium space).
      low: the smallest action (an int, or an array for `MultiDiscrete`).
      high: the largest.
    """

    def __init__(self, space: Any, low: Any, high: Any):
        self.space = space
        self.low = low
        self.high = high
        self._scalar = np.ndim(low) == 0
        # A range from 0: native ints seen unsigned, where a negative action is huge.
        self._unsigned = _UNSIGNED if self._scalar and low == 0 else {}

    @classmethod
    def of(cls, space: Any) -> ActionRange | None:
        """The range of `space`'s actions, or None for a space that is not discrete."""
        try:
            from gymnasium import spaces
        except ImportError:  # pragma: no cover - every recorder of spaces has gymnasium
            return None
        if isinstance(space, spaces.Discrete):
            start = int(space.start)
            return cls(space, start, start + int(space.n) - 1)
        if isinstance(space, spaces.MultiDiscrete):
            start = np.asarray(space.start, np.int64)
            return cls(space, start, start + np.asarray(space.nvec, np.int64) - 1)
        return None

    def check(self, actions: np.ndarray, path: str = "steps/action") -> None:
        """Raises `StepValueError` naming `path` if an action of the batch is out of range.

        Args:
          actions: a batch (leading axis: sub-envs, or steps and sub-envs) of
            integer actions, already checked for dtype and shape; other kinds
            are left to those checks.
        """
        view = self._unsigned.get(actions.dtype)
        if view is not None:  # the usual case: one reduction, no copy (about 1 us)
            if not actions.size or _max(actions.view(view), axis=None) <= self.high:
                return
        elif actions.dtype.kind not in "iu" or not actions.size:
            return
        if self._scalar:
            if actions.min() >= self.low and actions.max() <= self.high:
                return
            bad = (actions < self.low) | (actions > self.high)
        else:
            bad = (actions < self.low) | (actions > self.high)
            if not bad.any():
                return
        where = np.argwhere(bad)[0]
        value = actions[tuple(where)]
        at = ", ".join(map(str, where.tolist()))
        raise StepValueError(
            path,
            f"expected actions in {self._describe()} ({self.space}), got {value} at [{at}]; "
            "the env's space does not hold it: give actions the space contains (argmax over "
            f"its {self._count()} choices, or space.sample())",
        )

    def _describe(self) -> str:
        if self._scalar:
            return f"{self.low}..{self.high}"
        return f"{self.low.tolist()}..{self.high.tolist()} per component"

    def _count(self) -> str:
        if self._scalar:
            return str(self.high - self.low + 1)
        return str((self.high - self.low + 1).tolist())
