"""Decoding the PNG and JPEG values of `Image` features, as TensorFlow decodes them.

Stored bytes are data from elsewhere, so nothing is decoded before its cost is
known. Each value's format is read from its first bytes: only PNG and JPEG
are decoded (what TFDS writes; Pillow would open GIF, BMP, TIFF and a dozen
more). Its size is read from its header: a feature that fixes the image's
height and width must get exactly those; a field of open size gets at most
`MAX_IMAGE_BYTES` decoded per image (or `MAX_IMAGE_RATIO` times its stored
bytes, for large images that compress as real ones do), and a whole
episode's values of that field at most `MAX_FIELD_BYTES` (or the same ratio).
A PNG of zeros is a few hundred bytes per megapixel: without these limits a
0.5 MB file costs gigabytes to read.
"""

from __future__ import annotations

import io
import logging
import struct

import numpy as np

from rlds_writer.errors import DecodeError, UnsupportedFeatureError, pip_install
from rlds_writer.read import png
from rlds_writer.store.features.features import Leaf

_log = logging.getLogger(__name__)

# Decoded bytes an image of a field of open size may always take (a 16-bit
# 4096x4096 RGB frame is 96 MB; a 4K RGB camera frame is 25 MB).
MAX_IMAGE_BYTES = 64 << 20
# ... and one episode's values of such a field together.
MAX_FIELD_BYTES = 1 << 30
# Beyond those, decoded bytes per stored byte: real frames compress 2-20x as
# PNG or JPEG; a bomb (an image of zeros) compresses a thousand times.
MAX_IMAGE_RATIO = 64
_SAMPLES = {0: 1, 2: 3, 3: 4, 4: 2, 6: 4}  # PNG colour type -> samples (palette: up to RGBA)
_OTHER_FORMATS = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"RIFF", "RIFF (WebP)"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xffO\xffQ", "JPEG 2000"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"8BPS", "PSD"),
    (b"qoif", "QOI"),
    (b"\x76\x2f\x31\x01", "OpenEXR"),
)


def image_format(data: bytes) -> str:
    """`png`, `jpeg`, or the name of the format `data` starts like (for messages)."""
    if data[:8] == png.SIGNATURE:
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    return f"no known image format (starts {bytes(data[:8])!r})"


def check_field(values: list[bytes], leaf: Leaf) -> None:
    """Refuses an episode's values of an open-size image field from their headers alone.

    Each is checked as `decode_image` checks it, and together they may decode
    to at most `MAX_FIELD_BYTES` (or `MAX_IMAGE_RATIO` times their stored
    bytes): nothing is decoded before the whole episode's cost is known.
    """
    total = sum(_header(data, leaf)[2] for data in values)
    limit = max(MAX_FIELD_BYTES, MAX_IMAGE_RATIO * sum(len(data) for data in values))
    if total > limit:
        raise DecodeError(
            f"{leaf.key}: the episode's {len(values)} images decode to {_mb(total)}, over the "
            f"{_mb(limit)} the images of an open-size field ({leaf.describe()}) may take "
            f"together (rlds_writer.read.images.MAX_FIELD_BYTES, or {MAX_IMAGE_RATIO}x their "
            f"stored bytes): declare the image size in the feature, or raise the limit"
        )


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB"


def decode_image(data: bytes, leaf: Leaf) -> np.ndarray:
    """Decodes one PNG/JPEG value of `leaf`; anything else is a DecodeError naming the field.

    Args:
      data: the stored bytes.
      leaf: the `Image` feature.

    Returns:
      The image, `leaf.dtype`, `(H, W, C)` as TFDS decodes it.

    Raises:
      DecodeError: not a PNG or JPEG, a size the feature does not hold, over
        the limits above, or a damaged file.
    """
    fmt, depth, _ = _header(data, leaf)
    try:
        return _decode(data, fmt, depth, leaf)
    except (DecodeError, UnsupportedFeatureError):
        raise
    except Exception as e:  # noqa: BLE001 - PIL and simplejpeg raise many types on bad files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DecodeError(f"{leaf.key}: not a readable {fmt.upper()} ({reason[:120]})") from e


def check_image(data: bytes, leaf: Leaf) -> str:
    """The format of one stored value of `leaf`, `png` or `jpeg`, checked from its header alone.

    The same checks `decode_image` makes before it decodes anything (the
    format, the size the feature fixes, the per-image limit of open sizes), for
    callers that hand the stored bytes on (the viewer serves them as they are).

    Raises:
      DecodeError: not a PNG or JPEG, a size the feature does not hold, or over the limits.
    """
    return _header(data, leaf)[0]


def image_size(data: bytes, leaf: Leaf) -> tuple[int, int]:
    """(height, width) of a stored PNG or JPEG value of `leaf`, from its header alone.

    Raises:
      DecodeError: as `check_image`.
    """
    fmt, _, _ = _header(data, leaf)
    if fmt == "png":
        return _png_header(data, leaf.key)[:2]
    return _jpeg_header(data)[:2]


def check_stored(data: bytes, leaf: Leaf) -> bool:
    """Checks a stored value from its header alone; True if it is the image as it decodes.

    For a value handed on as its stored bytes (a Hugging Face `Image`): it
    must pass the checks `decode_image` makes before decoding (format, size,
    limits), and it is the feature's image as is when a plain decoder (Pillow)
    gives exactly the feature's dtype and channels from it: an 8-bit grey,
    RGB or RGBA PNG, or a grey or colour JPEG, for a uint8 feature of 1, 3 or
    4 channels. Otherwise (palette or 16-bit PNGs, a channel count TensorFlow
    converts) the caller decodes it with `decode_image`.

    Raises:
      DecodeError: as `decode_image`, for what it would refuse before decoding.
    """
    fmt, depth, _ = _header(data, leaf)
    channels = leaf.shape[-1]
    if leaf.dtype != np.uint8 or depth != 8 or channels not in (1, 3, 4):
        return False
    if fmt == "png":
        return data[25] == {1: 0, 3: 2, 4: 6}[channels]  # IHDR colour type
    return channels != 4 and _jpeg_components(data) == channels


def _jpeg_components(data: bytes) -> int:
    """1 (grey) or 3 (YCbCr/RGB) as Pillow decodes a JPEG; 0 for others (CMYK, YCCK)."""
    try:
        import simplejpeg
    except ImportError:
        from PIL import Image

        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:  # reads the header only
            return {"L": 1, "RGB": 3}.get(img.mode, 0)
    colorspace = simplejpeg.decode_jpeg_header(data)[2]
    return {"Gray": 1, "YCbCr": 3, "RGB": 3}.get(colorspace, 0)


def _header(data: bytes, leaf: Leaf) -> tuple[str, int, int]:
    """(format, bit depth, decoded bytes) of a value, checked against the feature.

    Raises:
      DecodeError: not PNG or JPEG, or a size the feature does not hold.
    """
    fmt = image_format(data)
    if fmt not in ("png", "jpeg"):
        raise DecodeError(
            f"{leaf.key}: stored image is {fmt}, expected PNG or JPEG for {leaf.describe()} "
            f"(only those are decoded); re-encode the frames as PNG or JPEG"
        )
    try:
        if fmt == "jpeg":
            height, width, samples = _jpeg_header(data)
            depth = 8
        else:
            height, width, depth, samples = _png_header(data, leaf.key)
    except DecodeError:
        raise
    except Exception as e:  # noqa: BLE001 - PIL and simplejpeg raise many types on bad files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DecodeError(f"{leaf.key}: not a readable {fmt.upper()} ({reason[:120]})") from e
    want = 4 if leaf.dtype == np.float32 else leaf.shape[-1]
    item = 2 if depth == 16 or leaf.dtype == np.uint16 else 1
    cost = height * width * max(samples, want or 0) * item
    _check_size(height, width, cost, data, leaf)
    return fmt, depth, cost


def _png_header(data: bytes, key: str) -> tuple[int, int, int, int]:
    """(height, width, bit depth, samples) from a PNG's IHDR, nothing decoded."""
    if len(data) < 29 or data[12:16] != b"IHDR":
        raise DecodeError(f"{key}: PNG does not start with an IHDR chunk (truncated or damaged)")
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    return height, width, depth, _SAMPLES.get(colour, 4)


def _jpeg_header(data: bytes) -> tuple[int, int, int]:
    """(height, width, components) from a JPEG's frame header, nothing decoded."""
    try:
        import simplejpeg
    except ImportError:
        from PIL import Image

        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:  # reads the header only
            return img.size[1], img.size[0], len(img.getbands())
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    return height, width, 1 if colorspace == "Gray" else 3


def _check_size(height: int, width: int, cost: int, data: bytes, leaf: Leaf) -> None:
    """Refuses an image of the wrong or too large a size from its header."""
    want_h, want_w = leaf.shape[0], leaf.shape[1]
    if (want_h is not None and height != want_h) or (want_w is not None and width != want_w):
        raise DecodeError(
            f"{leaf.key}: image is {height}x{width}, feature expects {leaf.describe()} "
            f"(from the image's header; nothing was decoded)"
        )
    if want_h is not None and want_w is not None:
        return  # the feature fixes the size: its values cost what it declares
    limit = max(MAX_IMAGE_BYTES, MAX_IMAGE_RATIO * len(data))
    if cost > limit:
        raise DecodeError(
            f"{leaf.key}: image is {height}x{width} ({_mb(cost)} decoded from {len(data)} "
            f"stored bytes), over the {_mb(limit)} an image of open size {leaf.describe()} "
            f"may take (rlds_writer.read.images.MAX_IMAGE_BYTES, or {MAX_IMAGE_RATIO}x its "
            f"stored bytes): declare the image size in the feature, or raise the limit"
        )


_JPEG_WARNED = []


def _decode_jpeg_like_tf(data: bytes, channels: int | None) -> np.ndarray | None:
    """Decodes a JPEG exactly as `tf.image.decode_image` does, or None.

    TensorFlow decodes JPEGs with libjpeg-turbo's fast integer DCT and fancy
    upsampling; `simplejpeg` can do the same, Pillow cannot (it uses the
    accurate DCT, which differs by a few levels per pixel).
    """
    try:
        import simplejpeg
    except ImportError:
        if not _JPEG_WARNED:
            _JPEG_WARNED.append(True)
            _log.warning(
                "simplejpeg is not installed: JPEG images are decoded with Pillow and may "
                "differ from TensorFlow's decoding by a few levels per pixel "
                f"(the reader extra: {pip_install('reader')})"
            )
        return None
    if channels is None:
        channels = 1 if simplejpeg.decode_jpeg_header(data)[2] == "Gray" else 3
    if channels not in (1, 3):
        return None
    colorspace = "GRAY" if channels == 1 else "RGB"
    arr = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=True, fastupsample=False)
    return arr.reshape(arr.shape[0], arr.shape[1], channels)


def _decode(data: bytes, fmt: str, depth: int, leaf: Leaf) -> np.ndarray:
    from PIL import Image

    channels = leaf.shape[-1]
    want = 4 if leaf.dtype == np.float32 else channels
    if fmt == "jpeg" and leaf.dtype == np.uint8:
        arr = _decode_jpeg_like_tf(data, channels)
        if arr is not None:
            return _check_image(arr, leaf)
    if depth == 16:  # Pillow has no 16-bit RGB, grey+alpha or RGBA
        arr = png.decode(png.parse(data, leaf.key), want, leaf.key)
        if leaf.dtype != np.uint16:
            arr = (arr >> 8).astype(np.uint8)  # TensorFlow keeps the high byte
    else:
        with Image.open(io.BytesIO(data), formats=["PNG" if fmt == "png" else "JPEG"]) as img:
            mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(want)
            if mode is None and img.mode == "P":
                mode = "RGBA" if "transparency" in img.info else "RGB"
            if mode is not None and img.mode != mode:
                img = img.convert(mode)
            arr = np.asarray(img, dtype=np.uint8)
        if leaf.dtype == np.uint16:
            arr = arr.astype(np.uint16) * 257  # as TensorFlow widens 8-bit samples
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if leaf.dtype == np.float32:  # 4 uint8 channels bitcast to one float32 channel
        if arr.shape[-1] != 4:
            raise DecodeError(f"{leaf.key}: a float32 image needs 4 channels, got {arr.shape}")
        arr = np.ascontiguousarray(arr).view(np.float32)
    return _check_image(arr, leaf)


def _check_image(arr: np.ndarray, leaf: Leaf) -> np.ndarray:
    for want, got in zip(leaf.shape, arr.shape):
        if want is not None and want != got:
            raise DecodeError(
                f"{leaf.key}: image decoded to shape {arr.shape}, feature expects {leaf.shape}"
            )
    return np.array(arr, copy=True) if not arr.flags.writeable else arr
