"""The SSE4.2 CRC-32C extension (`store/formats/tfrecord/_crc32c.c`) against google_crc32c, and
TFRecord framing without it (an install without a C compiler)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import google_crc32c
import numpy as np
import pytest

from rlds_writer.store.formats.tfrecord import tfrecord


def _extension():
    try:
        from rlds_writer.store.formats.tfrecord import _crc32c
    except ImportError:
        return None
    return _crc32c


needs_extension = pytest.mark.skipif(
    _extension() is None, reason="the CRC-32C extension is not built (no C compiler, or no SSE4.2)"
)

# The extension hashes three 4096-byte blocks at a time, then three 256-byte
# blocks, then 8-byte words, then bytes: lengths around each of those edges.
_LENGTHS = sorted(
    set(range(0, 64))
    | {n + d for n in (768, 3 * 4096, 3 * 4096 + 768, 2 * 3 * 4096) for d in (-9, -1, 0, 1, 7, 8)}
    | {20_700, 65_536, 100_003}
)


@needs_extension
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
def test_extension_gives_google_crc32c_values_at_every_block_edge_and_alignment(offset):
    extend = _extension().extend
    data = np.random.default_rng(offset).integers(0, 256, 110_000, dtype=np.uint8).tobytes()
    for n in _LENGTHS:
        chunk = data[offset : offset + n]
        for crc in (0, 1, 0xFFFFFFFF, 0x1234ABCD):
            assert extend(crc, chunk) == google_crc32c.extend(crc, chunk), (n, offset, crc)


@needs_extension
def test_extension_hashes_every_contiguous_buffer_in_place():
    extend = _extension().extend
    data = bytes(range(256)) * 100
    expected = google_crc32c.value(data[5:20_005])
    frame = np.frombuffer(data, dtype=np.uint8)[5:20_005]
    frame.flags.writeable = False
    for buffer in (data[5:20_005], bytearray(data[5:20_005]), memoryview(data)[5:20_005], frame):
        assert extend(0, buffer) == expected, type(buffer)
    # A whole record hashed part by part, as the writer hashes an episode.
    parts = [data[:7], memoryview(data)[7:4_100], np.frombuffer(data, np.uint8)[4_100:]]
    crc = 0
    for part in parts:
        crc = extend(crc, part)
    assert crc == google_crc32c.value(data)


@needs_extension
def test_extension_refuses_what_is_no_crc_or_no_contiguous_buffer():
    extend = _extension().extend
    with pytest.raises(TypeError):
        extend(0, "text")
    with pytest.raises(TypeError):
        extend(0)
    with pytest.raises((ValueError, OverflowError)):
        extend(1 << 32, b"x")
    with pytest.raises((ValueError, OverflowError)):
        extend(-1, b"x")
    with pytest.raises((BufferError, TypeError, ValueError)):
        extend(0, np.arange(10, dtype=np.uint8)[::2])


def test_an_install_with_a_c_compiler_builds_the_crc32c_extension():
    if os.environ.get("RLDS_WRITER_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("RLDS_WRITER_PURE_PYTHON is set: no extension is built")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None and shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here: records are framed with google_crc32c")
    if sysconfig.get_platform().split("-")[-1] != "x86_64":
        pytest.skip("the extension hashes with SSE4.2: x86-64 only")
    assert _extension() is not None, (
        "a C compiler is here but rlds_writer.store.formats.tfrecord._crc32c is not built: "
        "reinstall (pip install -e .) to build it"
    )
    assert tfrecord._crc32c_extend is _extension().extend


def test_without_the_extension_records_are_framed_the_same_with_google_crc32c():
    # As after an install without a C compiler: the module cannot be imported.
    script = (
        "import sys, json\n"
        "sys.modules['rlds_writer.store.formats.tfrecord._crc32c'] = None\n"
        "from rlds_writer.store.formats.tfrecord import tfrecord\n"
        "import google_crc32c\n"
        "assert tfrecord._crc32c_extend is google_crc32c.extend\n"
        "data = bytes(range(256)) * 90\n"
        "masked = tfrecord.masked_crc32c(memoryview(data)[3:])\n"
        "print(json.dumps([tfrecord.frame(data).hex(), masked]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    framed, masked = json.loads(out)
    data = bytes(range(256)) * 90
    assert bytes.fromhex(framed) == tfrecord.frame(data)
    assert masked == tfrecord.masked_crc32c(memoryview(data)[3:])
    assert masked == tfrecord._mask(google_crc32c.value(data[3:]))
