"""`StepInputs`: a vector step's arguments read and checked against the fields.

`BatchRecorder` takes every value as a whole batch (numpy, torch, JAX or
anything `record.batch.arrays` takes); this turns the sub-env ids, the masks
and each field's batch into host numpy arrays of the expected rows, refusing a
bad one by its field's name. A numpy batch seen before with the same type,
shape and dtype skips the checks (one dict lookup per field per step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record.batch import objects
from rlds_writer.record.batch.arrays import check_batch, host_array
from rlds_writer.record.batch.fields import pick
from rlds_writer.record.batch.ring import BatchField
from rlds_writer.record.episode import DISCOUNT


class StepInputs:
    """Reads a vector step's arguments for the recorder's fields.

    Args:
      groups: step group (observation, action, ...) -> `(path, field)` of its leaves.
      object_keys: the fields kept as one Python value per sub-env (`objects.py`).
      num_envs: the batch's sub-envs.
    """

    def __init__(
        self,
        groups: dict[str, list[tuple[Any, BatchField]]],
        object_keys: list[str],
        num_envs: int,
    ):
        self._groups = groups
        self._object_keys = object_keys
        self._num_envs = num_envs
        # (field key, rows) -> the type, shape and dtype of a numpy batch that passed.
        self._checked: dict[tuple[str, int], tuple[type, tuple, np.dtype]] = {}

    def ids(self, env_ids: Any) -> np.ndarray | None:
        """The sub-env of each row as int64, or None (row `i` is sub-env `i`)."""
        if env_ids is None:
            return None
        ids = host_array(env_ids, "env_ids").astype(np.int64, copy=False).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self._num_envs):
            raise StepValueError(
                "env_ids", f"expected sub-envs in [0, {self._num_envs}), got {ids}"
            )
        return ids

    def mask(self, mask: Any, rows: int) -> np.ndarray:
        """A bool array over `rows`; None is every row."""
        if mask is None:
            return np.ones(rows, np.bool_)
        arr = host_array(mask, "mask")
        if arr.dtype != np.bool_ or arr.shape != (rows,):
            raise StepValueError(
                "mask", f"expected bool[{self._num_envs}], got {arr.dtype}{arr.shape}"
            )
        return arr

    def values(self, role: str | None, n: int, **groups: Any) -> dict[str, np.ndarray]:
        """Every field's batch of `n` rows, checked; `role` limits it to those fields."""
        out: dict[str, np.ndarray] = {}
        checked = self._checked
        for group, leaves in self._groups.items():
            value = groups.get(group)
            if value is None:
                first = leaves[0][1]
                if role is not None and first.role != role:
                    continue
                if group == DISCOUNT:
                    raise StepValueError(first.key, "the dataset has a discount column: pass it")
                raise StepValueError(first.key, "expected a batch, got None")
            for path, field in leaves:
                if role is not None and field.role != role:
                    continue
                leaf = pick(value, path, field.key) if path else value
                seen = checked.get((field.key, n))
                if (
                    seen is not None
                    and type(leaf) is seen[0]
                    and leaf.shape == seen[1]
                    and leaf.dtype == seen[2]
                ):
                    out[field.key] = leaf
                    continue
                if field.key in self._object_keys:  # never in `checked`
                    out[field.key] = objects.value_batch(field.spec, leaf, n)
                    continue
                arr = check_batch(field.spec, host_array(leaf, field.key), n)
                if type(leaf) is np.ndarray and arr is leaf:
                    checked[field.key, n] = (np.ndarray, leaf.shape, leaf.dtype)
                out[field.key] = arr
        return out
