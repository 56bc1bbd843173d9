"""Image codecs of the encoder: PNG (ours, numpy + zlib) and JPEG (Pillow).

Both run off the env thread: in the encoder's worker processes
(`image_processes`), or in its threads where processes cannot run; both
release the GIL for their heavy part. What they write decodes in TFDS to
exactly what TFDS's own encoder would give.
"""

from __future__ import annotations

import io
import os
import struct
import threading
import zlib

import numpy as np

# TensorFlow's `encode_jpeg` default, which TFDS uses for JPEG `Image`s.
DEFAULT_JPEG_QUALITY = 95

_PNG_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # grey, grey+alpha, RGB, RGBA


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def yield_cpu_to_caller() -> None:
    """Lowers the calling thread's CPU priority (Linux: threads have their own nice).

    Encoding and writing threads run at a lower priority than the env loop, so
    that when they keep every core busy (PNG on 2 cores) the control loop still
    gets a core at once instead of queueing behind them.
    """
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + 5)
    except (AttributeError, OSError):  # no per-thread priority here: keep the default
        pass


# zlib level 4 compresses camera frames within ~1.5% of level 6 (TensorFlow's
# and Pillow's default) in about a quarter of the time (benchmarks/REPORT.md).
PNG_ZLIB_LEVEL = 4


def encode_png(image: np.ndarray, level: int = PNG_ZLIB_LEVEL) -> bytes:
    """PNG-encodes an (H, W, C) image: uint8 or uint16 with C in 1..4, or float32 with C = 1.

    Every row uses PNG's "Up" filter (vectorised with numpy), and
    `zlib.compress` releases the GIL, so several threads encode in parallel.
    PNG is lossless: TFDS decodes these bytes to exactly the input pixels.
    uint16 samples are stored big-endian (16-bit PNG); a float32 image is
    bitcast to 4 uint8 channels first, as TFDS does.
    """
    if image.dtype == np.float32:
        image = np.ascontiguousarray(image, dtype="<f4").view(np.uint8)
    h, w, c = image.shape
    depth = 16 if image.dtype == np.uint16 else 8
    if depth == 16:
        rows = np.ascontiguousarray(image, dtype=">u2").view(np.uint8).reshape(h, w * c * 2)
    else:
        rows = np.ascontiguousarray(image, dtype=np.uint8).reshape(h, w * c)
    width = rows.shape[1]
    filtered = np.empty((h, width + 1), dtype=np.uint8)
    filtered[:, 0] = 2  # filter type Up: byte-wise, so the same for 8 and 16 bits
    filtered[:1, 1:] = rows[:1]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])
    header = struct.pack(">IIBBBBB", w, h, depth, _PNG_COLOR_TYPES[c], 0, 0, 0)
    return b"".join(
        (
            b"\x89PNG\r\n\x1a\n",
            _png_chunk(b"IHDR", header),
            _png_chunk(b"IDAT", zlib.compress(filtered.tobytes(), level)),
            _png_chunk(b"IEND", b""),
        )
    )


_jpeg_files = threading.local()


def _jpeg_scratch() -> io.FileIO | None:
    """This thread's in-memory file for Pillow to encode into (None off Linux)."""
    scratch = getattr(_jpeg_files, "file", None)
    if scratch is None and hasattr(os, "memfd_create"):
        scratch = _jpeg_files.file = io.FileIO(os.memfd_create("rlds_writer_jpeg"), "w+b")
    return scratch


def encode_jpeg(image: np.ndarray, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """JPEG-encodes a uint8 (H, W, C) image, C in 1, 3, with Pillow.

    Pillow (libjpeg-turbo, accurate integer DCT, 4:2:0 chroma) writes JPEGs
    that decode to exactly the pixels of TensorFlow's `encode_jpeg` at the same
    quality, which is what TFDS writes. (`simplejpeg` encodes faster but its
    pixels differ from TensorFlow's by up to ~11 levels, so it is not used.)
    Pillow releases the GIL only when it encodes into a file descriptor, not
    into a `BytesIO`; so each thread encodes into its own in-memory file
    (`memfd`). It still holds the GIL to unpack the pixels and set up the
    save, which is why the encoder runs JPEG in processes, not threads.
    """
    from PIL import Image as PILImage

    image = np.ascontiguousarray(image, dtype=np.uint8)
    img = PILImage.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    scratch = _jpeg_scratch()
    if scratch is None:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=int(quality), subsampling=2)
        return buf.getvalue()
    fd = scratch.fileno()
    os.lseek(fd, 0, os.SEEK_SET)
    img.save(scratch, format="JPEG", quality=int(quality), subsampling=2)
    return os.pread(fd, os.lseek(fd, 0, os.SEEK_CUR), 0)
