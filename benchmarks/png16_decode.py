"""Benchmark: decoding one 256x256x3 uint16 PNG without TensorFlow (read/png.py).

PNGs written by `tf.io.encode_png` (what TFDS stores for `Image(dtype=uint16)`;
libpng picks a filter per row, so Average and Paeth rows occur) and by our own
encoder (`store.images.image_codecs.encode_png`, every row "Up"), of a random and of a
smooth image. Reports the best of `--repetitions` decodes in ms, ours against
`tf.io.decode_png(..., dtype=tf.uint16)`; checks both give the same pixels.

Usage: `python benchmarks/png16_decode.py [--repetitions 20] [--report [PATH]]`;
with `--report` the table is written into benchmarks/REPORT.md (its own
section, replaced on each run) or PATH.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from report_sections import add_report_argument, write_section  # noqa: E402

SECTION = "## 16-bit PNG decoding (TF-free reader)"


def _best_ms(fn: Callable[[], object], repetitions: int) -> float:
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    import tensorflow as tf

    from rlds_writer.read import png
    from rlds_writer.store.images.image_codecs import encode_png

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=20)
    add_report_argument(parser)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ramp = np.add.outer(np.arange(256), np.arange(256)) * 100
    images = {
        "random": rng.integers(0, 65536, (256, 256, 3), dtype=np.uint16),
        "smooth": (
            np.stack([ramp, ramp // 2, 65535 - ramp], -1) + rng.integers(0, 16, (256, 256, 3))
        )
        .clip(0, 65535)
        .astype(np.uint16),
    }
    lines = [
        SECTION,
        "",
        "One 256x256x3 uint16 image, best of "
        f"{args.repetitions} decodes (`python benchmarks/png16_decode.py`).",
        "",
        "| image | encoded by | ours (ms) | tf.io.decode_png (ms) |",
        "|---|---|---|---|",
    ]
    for name, image in images.items():
        for encoder, data in (
            ("tf.io.encode_png", tf.io.encode_png(image).numpy()),
            ("rlds_writer", encode_png(image)),
        ):

            def ours(data: bytes = data) -> np.ndarray:
                return png.decode(png.parse(data, "image"), 3, "image")

            def theirs(data: bytes = data) -> np.ndarray:
                return tf.io.decode_png(data, channels=3, dtype=tf.uint16).numpy()

            np.testing.assert_array_equal(ours(), theirs())
            ours_ms = _best_ms(ours, args.repetitions)
            theirs_ms = _best_ms(theirs, args.repetitions)
            lines.append(f"| {name} | {encoder} | {ours_ms:.1f} | {theirs_ms:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        write_section(args.report, SECTION, text)


if __name__ == "__main__":
    main()
