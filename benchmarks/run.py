"""Benchmark: rlds_writer against the previous generation's path and the I/O limit.

One run measures, on one machine and the same data:

* **bare**: the env loop alone (no recording), timed just before and just
  after ours in each repetition (the mean of the two);
* **ours**: `EnvLogger` + `TFDSBackendWriter` (columnar buffer, direct
  encoder, background shard writer);
* **baseline**: what envlogger's TFDS backend did: RLDS alignment per step in
  Python, then TFDS `FeaturesDict.encode_example` + `ExampleSerializer` inside
  `tfds.core.SequentialWriter.add_examples`, one call per episode;
* **limit**: `tf.io.TFRecordWriter` writing the same, already serialized
  records, and a plain file write of the same bytes.

Per-step overhead is `(time with recording - bare time) / steps`, median of
the repetitions. Write throughput is the dataset's record bytes divided by that
overhead time (the time recording adds to the loop), so it is comparable with
the limit's bytes / write time. Peak RSS is measured in fresh subprocesses.

Usage: `python benchmarks/run.py [--repetitions 5] [--quick] [--report [PATH]]`; the
report is printed, and with `--report` its sections (write path, memory, targets, reading)
replace the same sections of benchmarks/REPORT.md (or PATH), leaving the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import dm_env  # noqa: E402
import numpy as np  # noqa: E402
from dm_env import specs  # noqa: E402
from report_sections import write_sections  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------- envs


class _BenchEnv(dm_env.Environment):
    """A dm_env env with cheap, precomputed observations and fixed-length episodes."""

    def __init__(
        self,
        make_obs: Callable[[np.random.Generator], Any],
        episode_len: int,
        num_actions: int = 3,
        pool: int = 16,
        seed: int = 0,
    ):
        rng = np.random.default_rng(seed)
        self._pool = [make_obs(rng) for _ in range(pool)]
        self._episode_len = episode_len
        self._num_actions = num_actions
        self._t = 0
        self._obs_spec = self._spec_of(self._pool[0])

    @staticmethod
    def _spec_of(obs: Any) -> Any:
        if isinstance(obs, dict):
            return {k: _BenchEnv._spec_of(v) for k, v in obs.items()}
        return specs.Array(shape=obs.shape, dtype=obs.dtype)

    def reset(self) -> dm_env.TimeStep:
        self._t = 0
        return dm_env.restart(self._pool[0])

    def step(self, action: Any) -> dm_env.TimeStep:
        self._t += 1
        obs = self._pool[self._t % len(self._pool)]
        if self._t >= self._episode_len - 1:
            return dm_env.termination(reward=1.0, observation=obs)
        return dm_env.transition(reward=0.5, observation=obs)

    def observation_spec(self) -> Any:
        return self._obs_spec

    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(self._num_actions, dtype=np.int64)


@dataclasses.dataclass
class Case:
    name: str
    description: str
    make_obs: Callable[[np.random.Generator], Any]
    episode_len: int
    episodes: int
    config: Callable[[], Any]
    step_fn: Callable[..., Any] | None = None


def _catch_obs(rng: np.random.Generator) -> np.ndarray:
    return (rng.random((10, 5)) < 0.1).astype(np.float32)


def _image_obs(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, (84, 84, 3), dtype=np.uint8)


def _png_obs(rng: np.random.Generator) -> np.ndarray:
    # Smooth-ish content so PNG compresses like a rendered frame, not noise.
    base = np.linspace(0, 255, 84, dtype=np.float32)
    img = base[:, None, None] + base[None, :, None] * 0.5 + rng.integers(0, 8, (84, 84, 3))
    return (img % 256).astype(np.uint8)


def _dict_obs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "state": rng.standard_normal(32).astype(np.float32),
    }


def _config(name: str, observation_info: Any, step_metadata_info: Any = None) -> Any:
    import rlds_writer

    return rlds_writer.DatasetConfig(
        name=name,
        observation_info=observation_info,
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info=step_metadata_info or {},
    )


def _cases(quick: bool) -> list[Case]:
    import tensorflow_datasets as tfds

    scale = 0.25 if quick else 1.0

    def n(x: int) -> int:
        return max(2, int(x * scale))

    return [
        Case(
            "catch",
            "Catch-like: float32 obs (10,5), 100-step episodes",
            _catch_obs,
            100,
            n(200),
            lambda: _config("catch", tfds.features.Tensor(shape=(10, 5), dtype=np.float32)),
        ),
        Case(
            "image_bytes",
            "image: uint8 (84,84,3) bytes-encoded, 500-step episodes",
            _image_obs,
            500,
            n(16),
            lambda: _config(
                "image", tfds.features.Tensor(shape=(84, 84, 3), dtype=np.uint8, encoding="bytes")
            ),
        ),
        Case(
            "dict_obs",
            "dict obs: image (64,64,3) bytes + float32 state (32,) + step metadata",
            _dict_obs,
            200,
            n(20),
            lambda: _config(
                "dict",
                {
                    "image": tfds.features.Tensor(
                        shape=(64, 64, 3), dtype=np.uint8, encoding="bytes"
                    ),
                    "state": tfds.features.Tensor(shape=(32,), dtype=np.float32),
                },
                {"step_id": np.int64, "energy": np.float32},
            ),
            step_fn=lambda ts, action, env: {"step_id": 7, "energy": 0.25},
        ),
        Case(
            "png_image",
            "PNG image: Image (84,84,3), 100-step episodes",
            _png_obs,
            100,
            n(12),
            lambda: _config("png", tfds.features.Image(shape=(84, 84, 3), encoding_format="png")),
        ),
    ]


# ------------------------------------------------------------------------ methods


def _run_bare(case: Case) -> tuple[float, int]:
    env = _BenchEnv(case.make_obs, case.episode_len)
    steps = 0
    start = time.perf_counter()
    for _ in range(case.episodes):
        ts = env.reset()
        if case.step_fn:
            case.step_fn(ts, None, env)
        while not ts.last():
            ts = env.step(1)
            if case.step_fn:
                case.step_fn(ts, 1, env)
            steps += 1
    return time.perf_counter() - start, steps


def _run_ours(case: Case, path: str) -> tuple[float, float]:
    """Returns (setup seconds, loop + close seconds)."""
    import rlds_writer

    env = _BenchEnv(case.make_obs, case.episode_len)
    start = time.perf_counter()
    backend = rlds_writer.TFDSBackendWriter(path, case.config(), max_episodes_per_file=1000)
    logged = rlds_writer.EnvLogger(env, backend=backend, step_fn=case.step_fn)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    with logged:
        for _ in range(case.episodes):
            ts = logged.reset()
            while not ts.last():
                ts = logged.step(1)
    return setup, time.perf_counter() - start


def _end_latencies(case: Case, path: str) -> list[float]:
    """Latency of the step that ends each episode (its hand-over to the writer).

    A separate run, so that the timed loops above carry no clock calls. The
    writer is flushed before each ending step: a real-time loop is slower than
    the disk, while this one is not, and a full queue making a loop that
    outruns the disk wait is the memory bound working, not hand-over latency.
    """
    import rlds_writer

    env = _BenchEnv(case.make_obs, case.episode_len)
    backend = rlds_writer.TFDSBackendWriter(path, case.config(), max_episodes_per_file=1000)
    out = []
    with rlds_writer.EnvLogger(env, backend=backend, step_fn=case.step_fn) as logged:
        # At least 100 episodes, so that p99 is not just the slowest one.
        for _ in range(max(case.episodes, 100)):
            logged.reset()
            for _ in range(case.episode_len - 2):
                logged.step(1)
            logged.flush()
            start = time.perf_counter()
            ts = logged.step(1)
            out.append(time.perf_counter() - start)
            assert ts.last()
    return out


def _run_baseline(case: Case, path: str) -> tuple[float, float]:
    """envlogger's TFDS backend path: per-step Python RLDS alignment, TFDS encoder."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    env = _BenchEnv(case.make_obs, case.episode_len)
    start = time.perf_counter()
    config = case.config()
    os.makedirs(path, exist_ok=True)
    info = rlds_base.build_info(
        config,
        tfds.core.DatasetIdentity(
            name=config.name, version=tfds.core.Version("0.0.1"), data_dir=path, module_name=""
        ),
    )
    writer = tfds.core.SequentialWriter(info, max_examples_per_shard=1000)
    writer.initialize_splits(["train"])
    step_features = info.features["steps"].feature
    zeros = {k: tfds_zero(step_features[k]) for k in ("action", "reward", "discount")}
    setup = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(case.episodes):
        ts = env.reset()
        steps: list[dict[str, Any]] = []
        pending = {
            "observation": ts.observation,
            "is_first": True,
            **(case.step_fn(ts, None, env) if case.step_fn else {}),
        }
        while True:
            action = 1
            ts = env.step(action)
            pending.update(
                action=action,
                reward=ts.reward,
                discount=ts.discount,
                is_last=False,
                is_terminal=False,
            )
            pending.setdefault("is_first", False)
            steps.append(pending)
            pending = {
                "observation": ts.observation,
                "is_first": False,
                **(case.step_fn(ts, action, env) if case.step_fn else {}),
            }
            if ts.last():
                pending.update(zeros, is_last=True, is_terminal=ts.discount == 0)
                steps.append(pending)
                break
        writer.add_examples({"train": [{"steps": steps}]})
    writer.close_all()
    return setup, time.perf_counter() - start


def tfds_zero(feature: Any) -> Any:
    info = feature.get_tensor_info()
    return np.zeros(info.shape, dtype=info.np_dtype)


def _dataset_records(path: str) -> list[bytes]:
    from rlds_writer.store.formats.tfrecord import tfrecord

    records = []
    for name in sorted(os.listdir(path)):
        if ".tfrecord-" in name:
            with open(os.path.join(path, name), "rb") as f:
                records.extend(data for _, data in tfrecord.iter_records(f, name))
    return records


_PLAIN_PIECE = 1 << 20


def _run_limit(records: list[bytes], path: str) -> tuple[float, float]:
    import tensorflow as tf

    os.makedirs(path, exist_ok=True)
    start = time.perf_counter()
    with tf.io.TFRecordWriter(os.path.join(path, "limit.tfrecord")) as w:
        for r in records:
            w.write(r)
    tf_time = time.perf_counter() - start
    blob_path = os.path.join(path, "plain.bin")
    start = time.perf_counter()
    with open(blob_path, "wb", buffering=0) as f:
        # In pieces of at most 1 MiB, as rlds_writer writes a large record:
        # on this VM one multi-MB write took up to 6x as long, and varied
        # from run to run (benchmarks/REPORT.md), which made this reference noise.
        for r in records:
            view = memoryview(r)
            for i in range(0, len(view), _PLAIN_PIECE):
                f.write(view[i : i + _PLAIN_PIECE])
    plain_time = time.perf_counter() - start
    return tf_time, plain_time


# -------------------------------------------------------------------------- RSS


def _current_rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _rss_child(case_name: str, episodes: int, quick: bool) -> None:
    """Prints the peak RSS growth while recording, over the RSS after warm-up.

    Importing TensorFlow dominates the process's lifetime peak, so the growth
    is sampled (every 5 ms) from the moment recording starts.
    """
    import threading

    case = next(c for c in _cases(quick) if c.name == case_name)
    path = tempfile.mkdtemp(prefix="rlds_bench_rss_")
    try:
        _run_ours(dataclasses.replace(case, episodes=2), os.path.join(path, "warm"))
        base = _current_rss_kb()
        peak = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _current_rss_kb())
                time.sleep(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _run_ours(dataclasses.replace(case, episodes=episodes), os.path.join(path, "ds"))
        done.set()
        sampler.join()
        peak[0] = max(peak[0], _current_rss_kb())
    finally:
        shutil.rmtree(path, ignore_errors=True)
    print(json.dumps({"growth_kb": peak[0] - base, "base_kb": base}))


def _peak_rss_mb(case_name: str, episodes: int, quick: bool) -> tuple[float, float]:
    """Returns (RSS after warm-up MB, peak growth while recording MB)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", case_name, str(episodes)]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return result["base_kb"] / 1024, result["growth_kb"] / 1024


# ------------------------------------------------------------------------ driver


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def run_case(case: Case, reps: int, workdir: str) -> dict[str, Any]:
    bare, ours, base, tf_lim, plain_lim = [], [], [], [], []
    ours_setup, base_setup = [], []
    steps = 0
    nbytes = 0
    # Warm-up: imports, TFDS feature construction and TF kernels are one-time
    # costs that would otherwise land on whichever method runs first.
    warm = dataclasses.replace(case, episodes=2)
    _run_ours(warm, os.path.join(workdir, f"{case.name}_warm_ours"))
    _run_baseline(warm, os.path.join(workdir, f"{case.name}_warm_base"))
    _run_limit(
        _dataset_records(os.path.join(workdir, f"{case.name}_warm_ours")),
        os.path.join(workdir, f"{case.name}_warm_limit"),
    )
    for rep in range(reps):
        before, steps = _run_bare(case)
        p_ours = os.path.join(workdir, f"{case.name}_ours_{rep}")
        setup, t = _run_ours(case, p_ours)
        ours.append(t)
        ours_setup.append(setup)
        # Timed on both sides of ours: a short bare loop (Catch's is ~10 ms)
        # moves with whatever ran before it (the previous repetition's
        # TensorFlow paths), and the mean of the two moves less.
        after, _ = _run_bare(case)
        bare.append((before + after) / 2)
        p_base = os.path.join(workdir, f"{case.name}_base_{rep}")
        setup, t = _run_baseline(case, p_base)
        base.append(t)
        base_setup.append(setup)
        records = _dataset_records(p_ours)
        nbytes = sum(len(r) for r in records)
        t_tf, t_plain = _run_limit(records, os.path.join(workdir, f"{case.name}_limit_{rep}"))
        tf_lim.append(t_tf)
        plain_lim.append(t_plain)
        for p in (p_ours, p_base, os.path.join(workdir, f"{case.name}_limit_{rep}")):
            shutil.rmtree(p, ignore_errors=True)
    ends = _end_latencies(case, os.path.join(workdir, f"{case.name}_ends"))
    shutil.rmtree(os.path.join(workdir, f"{case.name}_ends"), ignore_errors=True)
    total_steps = steps + case.episodes  # recorded RLDS steps include the final one
    bare_m = _median(bare)
    ours_over = max(_median([o - b for o, b in zip(ours, bare)]), 1e-9)
    base_over = max(_median([o - b for o, b in zip(base, bare)]), 1e-9)
    mb = nbytes / 1e6
    return {
        "case": case.name,
        "description": case.description,
        "episodes": case.episodes,
        "transitions": steps,
        "rlds_steps": total_steps,
        "bytes": nbytes,
        "bare_us_per_step": bare_m / steps * 1e6,
        "ours_us_per_step": ours_over / steps * 1e6,
        "baseline_us_per_step": base_over / steps * 1e6,
        "ours_setup_ms": _median(ours_setup) * 1e3,
        "baseline_setup_ms": _median(base_setup) * 1e3,
        "ours_mb_s": mb / ours_over,
        "baseline_mb_s": mb / base_over,
        "limit_tf_mb_s": mb / _median(tf_lim),
        "limit_plain_mb_s": mb / _median(plain_lim),
        "end_p50_ms": float(np.percentile(ends, 50)) * 1e3,
        "end_p99_ms": float(np.percentile(ends, 99)) * 1e3,
    }


def _machine() -> str:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gb:.0f} GiB; Python {platform.python_version()}, "
        f"numpy {np.__version__}, TensorFlow {tf.__version__}, TFDS {tfds.__version__}, "
        f"{platform.platform()}"
    )


def _report(
    results: list[dict[str, Any]],
    rss: list[tuple[str, int, float]],
    reps: int,
    machine: str,
    command: str,
    read_section: str | None,
) -> str:
    lines = [
        "## Write path",
        "",
        f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} by "
        f"`{command}`.",
        "",
        f"Machine: {machine}.",
        "",
        f"Medians of {reps} repetitions. *Overhead* is the time recording adds to the bare env "
        "loop, per env step (dataset closed and flushed included; creating the dataset is "
        "reported separately as *setup*); the bare loop is timed just before and just after "
        "ours in each repetition, and their mean taken. *MB/s* is record bytes "
        "divided by that added time; the limit is `tf.io.TFRecordWriter` (and a plain file "
        "write) of the same, already serialized records.",
        "",
        "| case | steps | bare µs/step | ours µs/step | baseline µs/step | baseline/ours "
        "| ours MB/s | baseline MB/s | limit TFRecordWriter MB/s | plain write MB/s "
        "| ours/limit | ours/baseline throughput | setup ms ours / baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['description']} | {r['transitions']} | {r['bare_us_per_step']:.2f} "
            f"| {r['ours_us_per_step']:.2f} | {r['baseline_us_per_step']:.2f} "
            f"| {r['baseline_us_per_step'] / r['ours_us_per_step']:.1f}x "
            f"| {r['ours_mb_s']:.0f} | {r['baseline_mb_s']:.0f} | {r['limit_tf_mb_s']:.0f} "
            f"| {r['limit_plain_mb_s']:.0f} | {r['ours_mb_s'] / r['limit_tf_mb_s']:.0%} "
            f"| {r['ours_mb_s'] / r['baseline_mb_s']:.1f}x "
            f"| {r['ours_setup_ms']:.0f} / {r['baseline_setup_ms']:.0f} |"
        )
    lines += [
        "",
        "Latency of the step that ends an episode (`EnvLogger.step` returning a last "
        "timestep hands the episode to the writer, flushed before, as a loop slower than "
        "the disk finds it), over every episode of one extra run per case:",
        "",
        "| case | episode end p50 ms | episode end p99 ms |",
        "|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['case']} | {r['end_p50_ms']:.3f} | {r['end_p99_ms']:.3f} |")
    lines += [
        "",
        "## Memory (fresh process per run, ours)",
        "",
        "Peak RSS growth while recording, over the process's RSS after imports and a "
        "warm-up episode (a recording process imports no TensorFlow; with it, as before "
        "the DatasetInfo was built without `tf.bool`, the base was about 713 MB).",
        "",
        "| case | episodes | RSS after warm-up MB | peak growth while recording MB |",
        "|---|---|---|---|",
    ]
    for name, episodes, (base_mb, mb) in rss:
        lines.append(f"| {name} | {episodes} | {base_mb:.0f} | {mb:.1f} |")
    lines += ["", "## Targets", ""]
    by = {r["case"]: r for r in results}
    checks = []
    if "catch" in by:
        r = by["catch"]
        checks.append(
            (
                "Catch-like overhead <= 1/20 of baseline",
                r["baseline_us_per_step"] / r["ours_us_per_step"] >= 20,
                f"{r['baseline_us_per_step'] / r['ours_us_per_step']:.1f}x",
            )
        )
    if "image_bytes" in by:
        r = by["image_bytes"]
        checks.append(
            (
                "84x84x3 bytes overhead <= 1/10 of baseline",
                r["baseline_us_per_step"] / r["ours_us_per_step"] >= 10,
                f"{r['baseline_us_per_step'] / r['ours_us_per_step']:.1f}x",
            )
        )
        checks.append(
            (
                "84x84x3 bytes throughput >= 70% of limit",
                r["ours_mb_s"] / r["limit_tf_mb_s"] >= 0.7,
                f"{r['ours_mb_s'] / r['limit_tf_mb_s']:.0%}",
            )
        )
    if "catch" in by:
        r = by["catch"]
        checks.append(
            (
                "Catch-like overhead <= 1.5 µs/step above the bare loop (issue 12)",
                r["ours_us_per_step"] <= 1.5,
                f"{r['ours_us_per_step']:.2f} µs",
            )
        )
        total = (r["bare_us_per_step"] + r["ours_us_per_step"]) / r["bare_us_per_step"]
        checks.append(
            (
                "Catch-like recording within 2x the bare loop (issue 26)",
                total <= 2.0,
                f"{total:.2f}x",
            )
        )
    if "image_bytes" in by:
        r = by["image_bytes"]
        ratio = r["limit_plain_mb_s"] / r["ours_mb_s"]
        checks.append(
            (
                # Not like for like (see "Where the time goes" in REPORT.md): the
                # time recording adds to the loop against one write per finished
                # record; peers.py's raw84 "plain" row is the per-frame comparison.
                "84x84x3 bytes: time added to the loop within 1.2x of a plain write "
                "of the finished records (issue 12; per-frame: peers.py raw84)",
                ratio <= 1.2,
                f"{ratio:.2f}x",
            )
        )
    for r in results:
        checks.append(
            (
                f"{r['case']}: episode end p99 <= 1 ms (issue 12)",
                r["end_p99_ms"] <= 1.0,
                f"{r['end_p99_ms']:.3f} ms",
            )
        )
    if "png_image" in by:
        r = by["png_image"]
        checks.append(
            (
                "PNG throughput >= 1.6x baseline",
                r["ours_mb_s"] / r["baseline_mb_s"] >= 1.6,
                f"{r['ours_mb_s'] / r['baseline_mb_s']:.2f}x",
            )
        )
    rss_by: dict[str, list[tuple[int, float]]] = {}
    for name, episodes, (base_mb, mb) in rss:
        rss_by.setdefault(name, []).append((episodes, base_mb + mb))
    for name, pairs in rss_by.items():
        if len(pairs) >= 2:
            (e1, m1), (e2, m2) = sorted(pairs)[:2]
            checks.append(
                (
                    f"peak RSS {name}: {e1} vs {e2} episodes within 10%",
                    abs(m2 - m1) / m1 <= 0.10,
                    f"{m1:.0f} MB vs {m2:.0f} MB ({(m2 - m1) / m1:+.1%})",
                )
            )
    lines += ["| target | met | measured |", "|---|---|---|"]
    for text, ok, value in checks:
        lines.append(f"| {text} | {'yes' if ok else 'no'} | {value} |")
    if read_section:
        lines += ["", read_section.strip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer episodes (smoke run)")
    parser.add_argument("--cases", default="", help="comma-separated case names (default all)")
    parser.add_argument(
        "--report",
        nargs="?",
        const=os.path.join(_HERE, "REPORT.md"),
        default=None,
        help="also write the report to this file (default benchmarks/REPORT.md)",
    )
    parser.add_argument("--skip-read", action="store_true", help="skip the read benchmark")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument(
        "--rss-child", nargs=2, metavar=("CASE", "EPISODES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child[0], int(args.rss_child[1]), args.quick)
        return
    import logging

    logging.getLogger("rlds_writer").setLevel(logging.ERROR)
    wanted = set(filter(None, args.cases.split(",")))
    cases = [c for c in _cases(args.quick) if not wanted or c.name in wanted]
    workdir = tempfile.mkdtemp(prefix="rlds_bench_")
    results = []
    try:
        for case in cases:
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            results.append(run_case(case, args.repetitions, workdir))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        rss = []
        if not args.skip_rss:
            for name, counts in (("catch", (100, 2000, 8000)), ("image_bytes", (10, 100))):
                if wanted and name not in wanted:
                    continue
                for episodes in counts:
                    rss.append((name, episodes, _peak_rss_mb(name, episodes, args.quick)))
                    print(f"rss {name} {episodes}: {rss[-1][2]}", file=sys.stderr)
        read_section = None
        if not args.skip_read:
            try:
                sys.path.insert(0, _HERE)
                import bench_read  # written alongside; measures the read path

                read_section = bench_read.run(os.path.join(workdir, "read"), args.repetitions)
            except ImportError as e:
                read_section = f"## Read path\n\nNot measured: {e}."
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:])
    report = _report(results, rss, args.repetitions, _machine(), command.strip(), read_section)
    if args.report:
        # Only the sections this run measured are replaced; the other benchmarks' stay.
        write_sections(args.report, report)
    print(report)


if __name__ == "__main__":
    main()
