"""Gymnasium spaces from their text (`str(space)`), parsed as data.

The Gymnasium recorders store `str(observation_space)` and
`str(action_space)` in `metadata.json` (e.g. `Dict('camera': Box(0, 255,
(64, 64, 3), uint8), 'mode': Discrete(3))`), and a dataset converted from
Minari or RLlib stores its spaces the same way. The exporters rebuild the
spaces from that text, so a dataset recorded from an env nobody registered in
the exporting process still gets its `Discrete` sizes and `Box` bounds.

The text is a small grammar read by a tokenizer and a recursive-descent
parser: nothing is evaluated, imported or looked up by name, and only
`Box`, `Discrete`, `MultiDiscrete`, `MultiBinary`, `Dict` and `Tuple` are
built. Bounds printed by numpy keep its print precision (8 significant digits
for float64 arrays); arrays numpy abbreviated with `...` are refused.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError

MAX_TEXT = 1 << 20
MAX_DEPTH = 32
# A Box allocates its bounds: a space text may not make it allocate more.
MAX_ELEMENTS = 1 << 26

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)(?![\w.]))
    | (?P<name>[A-Za-z_]\w*)
    | (?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
    | (?P<ellipsis>\.\.\.)
    | (?P<punct>[()\[\],:=])
    )""",
    re.X,
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise SpecError(f"unexpected text at character {pos}: {text[pos : pos + 20]!r}")
        kind = match.lastgroup or ""
        out.append((kind, match[kind]))
        pos = match.end()
    return out


class _Parser:
    def __init__(self, text: str, max_elements: int):
        self.tokens = _tokens(text)
        self.pos = 0
        self.max_elements = max_elements

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "")

    def take(self, kind: str, value: str | None = None) -> str:
        got_kind, got = self.peek()
        if got_kind != kind or (value is not None and got != value):
            want = value or kind
            raise SpecError(f"expected {want!r} at token {self.pos}, got {got or 'the end'!r}")
        self.pos += 1
        return got

    def accept(self, value: str) -> bool:
        if self.peek() == ("punct", value):
            self.pos += 1
            return True
        return False

    def space(self, depth: int) -> Any:
        from gymnasium import spaces

        if depth > MAX_DEPTH:
            raise SpecError(f"spaces nested deeper than {MAX_DEPTH}")
        name = self.take("name")
        self.take("punct", "(")
        if name == "Dict":
            items = {}
            while not self.accept(")"):
                if items:
                    self.take("punct", ",")
                key = ast.literal_eval(self.take("string"))
                self.take("punct", ":")
                items[key] = self.space(depth + 1)
            return spaces.Dict(items)
        if name == "Tuple":
            elements = []
            while not self.accept(")"):
                if elements:
                    self.take("punct", ",")
                elements.append(self.space(depth + 1))
            return spaces.Tuple(elements)
        args, kwargs = self.arguments(depth)
        return _build(name, args, kwargs, self.max_elements)

    def arguments(self, depth: int) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        while not self.accept(")"):
            if args or kwargs:
                self.take("punct", ",")
            kind, value = self.peek()
            if kind == "name" and self.tokens[self.pos + 1 : self.pos + 2] == [("punct", "=")]:
                self.pos += 2
                kwargs[value] = self.value(depth + 1)
            else:
                args.append(self.value(depth + 1))
        return args, kwargs

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise SpecError(f"values nested deeper than {MAX_DEPTH}")
        kind, token = self.peek()
        if kind == "number":
            self.pos += 1
            return float(token) if re.search(r"[.eEn]", token) else int(token)
        if kind == "name" and token in ("True", "False"):
            self.pos += 1
            return token == "True"
        if kind == "name":  # a dtype such as float32
            self.pos += 1
            return _Name(token)
        if kind == "ellipsis":
            raise SpecError("an array numpy abbreviated with '...' (its values are not there)")
        if self.accept("["):
            items = []
            while not self.accept("]"):
                self.accept(",")
                if self.peek() == ("punct", "]"):
                    continue
                items.append(self.value(depth + 1))
            return items
        if self.accept("("):
            items = []
            while not self.accept(")"):
                if items:
                    self.take("punct", ",")
                    if self.accept(")"):
                        break
                items.append(self.value(depth + 1))
            return tuple(items)
        raise SpecError(f"unexpected {token or 'end'!r} at token {self.pos}")


class _Name(str):
    """A bare name in the text (a dtype)."""


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, _Name):
        raise SpecError(f"expected a dtype name, got {value!r}")
    try:
        dtype = np.dtype(str(value))
    except TypeError:
        raise SpecError(f"unknown dtype {value!r}") from None
    if dtype.kind not in "biuf":
        raise SpecError(f"dtype {dtype} is not a numeric dtype")
    return dtype


def _shape(value: Any, max_elements: int) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise SpecError(f"expected a shape (a tuple of sizes), got {value!r}")
    if int(np.prod(value, dtype=object)) > max_elements:
        raise SpecError(f"shape {value} has more than {max_elements} values")
    return value


def _array(value: Any, dtype: Any = None) -> np.ndarray:
    if isinstance(value, _Name) or isinstance(value, tuple):
        raise SpecError(f"expected a number or an array, got {value!r}")
    try:
        array = np.array(value, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise SpecError(f"not an array of numbers: {e}") from None
    if array.dtype.kind not in "biuf":
        raise SpecError(f"not an array of numbers: {value!r}")
    return array


def _build(name: str, args: list[Any], kwargs: dict[str, Any], max_elements: int) -> Any:
    from gymnasium import spaces

    try:
        if name == "Box" and len(args) == 4 and not kwargs:
            shape = _shape(args[2], max_elements)
            dtype = _dtype(args[3])
            low, high = _array(args[0]), _array(args[1])
            for bound in (low, high):
                if bound.ndim and bound.shape != shape:
                    raise SpecError(f"bounds of shape {bound.shape} for shape {shape}")
            if dtype.kind == "b":
                return spaces.Box(0, 1, shape, dtype)
            if dtype.kind == "f":  # cast here: Gymnasium warns when it lowers precision
                low, high = (np.broadcast_to(b, shape).astype(dtype) for b in (low, high))
            low, high = (b.item() if b.ndim == 0 else b for b in (low, high))
            return spaces.Box(low, high, shape, dtype)
        if name == "Discrete" and len(args) == 1 and set(kwargs) <= {"start"}:
            n, start = args[0], kwargs.get("start", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n, start)):
                raise SpecError(f"Discrete needs integers, got {args} {kwargs}")
            return spaces.Discrete(n, start=start)
        if name == "MultiDiscrete" and len(args) == 1 and set(kwargs) <= {"start"}:
            nvec = _array(args[0], np.int64)
            if nvec.size > max_elements:
                raise SpecError(f"more than {max_elements} values")
            start = _array(kwargs["start"], np.int64) if "start" in kwargs else None
            return spaces.MultiDiscrete(nvec, start=start)
        if name == "MultiBinary" and len(args) == 1 and not kwargs:
            shape = _shape(args[0], max_elements)
            return spaces.MultiBinary(shape[0] if len(shape) == 1 else list(shape))
    except SpecError:
        raise
    except (ValueError, TypeError, AssertionError, OverflowError) as e:
        raise SpecError(f"{name}: {e}") from None
    raise SpecError(
        f"{name}({', '.join(map(str, args))}) is not a supported space (supported: Box, "
        "Discrete, MultiDiscrete, MultiBinary, Dict, Tuple)"
    )


def parse_space(text: str, max_elements: int = MAX_ELEMENTS) -> Any:
    """Builds the Gymnasium space `str(space)` printed, without evaluating anything.

    Args:
      text: e.g. `"Box(-1.0, 1.0, (3,), float32)"` or `"Discrete(4)"`.
      max_elements: the largest number of values a `Box` may have.

    Returns:
      The `gymnasium.spaces.Space`.

    Raises:
      SpecError: if the text is not such a space (the message says where).
    """
    if not isinstance(text, str):
        raise SpecError(f"expected the text of a space, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise SpecError(f"{len(text)} characters; a space text has at most {MAX_TEXT}")
    parser = _Parser(text, max_elements)
    space = parser.space(0)
    if parser.peek()[0] != "end":
        raise SpecError(f"unexpected {parser.peek()[1]!r} after the space")
    return space
