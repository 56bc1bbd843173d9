"""Byte mutations for the fuzz tests of the read path and the importers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st


def mutate(draw: Callable[[Any], Any], data: bytes, sizes: Sequence[bytes], width: int) -> bytes:
    """`data` with 1-6 random bit flips, byte overwrites, cuts, insertions, deletions,
    or a size field: `width` bytes at a random place replaced by one of `sizes`."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "byte", "cut", "insert", "delete", "size"]))
        if not buf:
            buf += draw(st.binary(max_size=8))
            continue
        pos = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            buf[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del buf[pos:]
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 16))]
        else:
            buf[pos : pos + width] = draw(st.sampled_from(list(sizes)))
    return bytes(buf)
