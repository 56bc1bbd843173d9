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
from typing import Any

import numpy as np

from rlds_writer.store.features.feature_defs import DEFAULT_JPEG_QUALITY

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


# Per (Pillow mode, quality): the arguments `JpegImagePlugin` gives Pillow's
# JPEG encoder, or None where calling that encoder directly was not checked
# to write `Image.save`'s bytes.
_direct_args: dict[tuple[str, int], tuple[Any, ...] | None] = {}


def _save_jpeg(img: Any, quality: int) -> bytes:
    """`img` as a JPEG, through Pillow's public `Image.save`."""
    scratch = _jpeg_scratch()
    if scratch is None:
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality, subsampling=2)
        return buf.getvalue()
    fd = scratch.fileno()
    os.lseek(fd, 0, os.SEEK_SET)
    img.save(scratch, format="JPEG", quality=quality, subsampling=2)
    return os.pread(fd, os.lseek(fd, 0, os.SEEK_CUR), 0)


def _encode_direct(img: Any, args: tuple[Any, ...], fd: int) -> bytes:
    """`img` as a JPEG, from Pillow's encoder called as `ImageFile._save` calls it."""
    from PIL import Image as PILImage
    from PIL import ImageFile

    encoder = PILImage._getencoder(img.mode, "jpeg", img.mode, args)
    try:
        encoder.setimage(img.im, (0, 0, *img.size))
        os.lseek(fd, 0, os.SEEK_SET)
        status = encoder.encode_to_file(fd, max(ImageFile.MAXBLOCK, img.size[0] * 4))
    finally:
        encoder.cleanup()
    if status < 0:
        raise OSError(f"Pillow's JPEG encoder failed (error {status})")
    return os.pread(fd, os.lseek(fd, 0, os.SEEK_CUR), 0)


def _direct_jpeg_args(mode: str, quality: int) -> tuple[Any, ...] | None:
    """The encoder arguments `_encode_direct` uses for `mode` and `quality`, or None.

    They are taken from one `Image.save` of a probe image and kept only if the
    direct call writes the same bytes for it; a Pillow whose internals differ
    gets None, and `Image.save` is used.
    """
    key = (mode, quality)
    if key in _direct_args:
        return _direct_args[key]
    from PIL import Image as PILImage

    channels = 3 if mode == "RGB" else 1
    probe = PILImage.frombytes(mode, (32, 16), bytes(range(256)) * (2 * channels))
    args = None
    scratch = _jpeg_scratch()
    try:
        expected = _save_jpeg(probe, quality)
        config = getattr(probe, "encoderconfig", None)
        if scratch is not None and isinstance(config, tuple):
            if _encode_direct(probe, config, scratch.fileno()) == expected:
                args = config
    except Exception:  # noqa: BLE001 -- any surprise: keep to the public path
        args = None
    _direct_args[key] = args
    return args


def encode_jpeg_image(img: Any, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """JPEG-encodes a Pillow image of mode "RGB" or "L" (see `encode_jpeg`).

    Pillow's encoder is called directly where that was checked to give
    `Image.save`'s bytes (`_direct_jpeg_args`): the save's Python costs about a
    tenth of a 256x256 frame's encoding. Either way the GIL is released while
    libjpeg runs, since the encoder writes into a file descriptor.
    """
    quality = int(quality)
    args = _direct_jpeg_args(img.mode, quality)
    scratch = _jpeg_scratch()
    if args is None or scratch is None:
        return _save_jpeg(img, quality)
    return _encode_direct(img, args, scratch.fileno())


def encode_jpeg(image: np.ndarray, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """JPEG-encodes a uint8 (H, W, C) image, C in 1, 3, with Pillow.

    Pillow (libjpeg-turbo, accurate integer DCT, 4:2:0 chroma) writes JPEGs
    that decode to exactly the pixels of TensorFlow's `encode_jpeg` at the same
    quality, which is what TFDS writes. (`simplejpeg` encodes faster but its
    pixels differ from TensorFlow's by up to 13 levels, even with TensorFlow's
    quality, 4:2:0 chroma and `fastdct=False`, so it is not used.)
    Pillow releases the GIL only when it encodes into a file descriptor, not
    into a `BytesIO`; so each thread encodes into its own in-memory file
    (`memfd`). It still holds the GIL to unpack the pixels and set up the
    encoder, which is why the encoder runs JPEG in processes, not threads,
    unless the frames were unpacked at the step (`JpegFrames`).
    """
    from PIL import Image as PILImage

    image = np.ascontiguousarray(image, dtype=np.uint8)
    img = PILImage.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
    return encode_jpeg_image(img, quality)


class JpegFrames:
    """Reusable Pillow images of one frame shape, filled at the step and JPEG-encoded later.

    `fill` is the only copy of a frame: Pillow's unpacking into an image it
    can encode (a numpy ring would copy the frame once more, and
    `Image.fromarray` allocate a fresh image per frame).

    Args:
      shape: a frame's shape, (H, W, 3) or (H, W, 1), uint8.
      quality: JPEG quality 1..100.
    """

    def __init__(self, shape: tuple[int, ...], quality: int = DEFAULT_JPEG_QUALITY):
        self.mode = "L" if shape[-1] == 1 else "RGB"
        self.size = (shape[1], shape[0])
        self.quality = int(quality)

    def new(self) -> Any:
        """An image to `fill`, to be reused for frame after frame."""
        from PIL import Image as PILImage

        return PILImage.new(self.mode, self.size)

    def fill(self, img: Any, frame: np.ndarray) -> None:
        """Copies a checked uint8 frame of this shape into `img`."""
        img.frombytes(frame if frame.flags.c_contiguous else np.ascontiguousarray(frame))

    def encode(self, img: Any) -> bytes:
        """`img` as JPEG bytes (the GIL released while libjpeg runs)."""
        return encode_jpeg_image(img, self.quality)
