"""Whole episodes from arrays or step dicts, turned into the recorder's per-step calls.

`TFDSBackendWriter.write_episode` takes an episode a user already has (from
numpy arrays, a log, another format) and feeds it through the same
`begin`/`add`/`end` calls recording uses, so validation, casting, RLDS
alignment and durability are exactly those of recording.

Two input forms:

* columns: a dict with `observation` (n rows, the last being the final
  observation), `action` and `reward` (and `discount`, if the dataset has
  one) with n - 1 rows (one per transition; n rows as RLDS stores them are
  accepted only if the last row is all zeros, which is what RLDS puts
  there), and step-metadata keys with n rows (row t belongs to the step of
  observation t). Nested dicts of columns are allowed anywhere.
* a list of n step dicts, RLDS-style: step t holds `observation` o_t and the
  `action`, `reward`, `discount` that followed it; the last step's
  transition keys may be missing or None. Other keys are step metadata.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError

_TRANSITION = ("action", "reward", "discount")
_RESERVED = ("observation", *_TRANSITION, "is_first", "is_last", "is_terminal")

# (action, reward, discount, next_observation, step_metadata) of one transition.
Transition = tuple[Any, Any, Any, Any, Mapping[str, Any] | None]


def _rows(nest: Any, path: str) -> int:
    if isinstance(nest, Mapping):
        counts = {_rows(v, f"{path}/{k}") for k, v in nest.items()}
        if len(counts) > 1:
            raise StepValueError(path, f"its columns have different row counts {sorted(counts)}")
        return counts.pop() if counts else 0
    # A list may mix arrays and encoded images: np.ndim cannot take it, nor needs to.
    is_column = isinstance(nest, Sequence) or np.ndim(nest) > 0
    if isinstance(nest, str | bytes) or not is_column:
        raise StepValueError(
            path, f"expected a column (one row per step), got {type(nest).__name__}"
        )
    return len(nest)


def _row(nest: Any, t: int) -> Any:
    if isinstance(nest, Mapping):
        return {k: _row(v, t) for k, v in nest.items()}
    return nest[t]


def _is_zero(nest: Any) -> bool:
    if isinstance(nest, Mapping):
        return all(_is_zero(v) for v in nest.values())
    value = np.asarray(nest)
    if value.dtype.kind in "OSU":
        return all(not v for v in value.reshape(-1))
    return not value.any()


def _from_columns(steps: Mapping[str, Any]) -> tuple[Any, Iterator[Transition]]:
    if "observation" not in steps:
        raise StepValueError("steps/observation", "an episode needs an observation column")
    n = _rows(steps["observation"], "steps/observation")
    if n == 0:
        raise StepValueError("steps/observation", "an episode needs at least one observation")
    transition = {}
    for key in _TRANSITION:
        if key not in steps or steps[key] is None:
            continue
        rows = _rows(steps[key], f"steps/{key}")
        if rows == n:
            if not _is_zero(_row(steps[key], n - 1)):
                raise StepValueError(
                    f"steps/{key}",
                    f"has {n} rows and its last is not zeros: give {n - 1} rows (one per "
                    "transition) or RLDS's layout with zeros on the final step",
                )
        elif rows != n - 1:
            raise StepValueError(
                f"steps/{key}", f"expected {n - 1} rows (one per transition), got {rows}"
            )
        transition[key] = steps[key]
    metadata = {k: v for k, v in steps.items() if k not in _RESERVED}
    for key, value in metadata.items():
        rows = _rows(value, f"steps/{key}")
        if rows != n:
            raise StepValueError(f"steps/{key}", f"expected {n} rows (one per step), got {rows}")

    def meta(t: int) -> dict[str, Any] | None:
        return {k: _row(v, t) for k, v in metadata.items()} or None

    def transitions() -> Iterator[Transition]:
        for t in range(n - 1):
            yield (
                _row(transition["action"], t) if "action" in transition else None,
                _row(transition["reward"], t) if "reward" in transition else None,
                _row(transition["discount"], t) if "discount" in transition else None,
                _row(steps["observation"], t + 1),
                meta(t + 1),
            )

    return (_row(steps["observation"], 0), meta(0)), transitions()


def _from_step_dicts(steps: Sequence[Mapping[str, Any]]) -> tuple[Any, Iterator[Transition]]:
    n = len(steps)
    if n == 0:
        raise StepValueError("steps", "an episode needs at least one step")
    for t, step in enumerate(steps):
        if not isinstance(step, Mapping) or "observation" not in step:
            raise StepValueError(f"steps[{t}]", "expected a dict with an 'observation'")

    def meta(t: int) -> dict[str, Any] | None:
        return {k: v for k, v in steps[t].items() if k not in _RESERVED} or None

    def transitions() -> Iterator[Transition]:
        for t in range(n - 1):
            step = steps[t]
            yield (
                step.get("action"),
                step.get("reward"),
                step.get("discount"),
                steps[t + 1]["observation"],
                meta(t + 1),
            )

    return (steps[0]["observation"], meta(0)), transitions()


def episode_calls(steps: Any) -> tuple[Any, Iterator[Transition]]:
    """Turns a whole episode into the recorder's calls.

    Args:
      steps: a dict of columns or a list of step dicts (see the module doc).

    Returns:
      `((first_observation, first_step_metadata), transitions)`, where
      `transitions` yields `(action, reward, discount, next_observation,
      step_metadata)` for `add`.

    Raises:
      StepValueError: naming the column whose row count or form is wrong.
    """
    if isinstance(steps, Mapping):
        return _from_columns(steps)
    if isinstance(steps, Sequence) and not isinstance(steps, str | bytes):
        return _from_step_dicts(steps)
    raise StepValueError(
        "steps", f"expected a dict of columns or a list of step dicts, got {type(steps).__name__}"
    )
