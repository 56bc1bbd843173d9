"""Turning one step's nested values into appends to the episode buffer's columns.

Two forms of the same walk over the step layout (observation, action, reward,
discount, step metadata):

* `build_appender`: closures, one per dict and leaf. It checks everything
  and says what was wrong (`StepValueError` naming the field); it also takes
  the forms a value may arrive in besides the exact one (lists for tuple
  specs, other scalar types).
* `compile_step_add`: one generated function for a whole step. A step runs
  once per env step in the control loop, and a Python call per field costs
  more than the append it makes; so, as `dataclasses` does for `__init__`,
  the layout is compiled into the source of one function that tests every
  value's exact type, dtype, shape and dict keys in one expression and then
  appends them. Any value that fails a test goes to the closures above,
  which record it the same way or refuse it. Only generated names (`_c0`,
  `_c1`, ...) appear in the source; keys and field names are bound as values.
  The function takes its first `COMPILE_AFTER` steps through the closures and
  is compiled then (where the C step takes the mid-episode steps, it is
  called only at an episode's last step).

It pays: `benchmarks/step_paths.py` (the same recording with the checked
closures as the buffer's `add`, interleaved) measures the env thread's CPU per
Catch step (float32 (10, 5) observation) 1.02-1.20x higher without it, and
1.06-1.17x on a step with a dict observation and step metadata, in three runs
(benchmarks/REPORT.md, "Per-step speed tricks").

For a Catch-like layout (int64 action, float32 reward and discount, float32
(10, 5) observation) the generated source reads::

    def add(action, reward, discount, next_observation, step_metadata=None):
        n = _buffer.num_steps
        if (n) and ((_get_ident() == _buffer.owner)
                    and (type(action) is int and -9223372036854775808 <= action
                         <= 9223372036854775807 or type(action) in _c1)
                    and (type(reward) is float or type(reward) in _c3)
                    and (type(discount) is float or type(discount) in _c5)
                    and (type(next_observation) is _ndarray
                         and next_observation.dtype is _c7
                         and next_observation.shape == _c8)) and (step_metadata is None):
            try:
                _c2(action)
                _c4(reward)
                _c6(discount)
                _c9(next_observation.tobytes())
                _buffer.num_steps = n + 1
            except BaseException:
                _buffer._rollback(n)
                _buffer.num_steps = n
                raise
        else:
            _checked(action, reward, discount, next_observation, step_metadata)

(on one line) where `_buffer.owner` is the thread that began the episode
(another thread's step goes to `_checked`, which refuses it), `_c1` is the
other scalar types the action column takes as they are (a Python int, the
common case, is tested first by identity, as a Python float is for the
reward) and `_c2`, `_c4`, ... are the columns' list `append`s. The exact
text is the function's `source` attribute, and `inspect.getsource` and tracebacks show it.
"""

from __future__ import annotations

import _thread
import functools
import itertools
import linecache
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record.step_kernel import NO_FIELD
from rlds_writer.record.values import describe
from rlds_writer.store.features import field_specs


def build_appender(
    node: Any, path: str, leaf_fn: Callable[[field_specs.FieldSpec], Callable[[Any], None]]
) -> Callable[[Any], None]:
    """Builds a function that checks a nested value and appends its leaves.

    Args:
      node: a field (leaf) or a dict of nodes.
      path: the node's path, for errors.
      leaf_fn: makes the appender of one leaf field.
    """
    if not isinstance(node, dict):
        return leaf_fn(node)
    children = {name: build_appender(sub, f"{path}/{name}", leaf_fn) for name, sub in node.items()}
    expected = frozenset(children)
    # config_from_env turns list/tuple specs into dicts keyed "0".."n-1"; the
    # env still hands out lists/tuples for them.
    index_keys = [str(i) for i in range(len(children))]
    by_index = bool(children) and sorted(expected) == sorted(index_keys)

    def append(value: Any) -> None:
        if by_index and isinstance(value, list | tuple) and len(value) == len(index_keys):
            value = dict(zip(index_keys, value))
        if not isinstance(value, Mapping):
            raise StepValueError(
                path, f"expected a dict with keys {sorted(expected)}, got {describe(value)}"
            )
        if value.keys() != expected:
            got = set(value.keys())
            missing = sorted(expected - got)
            unexpected = sorted(map(str, got - expected))
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if unexpected:
                parts.append(f"unexpected keys {unexpected}")
            raise StepValueError(path, f"expected keys {sorted(expected)}: " + ", ".join(parts))
        for name, child in children.items():
            child(value[name])

    return append


class _Source:
    """The parts of the generated function: its tests, its appends and the names they use."""

    def __init__(self) -> None:
        self.names: dict[str, Any] = {"_ndarray": np.ndarray, "_get_ident": _thread.get_ident}
        self.tests: list[str] = []
        self.appends: list[str] = []

    def bind(self, value: Any) -> str:
        name = f"_c{len(self.names)}"
        self.names[name] = value
        return name

    def walk(self, node: Any, expr: str, columns: Mapping[str, Any]) -> None:
        if isinstance(node, dict):
            keys = self.bind(frozenset(node))
            self.tests.append(f"type({expr}) is dict and {expr}.keys() == {keys}")
            for name, sub in node.items():
                self.walk(sub, f"{expr}[{self.bind(name)}]", columns)
            return
        column = columns[node.key]
        names = {key: self.bind(value) for key, value in column.inline_names().items()}
        test, append = column.inline_source()
        if test:
            self.tests.append(test.format(v=expr, **names))
        self.appends.append(append.format(v=expr, **names))


# The test that the step comes from the thread that began the episode.
OWNER_TEST = "_get_ident() == _buffer.owner"


class StepBody:
    """The parts of a compiled step: its test, its appends and the names they use.

    `test` is one expression over the arguments `action`, `reward`,
    `discount`, `next_observation` (and `step_metadata` if `takes_metadata`)
    that holds when every value can be appended as it is; `appends` are the
    statements that append them. A caller that steps an env can compile them
    into its own per-step function (`EnvLogger` does), one call less per step.
    """

    __slots__ = ("test", "appends", "names", "takes_metadata", "kernel_leaves")

    def __init__(
        self,
        test: str,
        appends: list[str],
        names: dict[str, Any],
        takes_metadata: bool,
        kernel_leaves: tuple | None = None,
    ):
        self.test = test
        self.appends = appends
        self.names = names
        self.takes_metadata = takes_metadata
        # The same step for the C kernel (`record.step_kernel`), where every leaf has one.
        self.kernel_leaves = kernel_leaves

    def guarded_appends(self, indent: str) -> str:
        """The appends as source lines at `indent`: all or none (a failed one rolls back)."""
        inner = indent + "    "
        appends = "".join(f"{inner}{a}\n" for a in self.appends) or f"{inner}pass\n"
        # The count too inside the `try`: a Ctrl-C between the last append and
        # the count would leave a column one value longer than the steps.
        return (
            f"{indent}try:\n{appends}"
            f"{inner}_buffer.num_steps = n + 1\n"
            f"{indent}except BaseException:\n"
            f"{inner}_buffer._rollback(n)\n"
            f"{inner}_buffer.num_steps = n\n"
            f"{inner}raise\n"
        )


def step_body(groups: Mapping[str, Any], columns: Mapping[str, Any]) -> StepBody:
    """The test and appends of one step (see `compile_step_add` for the arguments)."""
    source = _Source()
    for argument, node in groups.items():
        source.walk(node, argument, columns)
    test = " and ".join(f"({t})" for t in source.tests) or "True"
    return StepBody(
        test,
        source.appends,
        source.names,
        "step_metadata" in groups,
        _kernel_leaves(groups, columns),
    )


_KERNEL_ARGUMENTS = ("action", "reward", "discount", "next_observation")


def _kernel_leaves(groups: Mapping[str, Any], columns: Mapping[str, Any]) -> tuple | None:
    """The columns' C forms of the step, if it is at most one leaf per argument, no metadata."""
    if not set(groups) <= set(_KERNEL_ARGUMENTS):
        return None
    leaves = []
    for argument in _KERNEL_ARGUMENTS:
        node = groups.get(argument)
        if node is None:  # the dataset has no such field (a Gymnasium one without discount)
            leaves.append(NO_FIELD)
            continue
        if isinstance(node, dict):
            return None
        leaf = columns[node.key].kernel_leaf()
        if leaf is None:
            return None
        leaves.append(leaf)
    return tuple(leaves)


def compile_source(text: str, names: Mapping[str, Any], function: str) -> Callable[..., Any]:
    """Compiles generated source and returns its function `function`.

    The source gets a file name of its own, with the text in linecache (as
    attrs does): a traceback, pdb and `inspect.getsource` show the generated
    lines. The function's `source` attribute is the text. A text compiled
    before in the process (the same layout, another buffer or recording) is
    not compiled again: only its names differ.
    """
    namespace = dict(names)
    exec(_compiled_code(text, function), namespace)  # noqa: S102
    fn = namespace[function]
    fn.source = text
    return fn


@functools.lru_cache(maxsize=64)
def _compiled_code(text: str, function: str) -> Any:
    filename = f"<rlds_writer step {function} {next(_compiled)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    return compile(text, filename, "exec")


def compile_step_add(
    groups: Mapping[str, Any],
    columns: Mapping[str, Any],
    buffer: Any,
    checked_add: Callable[..., None],
) -> Callable[..., None]:
    """The step layout's per-step `add` for the buffer, compiled once it is in use.

    The function is `add(action, reward, discount, next_observation,
    step_metadata=None)`, as `EpisodeBuffer.add`. Its first `COMPILE_AFTER`
    calls go through `checked_add`; then the generated source is compiled
    and becomes the function's code (the same function object, so whatever
    holds it gets the compiled step). With `COMPILE_AFTER = 0` it is
    compiled at once. Its `step_body` attribute is the
    `StepBody` it is made of, `source` the generated text.

    Args:
      groups: argument name (`action`, `reward`, `discount`,
        `next_observation`, `step_metadata`) -> its node (a field or a dict
        of nodes); a group the dataset lacks is left out.
      columns: field key -> column (with `inline_names` and `inline_source`).
      buffer: the episode buffer (`num_steps`, `_rollback`).
      checked_add: the closure form, for any step whose values fail a test.

    Returns:
      The function.
    """
    body = step_body(groups, columns)
    # The episode's own thread only: another's step goes to the checked form,
    # which refuses it (`EpisodeBuffer.owner`).
    tests = ["n", OWNER_TEST, body.test]
    if not body.takes_metadata:
        tests.append("step_metadata is None")
    text = (
        "def add(action, reward, discount, next_observation, step_metadata=None):\n"
        "    n = _buffer.num_steps\n"
        f"    if {' and '.join(f'({t})' for t in tests)}:\n"
        f"{body.guarded_appends('        ')}"
        "    else:\n"
        "        _checked(action, reward, discount, next_observation, step_metadata)\n"
    )
    namespace = dict(body.names, _buffer=buffer, _checked=checked_add)
    exec(_WARMING_UP, namespace)  # noqa: S102
    add = namespace["add"]
    calls = 0

    def compile_now() -> None:
        exec(_compiled_code(text, "add"), namespace)  # noqa: S102
        add.__code__ = namespace["add"].__code__  # same globals: `namespace`
        namespace["add"] = add

    def warm_up(
        action: Any,
        reward: Any,
        discount: Any,
        next_observation: Any,
        step_metadata: Any = None,
    ) -> None:
        nonlocal calls
        calls += 1
        if calls >= COMPILE_AFTER:
            compile_now()
        checked_add(action, reward, discount, next_observation, step_metadata)

    namespace["_warm_up"] = warm_up
    if COMPILE_AFTER <= 0:
        compile_now()
    add.__doc__ = "Records one transition: `a_t, r_t, d_t` and the observation `o_{t+1}`."
    add.source = text
    add.step_body = body
    add.buffer = buffer
    return add


# Where the C step takes the mid-episode steps, `add` sees one step an episode
# (the last), so a recording of fewer episodes than this pays no compile
# (0.25-0.35 ms); a Python step loop compiles it after its first steps.
COMPILE_AFTER = 32
_WARMING_UP_FILE = "<rlds_writer step add, not compiled yet>"
_WARMING_UP_TEXT = (
    "def add(action, reward, discount, next_observation, step_metadata=None):\n"
    "    _warm_up(action, reward, discount, next_observation, step_metadata)\n"
)
linecache.cache[_WARMING_UP_FILE] = (
    len(_WARMING_UP_TEXT),
    None,
    _WARMING_UP_TEXT.splitlines(True),
    _WARMING_UP_FILE,
)
_WARMING_UP = compile(_WARMING_UP_TEXT, _WARMING_UP_FILE, "exec")
_compiled = itertools.count()
