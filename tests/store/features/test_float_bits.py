"""The C scan for signalling NaNs (`_float_bits.c`) gives the bytes numpy's way gives.

Every float32 column of every episode passes through `quiet_nans` as it is
encoded (TFDS's serializer quiets a signalling NaN); the C scan replaced
numpy's `isnan` and `any` there for speed, and must agree with it bit for
bit, at any length and alignment, and hand back the payload itself where
there is nothing to quiet.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlds_writer.store.features import field_encoding

_float_bits = pytest.importorskip(
    "rlds_writer.store.features._float_bits", reason="the C extensions are not built"
)

# Bit patterns on both sides of every boundary the scan tests, with either sign:
# zero, the largest finite, infinity, the first and last signalling NaNs, the
# first and last quiet ones.
_EDGES = np.array(
    [0x00000000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF],
    dtype=np.uint32,
)
_EDGES = np.concatenate([_EDGES, _EDGES | np.uint32(0x80000000)])
_SIGNALLING = (_EDGES & 0x7FFFFFFF > 0x7F800000) & (_EDGES & 0x7FFFFFFF < 0x7FC00000)


def _payloads(rng: np.random.Generator):
    # Lengths around the scan's blocks of 256 values, and odd ones.
    for n in (0, 1, 3, 255, 256, 257, 511, 512, 513, 1000):
        for plant in (0, 1, 2):
            words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
            if n and plant:
                at = rng.integers(0, n, plant * 3)
                words[at] = rng.choice(_EDGES, len(at))
                words[-1] = rng.choice(_EDGES)
            yield words


def test_signalling_nans_are_quieted_as_numpy_quiets_them_at_any_length_and_alignment():
    rng = np.random.default_rng(0)
    planted = 0
    for words in _payloads(rng):
        raw = words.tobytes()
        unaligned = memoryview(bytearray(b"\x00" + raw))[1:]
        for payload in (words.view(np.uint8), raw, unaligned):
            want = bytes(field_encoding.numpy_quiet_nans(payload))
            got = _float_bits.quiet_nans(payload)
            assert bytes(got) == want
            if want == raw:
                assert got is payload  # nothing to quiet: not copied
            else:
                planted += 1
                assert type(got) is bytes and bytes(payload) == raw  # the input kept
    assert planted > 20  # the patterns did plant signalling NaNs


def test_every_edge_pattern_is_quieted_or_kept_as_its_kind_says():
    got = np.frombuffer(_float_bits.quiet_nans(_EDGES.tobytes()), np.uint32)
    np.testing.assert_array_equal(got, np.where(_SIGNALLING, _EDGES | 0x00400000, _EDGES))


def test_a_payload_of_not_whole_float32s_is_refused():
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        _float_bits.quiet_nans(b"\x00\x00\x80")


def test_the_encoder_takes_the_c_scan_where_it_is_built():
    assert field_encoding.quiet_nans is _float_bits.quiet_nans
