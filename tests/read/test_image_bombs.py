"""Hostile bytes in `Image` fields: refused from their headers, before any pixel is decoded.

Each dataset is written by the test with `write_episode` (which stores encoded
images as given), then read in a fresh process by the TF-free reader (and by
`rlds-writer show`), whose peak memory (`ru_maxrss`) is compared with that of
reading a harmless dataset. Before these checks, a 130 KB 16-bit PNG of zeros
cost 400 MB to read and Pillow opened GIF, BMP or TIFF files.
"""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

import rlds_writer

_FIELD = "steps/observation/cam"


def _chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def _png_of_zeros(height: int, width: int, depth: int = 8, colour: int = 0) -> bytes:
    """A valid PNG of zeros: a few hundred bytes per megapixel."""
    samples = {0: 1, 2: 3}[colour]
    row = b"\0" * (1 + width * samples * depth // 8)
    packer = zlib.compressobj(9)
    stream = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", stream),
            _chunk(b"IEND", b""),
        ]
    )


def _declaring(height: int, width: int) -> bytes:
    """An 8-bit RGB PNG whose header declares a huge size over a few bytes of data."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    stream = zlib.compress(b"\0" * 1000)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", stream),
            _chunk(b"IEND", b""),
        ]
    )


def _saved(fmt: str, shape=(64, 64, 3)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full(shape, 90, np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _jpeg_declaring(height: int, width: int) -> bytes:
    """A small JPEG whose frame header (SOF0) is edited to declare a huge size."""
    data = bytearray(_saved("JPEG"))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def _write(path, feature, frames: list) -> None:
    config = rlds_writer.DatasetConfig(
        name="bombs",
        observation_info={"cam": feature},
        action_info=np.int64,
        reward_info=np.float32,
    )
    with rlds_writer.TFDSBackendWriter(path, config) as writer:
        n = len(frames) - 1
        writer.write_episode(
            {"observation": {"cam": frames}, "action": [0] * n, "reward": [0.0] * n}
        )


_READ = """
import json, resource, sys
from rlds_writer import open_dataset
from rlds_writer.errors import DecodeError
try:
    episode = open_dataset(sys.argv[1]).episodes()[0]
    error = None
except DecodeError as e:
    error = str(e)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"error": error, "peak_mb": peak}))
"""


def _read(path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def baseline_mb(tmp_path_factory) -> float:
    """Peak memory of reading a harmless dataset: 3 frames of 64x64 RGB."""
    path = tmp_path_factory.mktemp("harmless") / "ds"
    _write(path, tfds.features.Image(shape=(None, None, 3)), [_saved("PNG")] * 3)
    read = _read(path)
    assert read["error"] is None
    return read["peak_mb"]


_OPEN_GREY = tfds.features.Image(shape=(None, None, 1))
_OPEN_GREY16 = tfds.features.Image(shape=(None, None, 1), dtype=np.uint16)
_OPEN_RGB = tfds.features.Image(shape=(None, None, 3))
_FIXED = tfds.features.Image(shape=(64, 64, 3))

_BOMBS = {
    "16-bit PNG of zeros": (
        _OPEN_GREY16,
        lambda: [_png_of_zeros(8192, 8192, 16)] * 2,
        r"image is 8192x8192 \(128 MB decoded from \d+ stored bytes\), over the 64 MB an "
        r"image of open size uint16\[\?,\?,1\] may take",
    ),
    "8-bit PNG of zeros": (
        _OPEN_GREY,
        lambda: [_png_of_zeros(16384, 16384)] * 2,
        r"image is 16384x16384 \(256 MB decoded",
    ),
    "PNG declaring a huge size": (
        _OPEN_RGB,
        lambda: [_declaring(100000, 100000)] * 2,
        r"image is 100000x100000 \(28610 MB decoded from \d+ stored bytes\)",
    ),
    "JPEG declaring a huge size": (
        _OPEN_RGB,
        lambda: [_jpeg_declaring(60000, 60000)] * 2,
        r"image is 60000x60000 \(10300 MB decoded",
    ),
    "PNG larger than its fixed-size field": (
        _FIXED,
        lambda: [_png_of_zeros(8192, 8192, 8, colour=2)] * 2,
        r"image is 8192x8192, feature expects uint8\[64,64,3\] \(from the image's header",
    ),
    "many frames of zeros": (
        _OPEN_GREY,
        lambda: [_png_of_zeros(4096, 4096)] * 80,  # 16 MB each: 1280 MB in all
        r"the episode's 80 images decode to 1280 MB, over the 1024 MB",
    ),
    "GIF": (_FIXED, lambda: [_saved("GIF")] * 2, r"stored image is GIF, expected PNG or JPEG"),
    "BMP": (_FIXED, lambda: [_saved("BMP")] * 2, r"stored image is BMP, expected PNG or JPEG"),
    "TIFF": (_FIXED, lambda: [_saved("TIFF")] * 2, r"stored image is TIFF, expected PNG or JPEG"),
}


@pytest.mark.parametrize("kind", list(_BOMBS))
def test_bombs_are_refused_in_one_line_at_a_bounded_memory_cost(tmp_path, baseline_mb, kind):
    feature, frames, match = _BOMBS[kind]
    _write(tmp_path / "ds", feature, frames())
    read = _read(tmp_path / "ds")
    error = read["error"]
    assert error is not None, read
    assert "\n" not in error and error.startswith(str(tmp_path / "ds")), error
    assert f"{_FIELD}: " in error
    assert re.search(match, error), error
    # Refused from the header: the process holds no decoded image.
    assert read["peak_mb"] - baseline_mb < 24, (read, baseline_mb)


# Slow: a fresh `rlds-writer show` process per bomb, memory measured (the
# reader's refusal of each bomb stays in the quick loop).
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["16-bit PNG of zeros", "GIF"])
def test_show_refuses_bombs_in_one_line(tmp_path, kind, baseline_mb):
    feature, frames, match = _BOMBS[kind]
    _write(tmp_path / "ds", feature, frames())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlds_writer",
            "show",
            str(tmp_path / "ds"),
            "--out",
            str(tmp_path / "ep.gif"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert _FIELD in done.stderr and re.search(match, done.stderr)
    assert not (tmp_path / "ep.gif").exists()


def test_an_open_size_image_under_the_limits_still_decodes_exactly(tmp_path):
    image = np.random.default_rng(0).integers(0, 65536, (300, 200, 1), dtype=np.uint16)
    buf = io.BytesIO()
    from rlds_writer.store.images.image_codecs import encode_png

    buf.write(encode_png(image))
    _write(tmp_path / "ds", _OPEN_GREY16, [buf.getvalue(), _png_of_zeros(2048, 2048, 16)])
    episode = rlds_writer.open_dataset(tmp_path / "ds").episodes()[0]
    frames = episode["steps"]["observation"]["cam"]
    np.testing.assert_array_equal(frames[0], image)
    assert frames[1].shape == (2048, 2048, 1) and not frames[1].any()
