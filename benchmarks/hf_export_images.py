"""Benchmark: `export --to hf` of 84x84x3 image observations, before and after, with the floor.

One RLDS dataset of Atari-sized RGB frames (`Image`, PNG as recorded) is
exported to Hugging Face `datasets` Parquet by:

* `after`: this checkout's exporter;
* `before`: the exporter of git revision `--before` (default `e3b86f6`,
  main before issue 46), taken with `git archive` into a temporary directory
  and run in the same way, in the same run;
* `floor`: a plain PNG encode (Pillow, as `datasets.Image` encodes an array)
  of the frames an export writes: two per transition (`observation` and
  `next_observation`), nothing else.

Each is run `--repetitions` times in a fresh process, interleaved; the table
gives the median, in transitions per second. Both exports are checked to
load with `datasets` and to give the same pixels.

Usage: `python benchmarks/hf_export_images.py [--transitions 2000]
[--repetitions 3] [--before REV] [--report [PATH]]`; with `--report` the
table is written into benchmarks/REPORT.md (its own section) or PATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from report_sections import add_report_argument, write_section  # noqa: E402

SECTION = "## Export to Hugging Face: 84x84x3 image observations"
ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_EPISODE = 101  # 100 transitions an episode

_EXPORT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import datasets, datasets.arrow_writer, tqdm  # imported inside the export: not timed
import rlds_writer.interop.export as export
start = time.perf_counter()
report = export.export_hf(sys.argv[2], sys.argv[3])
print(time.perf_counter() - start, report.transitions)
"""

_FLOOR = """
import io, sys, time
import numpy as np
from PIL import Image
sys.path.insert(0, sys.argv[1])
import rlds_writer
frames = []
for episode in rlds_writer.open_dataset(sys.argv[2]).episodes("train"):
    obs = episode["steps"]["observation"]
    frames.extend(obs[:-1])
    frames.extend(obs[1:])
start = time.perf_counter()
for frame in frames:
    Image.fromarray(frame).save(io.BytesIO(), format="PNG")
print(time.perf_counter() - start, len(frames) // 2)
"""


def _frames(rng, n):
    """Atari-like frames: a flat background with a few coloured blocks that move."""
    import numpy as np

    frames = np.empty((n, 84, 84, 3), np.uint8)
    base = rng.integers(0, 64, 3, dtype=np.uint8)
    blocks = rng.integers(0, 76, (6, 2))
    colours = rng.integers(64, 256, (6, 3), dtype=np.uint8)
    for i in range(n):
        frame = frames[i]
        frame[:] = base
        blocks = (blocks + rng.integers(-2, 3, blocks.shape)) % 76
        for (y, x), colour in zip(blocks, colours):
            frame[y : y + 8, x : x + 8] = colour
        frame[rng.integers(0, 84, 20), rng.integers(0, 84, 20)] = 255  # a little noise
    return frames


def _make_dataset(path: Path, transitions: int) -> None:
    import numpy as np
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers_core import EpisodeSpec, write_with_tfds

    config = rlds_base.DatasetConfig(
        name="atari_like",
        observation_info=tfds.features.Image(shape=(84, 84, 3), dtype=np.uint8),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
    )
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(max(1, transitions // (STEPS_PER_EPISODE - 1))):
        n = STEPS_PER_EPISODE
        episodes.append(
            EpisodeSpec(
                observations=list(_frames(rng, n)),
                actions=[np.int64(a) for a in rng.integers(0, 4, n - 1)],
                rewards=[np.float32(r) for r in rng.random(n - 1)],
                discounts=[np.float32(1.0)] * (n - 1),
            )
        )
    write_with_tfds(path, config, episodes)


def _run(code: str, *args: str) -> tuple[float, int]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    seconds, transitions = out.stdout.split()[-2:]
    return float(seconds), int(transitions)


def _same_pixels(a: Path, b: Path, cache: Path) -> None:
    import datasets
    import numpy as np

    left = datasets.load_dataset(str(a), cache_dir=str(cache / "a"))["train"]
    right = datasets.load_dataset(str(b), cache_dir=str(cache / "b"))["train"]
    assert len(left) == len(right)
    for i in range(0, len(left), max(1, len(left) // 50)):
        for key in ("observation", "next_observation"):
            np.testing.assert_array_equal(np.asarray(left[i][key]), np.asarray(right[i][key]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=2000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--before", default="e3b86f6")
    add_report_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        before = tmp / "before"
        before.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.before, "rlds_writer"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        _make_dataset(tmp / "rlds", args.transitions)
        runs: dict[str, list[float]] = {"before": [], "after": [], "floor": []}
        count = {}
        for rep in range(args.repetitions):
            for name, code, root in (
                ("before", _EXPORT, before),
                ("after", _EXPORT, ROOT),
                ("floor", _FLOOR, ROOT),
            ):
                dest = tmp / f"{name}-{rep}"
                seconds, count[name] = _run(code, str(root), str(tmp / "rlds"), str(dest))
                runs[name].append(count[name] / seconds)
        assert count["before"] == count["after"] == count["floor"], count
        _same_pixels(tmp / "before-0", tmp / "after-0", tmp / "cache")
    median = {k: statistics.median(v) for k, v in runs.items()}
    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python "
        f"benchmarks/hf_export_images.py --transitions {args.transitions} --repetitions "
        f"{args.repetitions} --before {args.before} --report` on {os.cpu_count()} cores "
        "(shared with other work at the time: noisy). One dataset written by TFDS's own "
        f"`SequentialWriter`: {count['after']:,} transitions of 84x84x3 uint8 `Image` "
        "observations (PNG), 100 a episode. Median of the repetitions, each in a fresh "
        "process (imports not timed), interleaved; the floor is Pillow's PNG encode of the "
        "two frames each transition row holds (`observation`, `next_observation`), what "
        "`datasets.Image` does with an array. Both exports load with `datasets` with the "
        "same pixels.",
        "",
        "| run | transitions/s | vs floor |",
        "|---|---|---|",
    ]
    labels = {
        "before": f"export, before (`{args.before}`: frames decoded, re-encoded via lists)",
        "after": "export, after (stored PNG bytes handed on)",
        "floor": "floor: PNG encode of 2 frames per transition",
    }
    for name in ("before", "after", "floor"):
        ratio = median[name] / median["floor"]
        lines.append(f"| {labels[name]} | {median[name]:,.0f} | {ratio:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        write_section(args.report, SECTION, text)


if __name__ == "__main__":
    main()
