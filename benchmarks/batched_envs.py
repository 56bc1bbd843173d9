"""Benchmark: recording batched envs, per sub-env step, against the bare env and the peers.

Gymnasium's native vector CartPole (`gym.make_vec("CartPole-v1", num_envs=N,
vectorization_mode="vector_entry_point")`) stepped with fixed random actions,
in one process, variants interleaved per repetition over the same batches:

* `bare`: the env alone;
* `RecordRLDSVector`: recorded as RLDS episodes (creation to `close()`
  returned: the fixed cost counts);
* `TorchRL`: `ReplayBuffer(storage=LazyMemmapStorage(...)).extend` of a
  `TensorDict` of the step per step (what a torch user would pick; it does not
  cut episodes);
* `plain write`: each batch's arrays written to a file as they are (the floor).

Reported: overhead per sub-env step over `bare`, wall and CPU (the process's,
every thread). Every variant is measured alike: each is run once first (its
imports and first-use costs land on none), its env made and its actions
drawn inside its timed run; before each timed run the garbage of the others
is collected, untimed, and the objects of the imports (torch's are 400,000)
are frozen out of the collector, whose first full pass (0.6 s with torch
loaded) would otherwise land on whichever variant runs then; the variants
run in a rotated order, so none always follows the same one.

Then EnvPool's CartPole and MuJoCo Hopper (`RecordRLDSEnvPool`) at N = 64
and 256, as a fraction of the env's own step, and the peak memory (max RSS)
of an N = 4096 CartPole recording of 1000 steps against the bare env's.

Usage: `python benchmarks/batched_envs.py [--repetitions 3] [--sub-env-steps 200000]
[--sizes 1 16 ...] [--skip-envpool] [--report [PATH]]`; `--cameras` runs the camera
case instead (`batched_cameras.py`: N sub-envs of 84x84 PNG/JPEG/bytes frames).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report_sections import add_report_argument, write_section  # noqa: E402

SECTION = "## Batched envs"
SIZES = (1, 16, 256, 1024, 4096)


def _steps_for(num_envs: int, sub_env_steps: int) -> int:
    return max(100, min(5000, sub_env_steps // num_envs))


def _cartpole(num_envs: int):
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")


def _actions(num_envs: int):
    import numpy as np

    return np.random.default_rng(0).integers(0, 2, (64, num_envs))


def _timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _bare(num_envs: int, steps: int, workdir: str) -> None:
    env, actions = _cartpole(num_envs), _actions(num_envs)
    env.reset(seed=0)
    for t in range(steps):
        env.step(actions[t % 64])


def _recorded(num_envs: int, steps: int, workdir: str) -> None:
    from rlds_writer import RecordRLDSVector

    actions = _actions(num_envs)
    env = RecordRLDSVector(_cartpole(num_envs), os.path.join(workdir, "rlds"), name="cartpole")
    env.reset(seed=0)
    for t in range(steps):
        env.step(actions[t % 64])
    env.close()


def _torchrl(num_envs: int, steps: int, workdir: str) -> None:
    import logging

    import torch
    from tensordict import TensorDict

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    env, actions = _cartpole(num_envs), _actions(num_envs)
    storage = LazyMemmapStorage(steps * num_envs, scratch_dir=os.path.join(workdir, "torchrl"))
    buffer = ReplayBuffer(storage=storage)
    obs, _ = env.reset(seed=0)
    for t in range(steps):
        action = actions[t % 64]
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.extend(
            TensorDict(
                {
                    "observation": torch.from_numpy(obs),
                    "action": torch.from_numpy(action),
                    "next": TensorDict(
                        {
                            "observation": torch.from_numpy(next_obs),
                            "reward": torch.from_numpy(reward),
                            "terminated": torch.from_numpy(terminated),
                            "truncated": torch.from_numpy(truncated),
                        },
                        batch_size=[num_envs],
                    ),
                },
                batch_size=[num_envs],
            )
        )
        obs = next_obs


def _plain_write(num_envs: int, steps: int, workdir: str) -> None:
    import numpy as np

    env, actions = _cartpole(num_envs), _actions(num_envs)
    obs, _ = env.reset(seed=0)
    with open(os.path.join(workdir, "plain.bin"), "wb") as f:
        f.write(np.ascontiguousarray(obs))
        for t in range(steps):
            action = actions[t % 64]
            obs, reward, terminated, truncated, _ = env.step(action)
            for array in (action, reward, terminated, truncated, obs):
                f.write(np.ascontiguousarray(array))  # CartPole's obs is a transposed view


VARIANTS = {
    "bare": _bare,
    "RecordRLDSVector": _recorded,
    "TorchRL": _torchrl,
    "plain write": _plain_write,
}


def _envpool_case(task: str, num_envs: int, steps: int, workdir: str) -> tuple[float, float]:
    import envpool
    import numpy as np

    from rlds_writer.record.batch import RecordRLDSEnvPool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        space = envpool.make(task, env_type="gymnasium", num_envs=1).action_space
        rng = np.random.default_rng(0)
        if hasattr(space, "n"):
            actions = rng.integers(0, space.n, (64, num_envs)).astype(np.int32)
        else:
            actions = rng.uniform(-1, 1, (64, num_envs, *space.shape)).astype(space.dtype)

        def bare() -> None:
            env = envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=0)
            env.reset()
            for t in range(steps):
                env.step(actions[t % 64])

        def recorded() -> None:
            env = envpool.make(task, env_type="gymnasium", num_envs=num_envs, seed=0)
            env = RecordRLDSEnvPool(env, os.path.join(workdir, "envpool"), name="envpool")
            env.reset()
            for t in range(steps):
                env.step(actions[t % 64])
            env.close()
            shutil.rmtree(os.path.join(workdir, "envpool"))

        return _timed(bare)[0], _timed(recorded)[0]


_PEAK = """
import sys, tempfile
sys.path.insert(0, {root!r})
import gymnasium as gym, numpy as np
n, steps, record = 4096, {steps}, {record}
env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
if record:
    from rlds_writer import RecordRLDSVector
    env = RecordRLDSVector(env, tempfile.mkdtemp() + "/ds")
actions = np.random.default_rng(0).integers(0, 2, (64, n))
env.reset(seed=0)
for t in range(steps):
    env.step(actions[t % 64])
env.close()
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec (this process would
# report its parent's peak, the benchmark's, with torch and TensorFlow loaded).
print([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])
"""


def _peak_rss_mib(record: bool, steps: int) -> float:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", _PEAK.format(root=root, record=record, steps=steps)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.split()[-1]) / 1024


MEMORY_SECTION = "## Batched envs: peak memory"


def _memory_section(args: argparse.Namespace) -> None:
    rows = []
    for steps in (250, 1000):
        bare, recorded = _peak_rss_mib(False, steps), _peak_rss_mib(True, steps)
        rows.append(f"| {steps} | {bare:.0f} | {recorded:.0f} | +{recorded - bare:.0f} |")
    command = " ".join(["python benchmarks/batched_envs.py", *sys.argv[1:]])
    text = "\n".join(
        [
            MEMORY_SECTION,
            "",
            f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` "
            "(a machine shared with other work). Peak resident memory (VmHWM) of a process "
            "stepping N = 4096 CartPole sub-envs (Gymnasium's native vector env), bare and "
            "recorded with `RecordRLDSVector`: the recorder's part is the ring (32 MiB by "
            "default), the episodes that end on one step and the writer's queue; it does not "
            "grow with the number of steps.",
            "",
            "| vector steps | bare MiB | recorded MiB | recording MiB |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    if args.report:
        write_section(args.report, MEMORY_SECTION, text + "\n")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--sub-env-steps", type=int, default=200_000)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--skip-envpool", action="store_true")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the peak memory (its own section)"
    )
    parser.add_argument(
        "--cameras",
        action="store_true",
        help="only the camera case (its own section; benchmarks/batched_cameras.py)",
    )
    parser.add_argument("--num-envs", type=int, default=64, help="--cameras: sub-envs")
    parser.add_argument("--steps", type=int, default=150, help="--cameras: vector steps")
    parser.add_argument("--memory-steps", type=int, default=600, help="--cameras: for peak memory")
    add_report_argument(parser)
    args = parser.parse_args()

    if args.memory_only:
        _memory_section(args)
        return
    if args.cameras:
        import batched_cameras

        text = batched_cameras.run(args)
        if args.report:
            write_section(args.report, batched_cameras.SECTION, text)
        print(text)
        return
    load = os.getloadavg()[0]
    times = {(n, v): [] for n in args.sizes for v in VARIANTS}
    workdir = tempfile.mkdtemp(prefix="rlds_batched_")
    try:
        for n in args.sizes:  # warm-up: imports and first-use costs land on no variant
            for fn in VARIANTS.values():
                fn(n, 10, workdir)
                shutil.rmtree(workdir)
                os.makedirs(workdir)
        gc.collect()
        gc.freeze()  # the imports' objects: no variant's run scans them
        names = list(VARIANTS)
        for repetition in range(args.repetitions):
            for n in args.sizes:
                steps = _steps_for(n, args.sub_env_steps)
                turn = (repetition + args.sizes.index(n)) % len(names)
                for variant in names[turn:] + names[:turn]:
                    fn = VARIANTS[variant]
                    gc.collect()  # untimed: no variant collects another's garbage
                    wall, cpu = _timed(lambda: fn(n, steps, workdir))  # noqa: B023
                    times[n, variant].append((wall / (steps * n), cpu / (steps * n)))
                    shutil.rmtree(workdir)
                    os.makedirs(workdir)
        envpool_rows = []
        if not args.skip_envpool:
            for task in ("CartPole-v1", "Hopper-v4"):
                for n in (64, 256):
                    runs = [_envpool_case(task, n, 1000, workdir) for _ in range(args.repetitions)]
                    bare = statistics.median(b for b, _ in runs) / (1000 * n)
                    rec = statistics.median(r for _, r in runs) / (1000 * n)
                    envpool_rows.append((task, n, bare, rec))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    import platform

    def ns(x: float) -> str:
        return f"{x * 1e9:.0f}"

    command = " ".join(["python benchmarks/batched_envs.py", *sys.argv[1:]])
    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, on a machine shared "
        f"with other work at the time (load average {load:.0f} at the start, "
        f"{os.getloadavg()[0]:.0f} at the end, on 2 cores: every figure is noisy, wall "
        "times most). Gymnasium's native "
        "vector CartPole, the same random actions for every variant, medians of "
        f"{args.repetitions} interleaved repetitions of about {args.sub_env_steps} sub-env "
        "steps each (100-5000 vector steps), each run from its env's and recorder's "
        "creation to `close()` returned, after one untimed run of every variant (imports), "
        "in a rotated order, each after an untimed garbage collection (the imports' "
        "objects frozen). Overhead = variant - bare, per sub-env step; CPU counts every "
        "thread of the process.",
        "",
        "| N | bare ns | RecordRLDSVector wall / CPU ns | TorchRL wall / CPU ns "
        "| plain write wall / CPU ns | RecordRLDSVector wall / bare |",
        "|---|---|---|---|---|---|",
    ]
    for n in args.sizes:
        bare_w = statistics.median(w for w, _ in times[n, "bare"])
        bare_c = statistics.median(c for _, c in times[n, "bare"])
        cells = []
        for variant in ("RecordRLDSVector", "TorchRL", "plain write"):
            w = statistics.median(w for w, _ in times[n, variant]) - bare_w
            c = statistics.median(c for _, c in times[n, variant]) - bare_c
            cells.append(f"{ns(w)} / {ns(c)}")
        rec_w = statistics.median(w for w, _ in times[n, "RecordRLDSVector"]) - bare_w
        lines.append(f"| {n} | {ns(bare_w)} | " + " | ".join(cells) + f" | {rec_w / bare_w:.1f}x |")
    if envpool_rows:
        lines += [
            "",
            "EnvPool (`RecordRLDSEnvPool`, sync API, 1000 vector steps, wall):",
            "",
            "| task | N | env ns per sub-env step | recorded ns | recording / env step |",
            "|---|---|---|---|---|",
        ]
        for task, n, bare, rec in envpool_rows:
            lines.append(f"| {task} | {n} | {ns(bare)} | {ns(rec)} | {(rec - bare) / bare:.2f}x |")
    text = "\n".join(lines) + "\n"
    if args.report:
        write_section(args.report, SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
