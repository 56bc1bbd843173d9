"""The mid-episode step of `EnvLogger` and `RecordRLDS` in C, where built.

The generated Python step (`record.appender`, compiled into `EnvLogger.step`
by `record.dm_env.env_logger`) spends most of what recording adds to a cheap env's step
in the interpreter: attribute reads, type tests, the `tobytes` call. The
`StepKernel` of `_step_kernel.c` does the same tests and appends in C for the
layouts every column of which says how (`kernel_leaf`: a scalar or a small
fixed-shape array, no step metadata); whatever it does not take as it is
goes to the Python step, which casts, refuses or records as always. The
columns receive the same values either way, so the datasets are identical.

The extension is optional: a build without a C compiler, or
`RLDS_WRITER_PURE_PYTHON=1` (at build time: no extension is built; at run
time: none is used), records with the Python step.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from rlds_writer import _native

# Set to anything but "" or "0": no C step is built (setup.py) or used (here).
PURE_PYTHON_ENV = "RLDS_WRITER_PURE_PYTHON"

_KINDS = {
    "int": "LEAF_INT",
    "scalar": "LEAF_SCALAR",
    "array": "LEAF_ARRAY",
    "none": "LEAF_NONE",
    "float": "LEAF_FLOAT",
    "int64": "LEAF_INT64",
}
# The leaf of a step argument the dataset has no field for: not looked at.
NO_FIELD = ("none", None, None, False, None, (), 0)


def disabled() -> bool:
    """Whether `RLDS_WRITER_PURE_PYTHON` asks for the Python step."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


@functools.cache
def _module() -> Any:
    # None where not built (no compiler), built against another numpy, or built
    # from other sources (`_native.load` warns once): the Python step records.
    return _native.load("rlds_writer.record._step_kernel")


def extension() -> Any:
    """The C module (`_step_kernel`), or None where it is not built or not used."""
    return _module() if available() else None


def available() -> bool:
    """Whether the C step is built and not disabled."""
    return not disabled() and _module() is not None


def row_buffer_type() -> Any:
    """`RowBuffer` (fixed-size rows end to end in one buffer) with the C step, else None."""
    return _module().RowBuffer if available() else None


def step_kernel(
    env_step: Callable[[Any], Any],
    result: tuple[type, int],
    checks: tuple[tuple[int, Any], ...],
    sources: tuple[Any, Any, Any],
    after: Callable[[Any, Any], Any],
    buffer: Any,
    leaves: tuple | None,
) -> Callable[[Any], Any] | None:
    """The C `step(action)` for one episode buffer, or None where it cannot run.

    Args:
      env_step: the env's `step`.
      result: the exact type and the size of what `env_step` returns in the
        common case (`dm_env.TimeStep`, 4; `tuple`, 5).
      checks: `(index, object)`: the episode goes on only if the result's item
        at `index` is that very object (`StepType.MID`; `False` for
        terminated and truncated).
      sources: where the reward, discount and observation are in the result:
        an index, or `(constant,)` for a value the step stores as it is.
      after: `after(action, result)`, the Python step without the env call,
        for every step the kernel does not take.
      buffer: the `EpisodeBuffer` (its `num_steps` slot, `_rollback`).
      leaves: the columns' `kernel_leaf()` for the action, reward, discount
        and observation (`NO_FIELD` where the dataset has none), or None if
        one of them has no C form.
    """
    if leaves is None or disabled():
        return None
    module = _module()
    if module is None:
        return None
    specs = tuple((getattr(module, _KINDS[kind]), *rest) for kind, *rest in leaves)
    result_type, size = result
    return module.StepKernel(env_step, result_type, size, checks, sources, after, buffer, specs)


# Loaded with this module, not by the first recording (0.1-0.2 ms of it).
_module()
