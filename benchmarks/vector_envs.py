"""Benchmark: recording a Gymnasium vector env (`RecordRLDSVector`) against its bare loop.

A Catch-like env (float32 (10, 5) observations cycling through 16 precomputed
ones, a discrete action, 100-step episodes) in a `SyncVectorEnv` of 1 and 8
sub-envs, in both autoreset modes, stepped with a fixed action. Each
repetition times the bare vector loop, then the same loop recorded (create to
`close()` returned, so the fixed cost counts), in one process, variants
interleaved. Reported: µs per vector step, and the median of the
per-repetition ratios recorded / bare.

Usage: `python benchmarks/vector_envs.py [--repetitions 7] [--steps 10000] [--report [PATH]]`.
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

SECTION = "## Vector envs"
EPISODE_STEPS = 100


def _catch_env():
    import gymnasium as gym
    import numpy as np

    rng = np.random.default_rng(0)
    observations = [rng.random((10, 5), dtype=np.float32) for _ in range(16)]

    class Catch(gym.Env):
        observation_space = gym.spaces.Box(0.0, 1.0, (10, 5), np.float32)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return observations[0], {}

        def step(self, action):
            self.t += 1
            return observations[self.t % 16], 1.0, False, self.t >= EPISODE_STEPS, {}

    return Catch()


def _vector_env(num_envs: int, mode: str):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    return SyncVectorEnv([_catch_env] * num_envs, autoreset_mode=AutoresetMode(mode))


def _loop(env, num_envs: int, steps: int) -> None:
    import numpy as np

    actions = np.ones(num_envs, np.int64)
    env.reset(seed=0)
    for _ in range(steps):
        env.step(actions)


def _bare(num_envs: int, mode: str, steps: int) -> float:
    env = _vector_env(num_envs, mode)
    start = time.perf_counter()
    _loop(env, num_envs, steps)
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed


def _recorded(num_envs: int, mode: str, steps: int, path: str) -> float:
    from rlds_writer import RecordRLDSVector

    env = _vector_env(num_envs, mode)
    start = time.perf_counter()
    recorded = RecordRLDSVector(env, path, name="vector")
    _loop(recorded, num_envs, steps)
    recorded.close()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10000, help="vector steps per run")
    add_report_argument(parser)
    args = parser.parse_args()

    cases = [(n, mode) for n in (1, 8) for mode in ("NextStep", "SameStep")]
    times: dict[tuple[int, str], dict[str, list[float]]] = {
        case: {"bare": [], "recorded": []} for case in cases
    }
    workdir = tempfile.mkdtemp(prefix="rlds_vector_")
    try:
        for case in cases:  # warm-up: imports and first-use costs land on no variant
            _bare(*case, steps=10)
            _recorded(*case, steps=10, path=os.path.join(workdir, "warm"))
            shutil.rmtree(os.path.join(workdir, "warm"))
        for _ in range(args.repetitions):
            for case in cases:
                path = os.path.join(workdir, "run")
                times[case]["bare"].append(_bare(*case, steps=args.steps))
                times[case]["recorded"].append(_recorded(*case, steps=args.steps, path=path))
                shutil.rmtree(path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    import platform

    command = " ".join(["python benchmarks/vector_envs.py", *sys.argv[1:]])
    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. "
        f"A Catch-like env ({EPISODE_STEPS}-step episodes) in a `SyncVectorEnv`, "
        f"{args.steps} vector steps per run, medians of {args.repetitions} interleaved "
        "repetitions; recorded runs from `RecordRLDSVector`'s creation to `close()` returned.",
        "",
        "| sub-envs | autoreset | bare µs/vector step | recorded µs/vector step "
        "| recording µs per sub-env step | recorded / bare |",
        "|---|---|---|---|---|---|",
    ]
    for num_envs, mode in cases:
        bare, recorded = times[(num_envs, mode)]["bare"], times[(num_envs, mode)]["recorded"]
        ratio = statistics.median(r / b for r, b in zip(recorded, bare))
        bare_us = statistics.median(bare) / args.steps * 1e6
        rec_us = statistics.median(recorded) / args.steps * 1e6
        lines.append(
            f"| {num_envs} | {mode} | {bare_us:.1f} | {rec_us:.1f} "
            f"| {(rec_us - bare_us) / num_envs:.2f} | {ratio:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    if args.report:
        write_section(args.report, SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
