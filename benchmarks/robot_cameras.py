"""Benchmark: recording two 256x256x3 cameras (robot data) as PNG, JPEG and bytes.

For each image encoding, records `--episodes` episodes of `--steps` steps of
an env with two RGB cameras through `RecordRLDS`, and reports:

* **env thread µs/step**: median time of `step()` with recording minus the
  bare env's (what the control loop pays per step; encoding runs elsewhere);
* **steps/s to disk**: steps divided by the wall time from the first reset to
  `close()` returning (everything encoded and on disk);
* **bytes/step**: shard bytes on disk per step;
* **reset() p50 / p99 ms**: latency of the `reset()` that ends an episode
  (the episode is handed to the writer there; earlier episodes are flushed
  first, as a real-time loop slower than the disk would find them);
* **image workers 1 -> 2**: speed-up of steps/s to disk from a second
  encoding thread (PNG and JPEG);
* **encoder alone**: frames/s of the recorder's episode encoder on one
  episode's frames, with no env and no writer: on the calling thread (the
  single-threaded encoder) and with 1 and 2 image workers;
* **machine scaling**: how much faster 2 independent processes run the
  codec than 1, the most a second worker could give on this machine.

Usage: `python benchmarks/robot_cameras.py [--steps 1000] [--episodes 3] [--report [PATH]]`;
with `--report` the table is written into benchmarks/REPORT.md (its own
section, replaced on each run) or PATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from report_sections import add_report_argument, write_section  # noqa: E402

SECTION = "## Robot cameras"


class TwoCameras(gym.Env):
    """Two 256x256x3 uint8 cameras showing a moving gradient with a little noise."""

    def __init__(self, steps: int):
        self.horizon = steps
        box = gym.spaces.Box(0, 255, (256, 256, 3), np.uint8)
        self.observation_space = gym.spaces.Dict({"image": box, "wrist_image": box})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        rng = np.random.default_rng(0)
        ramp = np.add.outer(np.arange(256), np.arange(256)) // 2
        base = np.stack([ramp, ramp.T, np.full_like(ramp, 128)], axis=-1)
        # Real camera frames compress like this: smooth shapes plus sensor noise.
        self.frames = [
            ((base + 8 * i + rng.integers(0, 6, base.shape)) % 256).astype(np.uint8)
            for i in range(16)
        ]

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            "image": self.frames[self.t % 16],
            "wrist_image": self.frames[(self.t + 5) % 16],
        }

    def reset(self, *, seed: int | None = None, options: Any = None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= self.horizon, {}


def _run(env: Any, episodes: int, action: np.ndarray) -> tuple[list[float], list[float]]:
    step_times, reset_times = [], []
    env.reset(seed=0)
    for episode in range(episodes):
        done = False
        while not done:
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            step_times.append(time.perf_counter() - start)
            done = terminated or truncated
        start = time.perf_counter()
        if episode < episodes - 1:
            env.reset()
            reset_times.append(time.perf_counter() - start)
    return step_times, reset_times


def measure(encoding: str, workers: int, steps: int, episodes: int) -> dict[str, float]:
    from rlds_writer import RecordRLDS

    action = np.zeros(7, np.float32)
    bare, _ = _run(TwoCameras(steps), episodes, action)
    with tempfile.TemporaryDirectory() as tmp:
        env = RecordRLDS(
            TwoCameras(steps),
            os.path.join(tmp, "ds"),
            name="cameras",
            image_encoding=encoding,
            image_workers=workers,
        )
        start = time.perf_counter()
        # The recorder's own ending: each episode's last step ends it.
        ours, _ = _run(env, episodes, action)
        env.close()
        wall = time.perf_counter() - start
        # reset() after a finished episode: measure the hand-over separately.
        env2 = RecordRLDS(
            TwoCameras(steps),
            os.path.join(tmp, "ds2"),
            name="cameras",
            image_encoding=encoding,
            image_workers=workers,
        )
        resets = _reset_latencies(env2, episodes + 2, min(steps, 200), action)
        env2.close()
        size = sum(
            os.path.getsize(os.path.join(tmp, "ds", f))
            for f in os.listdir(os.path.join(tmp, "ds"))
            if ".tfrecord-" in f
        )
    n = steps * episodes
    # Steps that do not end an episode (the ending one may wait for a full queue).
    inner = [t for i, t in enumerate(ours) if (i + 1) % steps]
    return {
        "env_us": (statistics.median(ours) - statistics.median(bare)) * 1e6,
        "step_p99_ms": float(np.percentile(inner, 99)) * 1e3,
        "steps_per_s": n / wall,
        "bytes_per_step": size / n,
        "reset_p50_ms": float(np.percentile(resets, 50)) * 1e3,
        "reset_p99_ms": float(np.percentile(resets, 99)) * 1e3,
    }


def _reset_latencies(env: Any, episodes: int, steps: int, action: np.ndarray) -> list[float]:
    """Latency of the reset() that hands a finished episode to an idle writer.

    A real-time loop is slower than the disk; here the loop is not, so the
    previous episodes are flushed first: what is timed is the hand-over, not
    the back-pressure of a full queue (which bounds memory by design).
    """
    out = []
    env.reset(seed=0)
    for _ in range(episodes):
        for _ in range(steps):
            env.step(action)
        env.flush()
        start = time.perf_counter()
        env.reset()
        out.append(time.perf_counter() - start)
    return out


def png_levels() -> list[tuple[int, float, float]]:
    """(zlib level, ms per frame, bytes per frame) of our PNG encoder on the camera frames."""
    from rlds_writer.store.images.image_codecs import encode_png

    frames = TwoCameras(1).frames
    out = []
    for level in (1, 4, 6):
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            sizes = [len(encode_png(f, level)) for f in frames]
            best = min(best, (time.perf_counter() - start) / len(frames))
        out.append((level, best * 1e3, statistics.mean(sizes)))
    return out


def encoder_alone(
    encoding: str, steps: int, workers: tuple[int, ...] = (0, 1, 2), repeats: int = 5
) -> dict[int, float]:
    """Frames/s of `EpisodeEncoder` on one episode of both cameras, per worker count.

    `0` workers encodes on the calling thread: the single-threaded encoder.
    The frames sit in shared memory, as the recorder's image columns keep
    them. The worker counts take turns within each repeat (the VM's speed
    drifts), and each keeps its best time.
    """
    import tensorflow_datasets as tfds

    from rlds_writer.store.episodes.shared_frames import shared_empty
    from rlds_writer.store.writing.encoding import EpisodeEncoder

    camera = tfds.features.Image(shape=(256, 256, 3), encoding_format=encoding)
    features = tfds.features.FeaturesDict(
        {"steps": tfds.features.Dataset({"observation": {"image": camera, "wrist_image": camera}})}
    )
    frames = TwoCameras(steps).frames
    columns = {}
    for name, lag in (("image", 0), ("wrist_image", 5)):
        column = shared_empty((steps, 256, 256, 3), np.uint8)
        for t in range(steps):
            column[t] = frames[(t + lag) % 16]
        columns[f"steps/observation/{name}"] = column
    # The pool itself: its processes from the first episode on.
    encoders = {
        w: EpisodeEncoder(features, image_workers=w, start_workers_behind=0) for w in workers
    }
    best = dict.fromkeys(workers, float("inf"))
    try:
        for encoder in encoders.values():
            encoder.encode_parts(columns, {})  # warm-up: starts the image workers
        for _ in range(repeats):
            for w, encoder in encoders.items():
                start = time.perf_counter()
                encoder.encode_parts(columns, {})
                best[w] = min(best[w], time.perf_counter() - start)
    finally:
        for encoder in encoders.values():
            encoder.close()
    return {w: 2 * steps / t for w, t in best.items()}


def _encode_frames(encoding: str, count: int) -> float:
    from rlds_writer.store.images.image_codecs import encode_jpeg, encode_png

    encode = encode_jpeg if encoding == "jpeg" else encode_png
    frames = TwoCameras(1).frames
    start = time.perf_counter()
    for i in range(count):
        encode(frames[i % 16])
    return time.perf_counter() - start


def machine_scaling(encoding: str, count: int, repeats: int = 3) -> float:
    """How much faster 2 independent processes encode than 1: this machine's ceiling.

    Each process runs the codec alone on `count` frames (no rlds_writer
    pipeline); best of `repeats`, taking turns.
    """
    import multiprocessing

    one = two = float("inf")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.starmap(_encode_frames, [(encoding, 2)] * 2)  # warm-up
        for _ in range(repeats):
            one = min(one, _encode_frames(encoding, count) / count)
            start = time.perf_counter()
            pool.starmap(_encode_frames, [(encoding, count)] * 2)
            two = min(two, (time.perf_counter() - start) / (2 * count))
    return one / two


def report(
    rows: list[tuple[str, int, dict[str, float]]],
    steps: int,
    episodes: int,
    alone: dict[tuple[str, int], float] | None = None,
    alone_steps: int = 200,
    ceiling: dict[str, float] | None = None,
) -> str:
    lines = [
        SECTION,
        "",
        f"Generated by `python benchmarks/robot_cameras.py --steps {steps} --episodes "
        f"{episodes}`: two 256x256x3 uint8 cameras per step, {steps}-step episodes, "
        f"{os.cpu_count()} cores. Env thread µs/step is what `step()` costs with "
        "recording minus the bare env (median); step() p99 is over the steps that do "
        "not end an episode; steps/s to disk runs from the first "
        "reset to `close()` returning; reset() latency is for the reset that ends "
        "an episode (its hand-over to an idle writer).",
        "",
        "| encoding | image workers | env thread µs/step | step() p99 ms | steps/s to disk | "
        "bytes/step | reset() p50 ms | reset() p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    speed = {}
    for encoding, workers, m in rows:
        speed[encoding, workers] = m["steps_per_s"]
        lines.append(
            f"| {encoding} | {workers} | {m['env_us']:.1f} | {m['step_p99_ms']:.2f} | "
            f"{m['steps_per_s']:.0f} | "
            f"{m['bytes_per_step']:.0f} | {m['reset_p50_ms']:.2f} | {m['reset_p99_ms']:.2f} |"
        )
    lines.append("")
    lines.append(
        "PNG zlib level, one 256x256x3 camera frame on one thread (best of 5; the "
        "recorder uses level 4):"
    )
    lines.append("")
    lines.append("| zlib level | ms per frame | bytes per frame |")
    lines.append("|---|---|---|")
    for level, ms, size in png_levels():
        lines.append(f"| {level} | {ms:.2f} | {size:.0f} |")
    lines.append("")
    if alone:
        lines.append(
            f"The encoder alone: frames/s of the recorder's episode encoder on one "
            f"{alone_steps}-step episode of both cameras in shared memory, as the recorder "
            "keeps them (no env, no writer; best of 5, worker counts taking turns). "
            "0 workers encodes on the calling thread (the single-threaded encoder)."
        )
        lines.append("")
        lines.append("| encoding | image workers | frames/s | vs single-threaded |")
        lines.append("|---|---|---|---|")
        for (encoding, workers), fps in sorted(alone.items()):
            lines.append(
                f"| {encoding} | {workers} | {fps:.0f} | {fps / alone[encoding, 0]:.2f}x |"
            )
        lines.append("")
    if ceiling:
        lines.append(
            "This machine's own ceiling, measured in the same run: 2 independent processes "
            "running the codec alone encode "
            + ", ".join(f"{x:.2f}x ({e})" for e, x in ceiling.items())
            + " the frames/s of 1."
        )
        lines.append("")
    for encoding in ("png", "jpeg"):
        if (encoding, 1) in speed and (encoding, 2) in speed:
            line = (
                f"- {encoding}: 2 image workers write "
                f"{speed[encoding, 2] / speed[encoding, 1]:.2f}x the steps/s of 1"
            )
            if alone and (encoding, 0) in alone:
                line += (
                    f"; the whole pipeline with 2 workers encodes "
                    f"{2 * speed[encoding, 2] / alone[encoding, 0]:.2f}x the frames/s of the "
                    f"single-threaded encoder, the encoder alone "
                    f"{alone[encoding, 2] / alone[encoding, 0]:.2f}x"
                )
            lines.append(line + ".")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=3)
    add_report_argument(parser)
    args = parser.parse_args()
    rows = []
    for encoding, workers in (("png", 1), ("png", 2), ("jpeg", 1), ("jpeg", 2), ("bytes", 2)):
        m = measure(encoding, workers, args.steps, args.episodes)
        rows.append((encoding, workers, m))
        print(encoding, workers, {k: round(v, 2) for k, v in m.items()}, file=sys.stderr)
    alone_steps = min(args.steps, 200)
    alone = {
        (encoding, workers): fps
        for encoding in ("png", "jpeg")
        for workers, fps in encoder_alone(encoding, alone_steps).items()
    }
    print("encoder alone", alone, file=sys.stderr)
    ceiling = {"png": machine_scaling("png", 60), "jpeg": machine_scaling("jpeg", 600)}
    print("machine scaling", ceiling, file=sys.stderr)
    text = report(rows, args.steps, args.episodes, alone, alone_steps, ceiling)
    print(text)
    if args.report:
        write_section(args.report, SECTION, text)


if __name__ == "__main__":
    main()
