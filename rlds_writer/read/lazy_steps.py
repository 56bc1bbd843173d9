"""`LazySteps`: a step field whose values are decoded one step at a time, when indexed.

`Decoder.decode(..., lazy=...)` gives one for a field that would cost too much
decoded whole (the frames `show` draws a step at a time); a value that does
not decode raises `DecodeError` naming the step and the field.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np

from rlds_writer.errors import DecodeError
from rlds_writer.store.features import wire
from rlds_writer.store.features.features import Leaf


class LazySteps(Sequence):
    """A step field's values, each decoded when it is indexed (and not kept).

    Attributes:
      leaf: the field.
    """

    def __init__(self, leaf: Leaf, length: int, get: Callable[[int], np.ndarray], where: str):
        self.leaf = leaf
        self._length = length
        self._get = get
        self._where = where

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        if not -self._length <= i < self._length:
            raise IndexError(f"step {i} out of range for {self._length} steps")
        try:
            return self._get(i % self._length)
        except (wire.WireError, zlib.error, ValueError, IndexError, OverflowError) as e:
            if isinstance(e, DecodeError):  # it names the field already
                raise DecodeError(f"{self._where}: step {i}: {e}") from e
            raise DecodeError(f"{self._where}: step {i}: {self.leaf.key}: {e}") from e
