"""Benchmark: camera frames of batched envs, per frame, against the codec alone and one env.

N sub-envs (default 64) each return an 84x84x3 uint8 frame per step (a smooth
synthetic scene with moving blocks: compressible like a render, unlike noise),
the batches prepared beforehand so the env costs nothing. For each image
encoding (`png`, `jpeg`, `bytes`):

* `codec`: the encoder's own CPU time per frame (`encode_png`/`encode_jpeg`
  on one thread; for `bytes`, the frame's copy);
* `batched`: `BatchRecorder` (what `RecordRLDSVector`, `RecordRLDSEnvPool`
  and `RolloutRecorder` record on) over the N sub-envs, from its creation to
  `close()` returned: wall and process CPU (every thread) per frame;
* `single`: `RecordRLDS` over one env returning the same frames, per frame.

Episodes end every 60-180 steps (per sub-env). Variants are interleaved per
repetition; medians are reported.

Usage: `python benchmarks/batched_cameras.py [--num-envs 64] [--steps 150]
[--repetitions 3] [--memory-steps 600] [--report [PATH]]` (also `batched_envs.py --cameras`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report_sections import add_report_argument, write_section  # noqa: E402

SECTION = "## Batched envs: cameras"
SHAPE = (84, 84, 3)
ENCODINGS = ("png", "jpeg", "bytes")
_BANK = 16  # distinct batches, cycled


def _frames(num_envs: int):
    """`_BANK` batches `[N, 84, 84, 3]` of a smooth scene with moving blocks."""
    import numpy as np

    rng = np.random.default_rng(0)
    h, w, _ = SHAPE
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 3, y * 3, (x + y) * 1.5], -1).astype(np.float32)
    bank = np.empty((_BANK, num_envs, *SHAPE), np.uint8)
    for b in range(_BANK):
        for i in range(num_envs):
            frame = base + rng.normal(0, 4, SHAPE)  # sensor noise
            for _ in range(3):
                cy, cx = rng.integers(0, h - 16), rng.integers(0, w - 16)
                frame[cy : cy + 16, cx : cx + 16] = rng.integers(0, 256, 3)
            bank[b, i] = np.clip(frame, 0, 255)
    return bank


def _lengths(num_envs: int):
    import numpy as np

    return np.random.default_rng(1).integers(60, 181, num_envs)


def _config(encoding: str):
    import gymnasium as gym
    import numpy as np

    from rlds_writer.record import spaces

    return spaces.spaces_config(
        gym.spaces.Box(0, 255, SHAPE, np.uint8),
        gym.spaces.Box(-1, 1, (2,), np.float32),
        "cams",
        image_encoding=encoding,
    )


def _batched(encoding: str, bank, steps: int, workdir: str) -> None:
    import numpy as np

    from rlds_writer.record.batch import BatchRecorder

    n = bank.shape[1]
    lengths = _lengths(n)
    age = np.zeros(n, np.int64)
    actions = np.zeros((n, 2), np.float32)
    rewards = np.ones(n, np.float32)
    rec = BatchRecorder(os.path.join(workdir, "b"), _config(encoding), n)
    rec.begin(bank[0])
    for t in range(steps):
        obs = bank[(t + 1) % _BANK]
        rec.add(actions, rewards, None, obs)
        age += 1
        done = age >= lengths
        if done.any():
            rec.end(done, True)
            rec.begin(obs, mask=done)
            age[done] = 0
    rec.close()


def _single(encoding: str, bank, steps: int, workdir: str) -> None:
    import gymnasium as gym
    import numpy as np

    from rlds_writer import RecordRLDS

    length = int(_lengths(1)[0])

    class Frames(gym.Env):
        observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return bank[0, 0], {}

        def step(self, action):
            self.t += 1
            frame = bank[self.t % _BANK, self.t % bank.shape[1]]
            return frame, 1.0, self.t >= length, False, {}

    env = RecordRLDS(Frames(), os.path.join(workdir, "s"), image_encoding=encoding)
    env.reset()
    action = np.zeros(2, np.float32)
    for _ in range(steps):
        _, _, done, _, _ = env.step(action)
        if done:
            env.reset()
    env.close()


def _codec_seconds(encoding: str, bank) -> float:
    """CPU seconds per frame of the codec alone, on this thread."""
    import numpy as np

    from rlds_writer.store.images.image_codecs import encode_jpeg, encode_png

    frames = bank.reshape(-1, *SHAPE)[:512]
    encode = {
        "png": encode_png,
        "jpeg": encode_jpeg,
        "bytes": lambda f: np.array(f, copy=True).tobytes(),
    }[encoding]
    for f in frames[:16]:
        encode(f)
    started = time.thread_time()
    for f in frames:
        encode(f)
    return (time.thread_time() - started) / len(frames)


_PEAK = """
import os, sys, tempfile
sys.path.insert(0, {here!r})
import batched_cameras as bc
bank = bc._frames({n})
bc._batched({encoding!r}, bank, {steps}, tempfile.mkdtemp())
print([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
"""


def _peak_mib(encoding: str, n: int, steps: int) -> float:
    """Peak resident memory of a process making the frames and recording `steps` steps."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    code = _PEAK.format(here=here, n=n, encoding=encoding, steps=steps)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1]) / 1024


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run(args: argparse.Namespace) -> str:
    """Runs the case; returns the report section."""
    load = os.getloadavg()[0]
    bank = _frames(args.num_envs)
    n, steps = args.num_envs, args.steps
    single_steps = n * steps // 4  # a quarter of the frames: one env is slower
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    workdir = tempfile.mkdtemp(prefix="rlds_cams_")
    try:
        for encoding in ENCODINGS:  # warm-up: imports, thread and codec start-up
            _batched(encoding, bank, 5, workdir)
            _single(encoding, bank, 5, workdir)
            shutil.rmtree(workdir)
            os.makedirs(workdir)
        for _ in range(args.repetitions):
            for encoding in ENCODINGS:
                for variant, fn, calls, frames in (
                    ("batched", _batched, steps, n * steps),
                    ("single", _single, single_steps, single_steps),
                ):
                    wall, cpu = _timed(lambda: fn(encoding, bank, calls, workdir))  # noqa: B023
                    results.setdefault((encoding, variant), []).append(
                        (wall / frames, cpu / frames)
                    )
                    shutil.rmtree(workdir)
                    os.makedirs(workdir)
        codec = {e: _codec_seconds(e, bank) for e in ENCODINGS}
        peak = {e: _peak_mib(e, n, args.memory_steps) - _peak_mib(e, n, 1) for e in ENCODINGS}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def us(x: float) -> str:
        return f"{x * 1e6:.0f}" if x >= 1e-5 else f"{x * 1e6:.1f}"

    def med(key: tuple[str, str], k: int) -> float:
        return statistics.median(r[k] for r in results[key])

    def rng(key: tuple[str, str], k: int) -> str:
        values = [r[k] for r in results[key]]
        return f"{us(min(values))}-{us(max(values))}"

    command = " ".join(["python benchmarks/" + os.path.basename(sys.argv[0]), *sys.argv[1:]])
    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on "
        f"{os.cpu_count()} cores, on a machine shared with other work at the time (load "
        f"average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end: figures are "
        f"noisy, wall most). N = {n} sub-envs of 84x84x3 uint8 frames, {steps} vector steps "
        f"({n * steps} frames) recorded by `BatchRecorder` from its creation to `close()`; "
        f"one env recorded by `RecordRLDS` for {single_steps} frames; codec = the encoder's "
        "CPU per frame on one thread (for bytes: the frame's copy). Per frame, medians of "
        f"{args.repetitions} interleaved repetitions (range after the median), in µs; CPU "
        "counts every thread of the process. Peak MiB: the peak resident memory "
        "(VmHWM) of a process recording the N sub-envs for the steps given, less that of "
        "the same process recording one step (imports, threads, the frames made).",
        "",
        "| encoding | codec CPU | batched wall | batched CPU | batched CPU / codec "
        f"| single-env wall | single-env CPU | batched peak MiB ({args.memory_steps} steps) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in ENCODINGS:
        b, s = (e, "batched"), (e, "single")
        lines.append(
            f"| {e} | {us(codec[e])} | {us(med(b, 0))} ({rng(b, 0)}) | {us(med(b, 1))} "
            f"({rng(b, 1)}) | {med(b, 1) / codec[e]:.2f}x | {us(med(s, 0))} ({rng(s, 0)}) "
            f"| {us(med(s, 1))} ({rng(s, 1)}) | +{peak[e]:.0f} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--memory-steps", type=int, default=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    add_report_argument(parser)
    args = parser.parse_args()
    text = run(args)
    if args.report:
        write_section(args.report, SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
