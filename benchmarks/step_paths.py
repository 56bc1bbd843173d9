"""Benchmark: does each per-step speed trick pay? (issue 24)

Times `EnvLogger` on the Catch-like env of `run.py` (float32 (10, 5)
observations, 100-step episodes) and on its dict-observation case (an image,
a state vector and step metadata), with each trick of the per-step path on
and off, variants interleaved in one process so that a loaded machine slows
them alike:

* **shipped**: as the package is (where its C step is built: EnvLogger's
  mid-episode step in C, `record/step_kernel.py`);
* **no C step**: shipped with `RLDS_WRITER_PURE_PYTHON=1`: the generated
  Python step in the closure;
* **no closure**: `EnvLogger.step` as a plain method (the closure
  `_mid_episode_step` installs at `reset()` is left out);
* **no compiled add**: the episode buffer's checked closures
  (`build_appender`) instead of the generated per-step `add`
  (`record/appender.py` `compile_step_add`);
* **neither**.

Also the bare env loop, the ratio every variant is compared with. Each
repetition records a fresh dataset (create to `close()` returned). Reported:
the median of the per-repetition ratios to the bare loop, and to shipped.

Usage: `python benchmarks/step_paths.py [--repetitions 7] [--episodes 200] [--report [PATH]]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report_sections import add_report_argument, write_section  # noqa: E402

SECTION = "## Per-step speed tricks"
VARIANTS = ("shipped", "no C step", "no closure", "no compiled add", "neither")
# Each run is timed three ways: wall clock, CPU of the whole process (the
# writer's thread included), CPU of the env thread alone (what a loaded
# machine distorts least: waiting for a core or for the GIL is not counted).
MEASURES = ("wall", "cpu", "env thread cpu")


@contextlib.contextmanager
def _variant(name: str) -> Iterator[type]:
    """Yields the `EnvLogger` class to use, with the compiled add patched out if asked."""
    import rlds_writer
    from rlds_writer.record import episode

    logger = rlds_writer.EnvLogger
    if name in ("no closure", "neither"):

        class MethodStep(rlds_writer.EnvLogger):
            # Overriding `step` keeps `reset()` from installing the closure.
            def step(self, action):
                return self._record(self._env.step(action), action)

        logger = MethodStep
    from rlds_writer.record import step_kernel

    pure = os.environ.get(step_kernel.PURE_PYTHON_ENV)
    if name == "no C step":
        os.environ[step_kernel.PURE_PYTHON_ENV] = "1"
    compiled = episode.compile_step_add
    if name in ("no compiled add", "neither"):
        # The buffer's `add` is then the checked closures' form.
        episode.compile_step_add = lambda groups, columns, buffer, checked: checked
    try:
        yield logger
    finally:
        episode.compile_step_add = compiled
        if pure is None:
            os.environ.pop(step_kernel.PURE_PYTHON_ENV, None)
        else:
            os.environ[step_kernel.PURE_PYTHON_ENV] = pure


def _bare(case) -> tuple[float, float, float]:
    from run import _BenchEnv

    env = _BenchEnv(case.make_obs, case.episode_len)
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(case.episodes):
        ts = env.reset()
        if case.step_fn:
            case.step_fn(ts, None, env)
        while not ts.last():
            ts = env.step(1)
            if case.step_fn:
                case.step_fn(ts, 1, env)
    return (
        time.perf_counter() - wall,
        time.process_time() - cpu,
        time.thread_time() - thread,
    )


def _run(case, logger_class, path: str) -> tuple[float, float, float]:
    """(wall, process CPU, env thread CPU) from create to `close()` returned."""
    from run import _BenchEnv

    import rlds_writer

    env = _BenchEnv(case.make_obs, case.episode_len)
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    backend = rlds_writer.TFDSBackendWriter(path, case.config(), max_episodes_per_file=1000)
    logged = logger_class(env, backend=backend, step_fn=case.step_fn)
    with logged:
        for _ in range(case.episodes):
            ts = logged.reset()
            while not ts.last():
                ts = logged.step(1)
    return (
        time.perf_counter() - wall,
        time.process_time() - cpu,
        time.thread_time() - thread,
    )


def measure(case_names: list[str], repetitions: int, episodes: int) -> dict:
    import dataclasses

    from run import _cases

    out = {}
    workdir = tempfile.mkdtemp(prefix="rlds_step_paths_")
    try:
        for case in _cases(quick=False):
            if case.name not in case_names:
                continue
            case = dataclasses.replace(case, episodes=episodes)
            # variant -> measure (wall, cpu, thread) -> per repetition
            times: dict[str, list[tuple[float, float, float]]] = {
                v: [] for v in ("bare", *VARIANTS)
            }
            for rep in range(repetitions + 1):  # the first is a warm-up, not kept
                row = {"bare": _bare(case)}
                order = VARIANTS if rep % 2 else tuple(reversed(VARIANTS))
                for name in order:
                    path = os.path.join(workdir, f"{case.name}_{rep}_{name}")
                    with _variant(name) as logger_class:
                        row[name] = _run(case, logger_class, path)
                    shutil.rmtree(path, ignore_errors=True)
                if rep:
                    for k, v in row.items():
                        times[k].append(v)
            steps = case.episodes * (case.episode_len - 1)
            result = {"description": case.description, "steps": steps}
            for i, measure_name in enumerate(MEASURES):
                result[measure_name] = {
                    k: {
                        "us": statistics.median(t[i] for t in v) / steps * 1e6,
                        "vs_bare": statistics.median(t[i] / b[i] for t, b in zip(v, times["bare"])),
                        "vs_shipped": statistics.median(
                            t[i] / s[i] for t, s in zip(v, times["shipped"])
                        ),
                    }
                    for k, v in times.items()
                }
            out[case.name] = result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def report(results: dict, repetitions: int, command: str) -> str:
    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on "
        f"{os.cpu_count()} cores. `EnvLogger` with each per-step trick on and off, variants "
        f"interleaved, medians of {repetitions} repetitions, create to `close()` returned, per "
        "env step: wall, CPU of the process, CPU of the env thread (least distorted by a "
        "loaded machine). Ratios are medians of the per-repetition ratios.",
        "",
        "| case | variant | µs/step wall / CPU / env thread CPU | vs bare loop | vs shipped |",
        "|---|---|---|---|---|",
    ]
    for r in results.values():
        for k in ("bare", *VARIANTS):
            cells = [r[m][k] for m in MEASURES]
            lines.append(
                f"| {r['description']} | {k} | "
                + " / ".join(f"{c['us']:.2f}" for c in cells)
                + " | "
                + " / ".join(f"{c['vs_bare']:.2f}x" for c in cells)
                + " | "
                + " / ".join(f"{c['vs_shipped']:.3f}x" for c in cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--cases", default="catch,dict_obs")
    add_report_argument(parser)
    args = parser.parse_args()
    import logging

    logging.getLogger("rlds_writer").setLevel(logging.ERROR)
    results = measure(args.cases.split(","), args.repetitions, args.episodes)
    command = "python benchmarks/step_paths.py " + " ".join(sys.argv[1:])
    text = report(results, args.repetitions, command.strip())
    if args.report:
        write_section(args.report, SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
