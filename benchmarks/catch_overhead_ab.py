"""Catch recording overhead of two or more checkouts, alternated, in wall and CPU time.

`run.py --cases catch` measures wall time, which on a shared machine moves
with whatever else runs. This runs run.py's Catch case (its env, its config,
its bare loop timed on both sides) in each checkout in turn, each in a
subprocess with that checkout first on the path, round after round, and
reports per checkout the median (and range) over rounds of the recording
overhead per env step in wall time and in the process's CPU time (every
thread's: the writer's too). CPU time moves less with the machine's load.

    python benchmarks/catch_overhead_ab.py /tmp/base /work/wt [--rounds 3]

Each checkout needs its C extensions built in place (`setup.py build_ext
--inplace`) and its own benchmarks/run.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import dataclasses, json, logging, os, shutil, sys, tempfile, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import run
import rlds_writer
logging.getLogger("rlds_writer").setLevel(logging.ERROR)
reps, episodes = int(sys.argv[2]), int(sys.argv[3])
case = dataclasses.replace(
    next(c for c in run._cases(False) if c.name == "catch"), episodes=episodes
)
work = tempfile.mkdtemp(prefix="rlds_catch_ab_")
run._run_ours(dataclasses.replace(case, episodes=2), os.path.join(work, "warm"))


def bare():
    cpu = time.process_time()
    wall, steps = run._run_bare(case)
    return wall, time.process_time() - cpu, steps


def ours(path):
    env = run._BenchEnv(case.make_obs, case.episode_len)
    backend = rlds_writer.TFDSBackendWriter(path, case.config(), max_episodes_per_file=1000)
    logged = rlds_writer.EnvLogger(env, backend=backend)
    cpu, start = time.process_time(), time.perf_counter()
    with logged:
        for _ in range(case.episodes):
            ts = logged.reset()
            while not ts.last():
                ts = logged.step(1)
    return time.perf_counter() - start, time.process_time() - cpu


wall, cpu = [], []
for rep in range(reps):
    w1, c1, steps = bare()
    w, c = ours(os.path.join(work, str(rep)))
    w2, c2, _ = bare()
    wall.append((w - (w1 + w2) / 2) / steps * 1e6)
    cpu.append((c - (c1 + c2) / 2) / steps * 1e6)
    shutil.rmtree(os.path.join(work, str(rep)))
shutil.rmtree(work)
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def _measure(checkout: str, reps: int, episodes: int) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=checkout, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, checkout, str(reps), str(episodes)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd="/",  # never the current directory's package first on the path
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=11, help="recordings per round")
    parser.add_argument("--episodes", type=int, default=1000, help="100-step episodes each")
    args = parser.parse_args()
    found: dict[str, dict[str, list[float]]] = {c: {"wall": [], "cpu": []} for c in args.checkouts}
    for round_ in range(args.rounds):
        for checkout in args.checkouts:
            load = os.getloadavg()[0]
            got = _measure(os.path.abspath(checkout), args.reps, args.episodes)
            medians = {k: statistics.median(v) for k, v in got.items()}
            for k, v in medians.items():
                found[checkout][k].append(v)
            print(
                f"round {round_ + 1} {checkout}: load {load:.1f}, overhead "
                f"wall {medians['wall']:.3f} cpu {medians['cpu']:.3f} us/step",
                flush=True,
            )
    print("\n| checkout | wall overhead (us/step) | CPU overhead (us/step) |")
    print("|---|---|---|")
    for checkout, got in found.items():
        cells = [
            f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
            for v in (got["wall"], got["cpu"])
        ]
        print(f"| {checkout} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
