"""Look at an episode: its image observations as an animated GIF, with a strip of scalar fields.

`render_episode` reads one episode through the TF-free reader (datasets
written by us or by TFDS), picks the per-step fields that are images
(uint8/uint16/float arrays of shape (H, W), (H, W, 1), (H, W, 3) or
(H, W, 4); a 2-D grid such as Catch's board counts, a long thin array such as
a (3, 4000) signal does not), scales each to a common height, lays them side
by side under a label naming each field, and under them draws each scalar
step field (reward, a scalar action, numeric step metadata) as a line over
the episode with a cursor at the current step and its value.

Frames are decoded, drawn and written one step at a time (the GIF is written
as it goes, not collected): memory does not grow with the episode's length.
GIF needs only Pillow; MP4 needs PyAV (`pip install av`).
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rlds_writer.maintain.statistics import is_clock_field
from rlds_writer.read.decode import Decoder, LazySteps
from rlds_writer.read.nest import flatten
from rlds_writer.read.reader import open_dataset
from rlds_writer.store.dataset import Dataset
from rlds_writer.store.features.features import Leaf

_FLAGS = {"is_first", "is_last", "is_terminal"}
_MIN_HEIGHT = 96
_MAX_PANEL = 640  # a panel's longest side at most (larger images are subsampled)
_MAX_ASPECT = 16  # longer than this times its width (or height): a signal, not an image
_LABEL_HEIGHT = 14  # the row naming each panel's field
_STRIP_LABEL = 13  # a strip's name and value, above its line
_STRIP_HEIGHT = 34
_MIN_WIDTH = 240  # room for the strips' labels
_TEXT = (230, 230, 230)
_LABEL_BACK = (40, 40, 48)


def _image_like(shape: Sequence[int | None], dtype: np.dtype, any_aspect: bool = False) -> bool:
    """Whether one step's value of this shape and dtype can be shown as an image.

    Unless `any_aspect` (a field asked for by name), an array much longer
    than it is wide is a signal, not an image, and is left out.
    """
    if np.dtype(dtype).kind not in "uif" or len(shape) not in (2, 3):
        return False
    if len(shape) == 3 and shape[-1] not in (1, 3, 4):
        return False
    h, w = shape[0], shape[1]
    if h is None or w is None:  # an Image feature of open size
        return True
    return min(h, w) >= 3 and (any_aspect or max(h, w) <= _MAX_ASPECT * min(h, w))


def _step_shape(column: Any) -> tuple[tuple[int | None, ...], np.dtype]:
    if isinstance(column, LazySteps):
        return column.leaf.shape, column.leaf.dtype
    column = np.asarray(column)
    return column.shape[1:], column.dtype


def _image_fields(steps: Mapping[str, Any], any_aspect: bool = False) -> dict[str, Any]:
    out = {}
    for path, column in flatten(steps):
        if _image_like(*_step_shape(column), any_aspect):
            out["/".join(path)] = column
    return out


def _scalar_fields(steps: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for path, column in flatten(steps):
        if isinstance(column, LazySteps):
            continue
        column = np.asarray(column)
        if path[-1] in _FLAGS or column.dtype.kind not in "biuf" or column.ndim != 1:
            continue
        if is_clock_field("/".join(path)):
            continue  # a timestamp's line says nothing
        out["/".join(path)] = column.astype(np.float64)
    return out


def _pick(fields: Sequence[str] | None, steps: Mapping) -> dict:
    images = _image_fields(steps, any_aspect=bool(fields))
    if fields:
        missing = [f for f in fields if f not in images]
        if missing:
            raise ValueError(
                f"no image field {missing}; the episode's image fields are {sorted(images)}"
            )
        images = {f: images[f] for f in fields}
    if not images:
        names = sorted("/".join(p) for p, _ in flatten(steps))
        raise ValueError(
            f"the episode has no image-like step field to show (fields: {names}); "
            "images are (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) arrays"
        )
    return images


class _Panel:
    """One image field: where its frames go on the canvas and how they are scaled."""

    def __init__(self, name: str, column: Any):
        self.name = name
        self.column = column
        first = np.asarray(column[0])  # open sizes: the first frame's size is the panel's
        self.h, self.w = first.shape[0], first.shape[1]
        # Subsample what is larger than a panel.
        stride = max(1, -(-max(self.h, self.w) // _MAX_PANEL))
        if max(self.h, self.w) > _MAX_ASPECT * min(self.h, self.w):
            # A long thin array (shown when asked for): each axis on its own,
            # or its short side would shrink to nothing.
            self.stride = (max(1, -(-self.h // _MAX_PANEL)), max(1, -(-self.w // _MAX_PANEL)))
        else:
            self.stride = (stride, stride)
        self.small = (-(-self.h // self.stride[0]), -(-self.w // self.stride[1]))
        self.factor = (1, 1)
        self.x = 0
        self.range = None
        if first.dtype != np.uint8:  # scaled over the whole episode: one pass to find it
            lo, hi = np.inf, -np.inf
            for t in range(len(column)):
                values = np.asarray(column[t], np.float64)
                values = values[np.isfinite(values)]
                if values.size:
                    lo, hi = min(lo, float(values.min())), max(hi, float(values.max()))
            self.range = (lo, hi) if lo <= hi else (0.0, 0.0)

    def scale_to(self, target: int) -> None:
        """Scales small images up to the common height, never wider than a panel."""
        h, w = self.small
        up = max(1, -(-target // h))
        self.factor = (up, max(1, min(up, _MAX_PANEL // w)))

    @property
    def height(self) -> int:
        return self.small[0] * self.factor[0]

    @property
    def width(self) -> int:
        return self.small[1] * self.factor[1]

    def rgb(self, t: int) -> np.ndarray:
        """Step `t`'s frame as the panel's (height, width, 3) uint8 pixels."""
        frame = np.asarray(self.column[t])
        if frame.ndim == 2:
            frame = frame[..., None]
        frame = frame[: self.h : self.stride[0], : self.w : self.stride[1], :3]
        if self.range is not None:
            lo, hi = self.range
            scale = 255.0 / (hi - lo) if hi > lo else 0.0
            values = np.nan_to_num(frame.astype(np.float64), nan=lo, posinf=hi, neginf=lo)
            frame = ((values.clip(lo, hi) - lo) * scale).astype(np.uint8)
        if frame.shape[-1] == 1:
            frame = np.repeat(frame, 3, axis=-1)
        out = np.zeros((*self.small, 3), np.uint8)
        out[: frame.shape[0], : frame.shape[1]] = frame[: out.shape[0], : out.shape[1]]
        return out.repeat(self.factor[0], axis=0).repeat(self.factor[1], axis=1)


def _fit(draw: Any, text: str, width: int) -> str:
    """`text` cut (with '..') to fit `width` pixels; a field's path loses its parents first."""
    parts = text.split("/")
    for i in range(len(parts)):
        if draw.textlength("/".join(parts[i:])) <= width:
            return "/".join(parts[i:])
    text = parts[-1]
    while text and draw.textlength(text + "..") > width:
        text = text[:-1]
    return text + ".."


def _frames(
    images: dict[str, Any], scalars: dict[str, np.ndarray], n: int
) -> tuple[Iterator[np.ndarray], tuple[int, int]]:
    """The episode's frames, drawn one at a time, and their (width, height)."""
    from PIL import Image, ImageDraw

    panels = [_Panel(name, column) for name, column in images.items()]
    target = max(_MIN_HEIGHT, *(p.small[0] for p in panels))
    x = 0
    for panel in panels:
        panel.scale_to(target)
        panel.x = x
        x += panel.width
    top = _LABEL_HEIGHT
    height = max(p.height for p in panels)
    width = max(x, _MIN_WIDTH)
    size = (width, top + height + _STRIP_HEIGHT * len(scalars))

    # What does not change between steps is drawn once: labels, the strips' lines.
    base = Image.new("RGB", size, (0, 0, 0))
    draw = ImageDraw.Draw(base)
    draw.rectangle([0, 0, width - 1, top - 1], fill=_LABEL_BACK)
    for panel in panels:
        draw.text((panel.x + 3, 1), _fit(draw, panel.name, panel.width - 6), fill=_TEXT)
        if panel.x:
            draw.line([(panel.x, 0), (panel.x, top - 1)], fill=(0, 0, 0))
    xs = np.linspace(0, width - 1, num=max(n, 2))[:n]
    strips = []
    for row, (name, raw) in enumerate(scalars.items()):
        y0 = top + height + row * _STRIP_HEIGHT
        plot_top, plot_bottom = y0 + _STRIP_LABEL + 2, y0 + _STRIP_HEIGHT - 3
        finite = raw[np.isfinite(raw)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        values = np.where(np.isfinite(raw), raw, lo)  # nan/inf drawn at the bottom
        ys = plot_bottom - (values - lo) / (hi - lo or 1.0) * (plot_bottom - plot_top)
        draw.line([(0, y0), (width - 1, y0)], fill=(60, 60, 60))
        if n > 1:
            draw.line(list(zip(xs.tolist(), ys.tolist())), fill=(90, 160, 255), width=1)
        strips.append((name, raw, y0, plot_top, plot_bottom))

    def frames() -> Iterator[np.ndarray]:
        for t in range(n):
            canvas = base.copy()
            for panel in panels:
                canvas.paste(Image.fromarray(panel.rgb(t)), (panel.x, top))
            draw = ImageDraw.Draw(canvas)
            for name, raw, y0, plot_top, plot_bottom in strips:
                draw.line([(xs[t], plot_top), (xs[t], plot_bottom)], fill=(255, 80, 80))
                draw.text((3, y0 + 1), _fit(draw, f"{name} {raw[t]:.4g}", width - 6), fill=_TEXT)
            yield np.asarray(canvas)

    return frames(), size


def episode_frames(
    episode: dict[str, Any], fields: Sequence[str] | None = None
) -> tuple[list[np.ndarray], list[str]]:
    """The RGB frames (H, W, 3) uint8 of one decoded episode, one per step, and the fields used."""
    steps = episode.get("steps", {})
    images = _pick(fields, steps)
    n = len(next(iter(images.values())))
    if n == 0:
        return [], list(images)
    frames, _ = _frames(images, _scalar_fields(steps), n)
    return list(frames), list(images)


class _GifWriter:
    """An animated GIF written frame by frame (Pillow's writer keeps every frame until the end).

    Each frame is GIF-encoded by Pillow alone (its own adaptive palette) and
    its image block copied here with that palette as the frame's local colour
    table, after a control block with its delay.
    """

    def __init__(self, path: str, size: tuple[int, int], fps: float):
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._delay = max(1, round(100 / fps))  # hundredths of a second
        # Header, screen of `size` without a global table, then loop forever.
        self._file.write(b"GIF89a" + struct.pack("<HHBBB", *size, 0, 0, 0))
        self._file.write(b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00")

    def write(self, frame: np.ndarray) -> None:
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="GIF")
        data = buf.getvalue()
        packed = data[10]
        pos = 13
        table = b""
        if packed & 0x80:
            table = data[pos : pos + 3 * (2 << (packed & 7))]
            pos += len(table)
        while data[pos] == 0x21:  # extensions Pillow wrote: skip their sub-blocks
            pos += 2
            while data[pos]:
                pos += data[pos] + 1
            pos += 1
        if data[pos] != 0x2C:
            raise ValueError("Pillow wrote a GIF frame this writer does not understand")
        left, top, w, h, flags = struct.unpack_from("<HHHHB", data, pos + 1)
        pos += 10
        if not flags & 0x80:  # the frame uses the global table: make it the local one
            flags = (flags & 0x40) | 0x80 | (packed & 7)
        else:
            table = b""  # it has its own, right after the descriptor
        self._file.write(b"\x21\xf9\x04\x04" + struct.pack("<H", self._delay) + b"\x00\x00")
        self._file.write(b"\x2c" + struct.pack("<HHHHB", left, top, w, h, flags) + table)
        if data[-1] != 0x3B:
            raise ValueError("Pillow wrote a GIF frame this writer does not understand")
        self._file.write(data[pos:-1])  # the image data, up to the trailer

    def close(self) -> None:
        self._file.write(b"\x3b")
        self._file.close()


class _Mp4Writer:
    """An H.264 MP4 written frame by frame with PyAV."""

    def __init__(self, path: str, size: tuple[int, int], fps: float):
        try:
            import av
        except ImportError:
            raise ValueError(
                "writing .mp4 needs PyAV: pip install av (.gif needs nothing more)"
            ) from None
        self._container = av.open(path, mode="w")
        self._stream = self._container.add_stream("h264", rate=Fraction(fps).limit_denominator())
        # yuv420p (what players expect) needs even sides: frames are padded by a pixel if not.
        self._pad = (size[1] % 2, size[0] % 2)
        self._stream.width, self._stream.height = size[0] + self._pad[1], size[1] + self._pad[0]
        self._stream.pix_fmt = "yuv420p"

    def write(self, frame: np.ndarray) -> None:
        import av

        if any(self._pad):
            frame = np.pad(frame, ((0, self._pad[0]), (0, self._pad[1]), (0, 0)))
        image = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        for packet in self._stream.encode(image):
            self._container.mux(packet)

    def close(self) -> None:
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
        finally:
            self._container.close()


def _image_leaves(leaves: Sequence[Leaf]) -> list[str]:
    return [leaf.key for leaf in leaves if _image_like(leaf.shape, leaf.dtype, any_aspect=True)]


def render_episode(
    path: Dataset | os.PathLike | str,
    out: os.PathLike | str,
    *,
    episode: int = 0,
    split: str = "train",
    fields: Sequence[str] | None = None,
    fps: float = 10.0,
) -> dict[str, Any]:
    """Writes one episode's image observations as an animated GIF (or MP4).

    Frames are decoded and written one step at a time: memory does not grow
    with the episode's length.

    Args:
      path: the dataset directory (local or object storage), or a `Dataset`.
      out: the output file; `.gif` (Pillow) or `.mp4` (needs PyAV).
      episode: the episode's index in the split.
      split: the split (TFDS split syntax).
      fields: image fields to show (paths like `observation/image`); default all.
      fps: frames per second.

    Returns:
      `{"out", "frames", "fields", "size"}`.

    Raises:
      ValueError: no such episode or field, or an unknown output format.
    """
    out = os.fspath(out)
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in (".gif", ".mp4"):
        raise ValueError(f"{out}: the output must end in .gif or .mp4, got {suffix or 'nothing'!r}")
    if not fps > 0:
        raise ValueError(f"--fps must be above 0, got {fps}")
    with open_dataset(path) as reader:
        path = reader.path
        episodes = reader.episodes(split)
        if not 0 <= episode < len(episodes):
            raise ValueError(
                f"{path}: split {split!r} has {len(episodes)} episodes; --episode must be in "
                f"0..{len(episodes) - 1}, got {episode}"
            )
        ((where, record),) = list(episodes[episode : episode + 1].records())
    decoder = Decoder(reader.features)
    # Image fields stay encoded until their step is drawn; the rest is small.
    decoded = decoder.decode(record, where, lazy=_image_leaves(reader.features.step_leaves))
    del record
    steps = decoded.get("steps", {})
    images = _pick(fields, steps)
    n = len(next(iter(images.values())))
    if n == 0:
        raise ValueError(f"{path}: episode {episode} of split {split!r} has no steps")
    frames, size = _frames(images, _scalar_fields(steps), n)
    writer = (_GifWriter if suffix == ".gif" else _Mp4Writer)(out, size, fps)
    try:
        for frame in frames:
            writer.write(frame)
    finally:
        writer.close()
    return {"out": out, "frames": n, "fields": list(images), "size": size}
