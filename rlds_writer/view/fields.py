"""What the viewer can show of a dataset's features, and why not the rest.

Every leaf of `features.json` lands in one place:

* cameras: per-step PNG or JPEG `Image` fields of 8 or 16 bits, served to the
  page as the stored bytes, and per-step uint8 arrays shaped like a picture
  (served as a PNG the server encodes);
* plots: per-step numeric fields of a fixed shape with at most `MAX_SERIES`
  values per step (each value one series), whatever their encoding;
* flags: `is_first`, `is_last`, `is_terminal`, drawn as marks on every plot;
* texts: per-step scalar strings (instructions), shown where they change;
* episode metadata: episode-level numbers and strings;
* left out, each with the reason the page gives.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlds_writer.store.features import features as features_lib
from rlds_writer.store.features.end_reasons import END_REASON
from rlds_writer.store.features.features import Features, Leaf

FLAGS = ("is_first", "is_last", "is_terminal")
# The most pixels a frame served to the page may have: a browser decodes each frame
# whole (4 bytes a pixel), so a fixed 20000x20000 `Image` of zeros, a few hundred KB
# stored, would take gigabytes of the page's memory per frame.
MAX_FRAME_PIXELS = 4096 * 4096
MAX_SERIES = 32
# An episode-level value with more elements than this is named, not shown.
MAX_METADATA_VALUES = 64
_NUMERIC = (*features_lib.NUMERIC_KINDS, *features_lib.ENCODED_KINDS)
# Names that mark a text field as the operator's instruction, best first.
_INSTRUCTION_WORDS = ("instruction", "language", "task", "prompt", "goal", "text")


def field_name(leaf: Leaf) -> str:
    """A leaf's name on the page: its path without `steps`, e.g. `observation/state`."""
    return "/".join(leaf.path[1:] if leaf.in_steps else leaf.path)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The dataset's fields, sorted into what the page shows.

    Attributes:
      cameras: per-step image leaves shown as frames.
      plots: per-step numeric leaves drawn as lines.
      flags: the RLDS flag leaves present.
      texts: per-step scalar text leaves.
      episode_fields: episode-level leaves shown as metadata.
      left_out: field name -> why the page does not show it.
      instruction: the text field taken as the episode's instruction, or None.
    """

    cameras: tuple[Leaf, ...]
    plots: tuple[Leaf, ...]
    flags: tuple[Leaf, ...]
    texts: tuple[Leaf, ...]
    episode_fields: tuple[Leaf, ...]
    left_out: dict[str, str]
    instruction: str | None

    def describe(self) -> dict:
        """The layout as JSON for the page (names, shapes, reasons)."""
        return {
            "cameras": [
                {
                    "id": i,
                    "name": field_name(leaf),
                    "format": leaf.kind if leaf.is_image else "array",
                    "shape": _dims(leaf),
                }
                for i, leaf in enumerate(self.cameras)
            ],
            "plots": [
                {
                    "id": i,
                    "name": field_name(leaf),
                    "dtype": leaf.dtype.name,
                    "shape": _dims(leaf),
                    "series": series_names(leaf),
                }
                for i, leaf in enumerate(self.plots)
            ],
            "flags": [field_name(leaf) for leaf in self.flags],
            "texts": [field_name(leaf) for leaf in self.texts],
            "episode_fields": [field_name(leaf) for leaf in self.episode_fields],
            "instruction": self.instruction,
            "left_out": [{"name": k, "reason": v} for k, v in self.left_out.items()],
        }


def _dims(leaf: Leaf) -> list[int | None]:
    return list(leaf.shape)


def series_names(leaf: Leaf) -> list[str]:
    """One name per plotted value: the field for a scalar, `field[i]` / `field[i,j]` else."""
    name = field_name(leaf)
    if not leaf.shape:
        return [name]
    return [f"{name}[{','.join(map(str, ix))}]" for ix in np.ndindex(*leaf.shape)]


def _step_reason(leaf: Leaf) -> str | None:
    """None if a per-step leaf can be plotted, else why not."""
    if leaf.kind not in _NUMERIC or leaf.dtype.kind not in "biuf":
        return f"{leaf.describe()} values are not numbers"
    if not leaf.static:
        return f"its shape {leaf.describe()} changes from step to step"
    if leaf.size == 0:
        return "it holds no values"
    if leaf.size > MAX_SERIES:
        return (
            f"{leaf.size} values per step ({leaf.describe()}); plots draw at most {MAX_SERIES} "
            "series (see `rlds-writer show` for image-like arrays, `stats --per-dimension` "
            "for statistics)"
        )
    return None


def is_raw_image(leaf: Leaf) -> bool:
    """A per-step uint8 array of a fixed (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) shape.

    Such a field (an Atari frame, a bytes-encoded camera) has no stored PNG or
    JPEG: the server encodes each frame it serves as a lossless PNG.
    """
    if leaf.is_image or leaf.kind not in _NUMERIC or leaf.dtype != np.uint8 or not leaf.static:
        return False
    shape = leaf.shape
    if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3, 4)):
        return False
    h, w = shape[0], shape[1]
    return min(h, w) >= 8 and max(h, w) <= 16 * min(h, w) and h * w <= MAX_FRAME_PIXELS


def _camera_reason(leaf: Leaf) -> str | None:
    if leaf.dtype not in (np.uint8, np.uint16):
        return (
            f"a {leaf.dtype.name} image ({leaf.describe()}): its stored "
            f"{leaf.kind.upper()} holds the values' bytes, not a picture a browser can show"
        )
    h, w = leaf.shape[0], leaf.shape[1]
    if h is not None and w is not None and h * w > MAX_FRAME_PIXELS:
        return (
            f"{h}x{w} frames ({leaf.describe()}): over the {MAX_FRAME_PIXELS:,} pixels a "
            "frame may have in the page, which decodes each frame whole"
        )
    return None


def layout(features: Features) -> Layout:
    """Sorts a dataset's leaves into cameras, plots, flags, texts and metadata."""
    cameras, plots, flags, texts, episode_fields = [], [], [], [], []
    left_out: dict[str, str] = {}
    for leaf in features.leaves:
        name = field_name(leaf)
        if not leaf.in_steps:
            if leaf.is_image:
                left_out[name] = "an episode-level image (only per-step images are shown)"
            else:
                episode_fields.append(leaf)
            continue
        if leaf.path[1:] in ((flag,) for flag in FLAGS):
            flags.append(leaf)
        elif leaf.is_image:
            reason = _camera_reason(leaf)
            if reason is None:
                cameras.append(leaf)
            else:
                left_out[name] = reason
        elif leaf.kind == features_lib.TEXT:
            if leaf.shape:
                left_out[name] = f"text of shape {leaf.describe()} (only one string per step)"
            else:
                texts.append(leaf)
        elif is_raw_image(leaf):
            cameras.append(leaf)  # a uint8 array shaped like a picture: shown as PNG
        else:
            reason = _step_reason(leaf)
            if reason is None:
                plots.append(leaf)
            else:
                left_out[name] = reason
    return Layout(
        tuple(cameras),
        tuple(plots),
        tuple(flags),
        tuple(texts),
        tuple(episode_fields),
        left_out,
        _instruction(texts, episode_fields),
    )


def _instruction(texts: list[Leaf], episode_fields: list[Leaf]) -> str | None:
    """The text field that holds the instruction: by its name, a step field first."""
    candidates = [leaf for leaf in texts] + [
        leaf
        for leaf in episode_fields
        if leaf.kind == features_lib.TEXT and not leaf.shape and leaf.path != (END_REASON,)
    ]
    for word in _INSTRUCTION_WORDS:
        for leaf in candidates:
            if word in field_name(leaf).lower():
                return field_name(leaf)
    return field_name(texts[0]) if texts else None
