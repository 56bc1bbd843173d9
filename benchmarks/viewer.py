"""Benchmark: `rlds-writer view` (issue 45).

* **first paint of the episode list** of a 10,000-episode dataset once its
  index exists: the server's start from the cached index, then headless
  Chromium's time from navigation to the list's rows painted (`RV.firstListPaint`),
  median of fresh page loads; and the list API's answer time for sorted and
  filtered queries;
* **index build vs the reader**: the one scan that builds the index, beside
  the reader's own scans of the same split (`episode_lengths`, the cheapest;
  a full decode; `stats`), on that dataset and on a camera dataset;
* **stepping two 256x256 JPEG cameras at 30 fps**: the page plays episodes of
  300 steps; every step shown is timed in the page; a step the clock had to
  wait for (its frames not decoded in time) is a dropped frame;
* **server memory**: `rlds-writer view` in its own process, every frame of
  every episode fetched in turn (as playing them all would); its RSS after
  each episode, with `--cache-mb 64`.

Needs Debian's chromium and chromium-driver and selenium (as the page tests).
Usage: `python benchmarks/viewer.py [--episodes 10000] [--report [PATH]]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
from report_sections import add_report_argument, write_section  # noqa: E402

HEADING = "## Viewer (`rlds-writer view`)"
TASKS = ("pick up the red block", "open the drawer", "push the cup to the left", "stack the cups")


def write_list_dataset(path: str, episodes: int) -> None:
    """Episodes of 10-60 steps: state, action, reward, an instruction, episode metadata."""
    import tensorflow_datasets as tfds

    import rlds_writer

    config = rlds_writer.DatasetConfig(
        name="many",
        observation_info={"state": tfds.features.Tensor(shape=(8,), dtype=np.float32)},
        action_info=tfds.features.Tensor(shape=(7,), dtype=np.float32),
        reward_info=np.float32,
        step_metadata_info={"language_instruction": tfds.features.Text()},
        episode_metadata_info={"operator": tfds.features.Text(), "success": np.bool_},
    )
    rng = np.random.default_rng(0)
    with rlds_writer.TFDSBackendWriter(path, config, max_episodes_per_file=500) as writer:
        for e in range(episodes):
            n = int(rng.integers(10, 61))
            writer.write_episode(
                {
                    "observation": {"state": rng.normal(size=(n, 8)).astype(np.float32)},
                    "action": rng.normal(size=(n - 1, 7)).astype(np.float32),
                    "reward": rng.random(n - 1).astype(np.float32),
                    "language_instruction": [TASKS[e % len(TASKS)]] * n,
                },
                episode_metadata={"operator": f"op{e % 7}", "success": bool(e % 3)},
                terminated=bool(e % 2),
            )


def write_camera_dataset(path: str, episodes: int, steps: int) -> None:
    """Two 256x256 JPEG cameras of changing content, `steps` steps per episode."""
    from helpers_viewer import robot_config

    import rlds_writer

    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:256, 0:256]
    with rlds_writer.TFDSBackendWriter(path, robot_config(256), max_episodes_per_file=4) as writer:
        for e in range(episodes):
            t = np.arange(steps)
            noise = rng.integers(0, 40, (256, 256, 3))
            image = [
                (np.stack([(xx + i * 3) % 256, yy, np.full_like(xx, e * 30 % 256)], -1) + noise)
                .clip(0, 255)
                .astype(np.uint8)
                for i in t
            ]
            wrist = [
                (np.stack([np.full_like(xx, i % 256), (xx + yy + i * 5) % 256, yy], -1) + noise)
                .clip(0, 255)
                .astype(np.uint8)
                for i in t
            ]
            writer.write_episode(
                {
                    "observation": {
                        "image": image,
                        "wrist_image": wrist,
                        "state": rng.normal(size=(steps, 4)).astype(np.float32),
                    },
                    "action": rng.normal(size=(steps - 1, 7)).astype(np.float32),
                    "reward": rng.random(steps - 1).astype(np.float32),
                    "language_instruction": [TASKS[e % 4]] * steps,
                },
                episode_metadata={"operator": "op", "success": True},
            )


def _seconds(fn, repeat: int = 1) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def scans(path: str) -> dict:
    """Seconds of the index build and of the reader's scans of the same split."""
    import rlds_writer
    from rlds_writer.maintain.statistics import compute_statistics
    from rlds_writer.view.episode_index import EpisodeIndex
    from rlds_writer.view.fields import layout

    def index():
        reader = rlds_writer.open_dataset(path)
        EpisodeIndex(layout(reader.features), cache=False).update(reader)

    def lengths():
        rlds_writer.open_dataset(path).episodes("train").episode_lengths()

    def full():
        for _ in rlds_writer.open_dataset(path).episodes("train"):
            pass

    def stats():
        compute_statistics(path)

    return {
        "index": _seconds(index, 2),
        "episode_lengths": _seconds(lengths, 2),
        "decode_all": _seconds(full, 1),
        "stats": _seconds(stats, 1),
    }


def first_paint(path: str, loads: int) -> dict:
    from helpers_browser import start_chromium

    from rlds_writer.view.server import start
    from rlds_writer.view.source import ViewerSource

    ViewerSource(path)  # builds and caches the index
    start_seconds = _seconds(lambda: ViewerSource(path), 3)
    source = ViewerSource(path)
    assert source.index.scanned == 0
    server, _ = start(source)
    api = {}
    for name, query in (
        ("first page", ""),
        ("sorted by return", "?sort=return&order=desc"),
        ("text + ending filter", "?text=drawer&ending=terminated"),
        ("metadata filter, sorted by length", "?meta=operator%3Dop3&sort=length"),
    ):
        url = server.url + "api/episodes" + query
        api[name] = _seconds(lambda u=url: urllib.request.urlopen(u).read(), 5) * 1000
    driver = start_chromium()
    paints = []
    try:
        for _ in range(loads):
            driver.get("about:blank")
            driver.get(server.url + "?episode=0&step=0")
            deadline = time.time() + 30
            value = None
            while value is None and time.time() < deadline:
                value = driver.execute_script("return window.RV && RV.firstListPaint")
                time.sleep(0.01)
            rows = driver.execute_script(
                "return document.querySelectorAll('#episodes tbody tr').length"
            )
            assert rows == 50, rows
            paints.append(value)
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
    return {"server_start_s": start_seconds, "paint_ms": paints, "api_ms": api}


def stepping(path: str, episodes: list[int], fps: int) -> list[dict]:
    from helpers_browser import start_chromium

    from rlds_writer.view.server import start
    from rlds_writer.view.source import ViewerSource

    source = ViewerSource(path)
    server, _ = start(source)
    driver = start_chromium()
    out = []
    try:
        for episode in episodes:
            driver.get(server.url + f"?episode={episode}&step=0")
            deadline = time.time() + 60
            while time.time() < deadline and not driver.execute_script(
                "return !!(window.RV && RV.player && RV.player.episode && "
                "[...document.querySelectorAll('#cameras canvas')]"
                ".every(c => c.dataset.step === '0'))"
            ):
                time.sleep(0.02)
            driver.execute_script(
                f"document.getElementById('fps').value = '{fps}';"
                "window.shown = []; const p = RV.player; const show = p.show.bind(p);"
                "window.cost = []; p.show = (s) => { const t = performance.now();"
                " window.shown.push([s, t]); show(s); window.cost.push(performance.now() - t); };"
                "RV.stats.stalls = 0; p.play();"
            )
            length = driver.execute_script("return RV.player.episode.length")
            deadline = time.time() + length / fps * 4 + 30
            while time.time() < deadline and driver.execute_script("return RV.player.playing"):
                time.sleep(0.2)
            shown, stalls, cost = driver.execute_script(
                "return [window.shown, RV.stats.stalls, window.cost]"
            )
            steps = [s for s, _ in shown]
            times = np.array([t for _, t in shown])
            gaps = np.diff(times)
            out.append(
                {
                    "episode": episode,
                    "steps": length,
                    "shown": len(steps),
                    "in_order": steps == list(range(1, length)),
                    "stalls": stalls,
                    "wall_s": (times[-1] - times[0]) / 1000 if len(times) > 1 else 0.0,
                    "gap_p50_ms": float(np.percentile(gaps, 50)),
                    "gap_p99_ms": float(np.percentile(gaps, 99)),
                    "gap_max_ms": float(gaps.max()),
                    "late": int(np.sum(gaps > 1.5 * 1000 / fps)),
                    "show_p50_ms": float(np.percentile(cost, 50)),
                    "show_p99_ms": float(np.percentile(cost, 99)),
                }
            )
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
    return out


def memory(path: str, episodes: int, cache_mb: int) -> dict:
    import psutil

    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen(
        [sys.executable, "-m", "rlds_writer", "view", path, "--cache-mb", str(cache_mb)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        url = process.stdout.readline().rsplit(" ", 1)[1].strip()
        rss = psutil.Process(process.pid)
        base = rss.memory_info().rss
        after = []
        served = 0
        for e in range(episodes):
            info = json.load(urllib.request.urlopen(f"{url}api/episodes/{e}"))
            for step in range(info["length"]):
                for camera in range(len(info["cameras"])):
                    served += len(
                        urllib.request.urlopen(
                            f"{url}api/episodes/{e}/frames/{camera}/{step}"
                        ).read()
                    )
            after.append(rss.memory_info().rss)
    finally:
        process.terminate()
        process.wait(30)
    mb = 1 << 20
    return {
        "base_mb": base / mb,
        "after_mb": [a / mb for a in after],
        "served_mb": served / mb,
        "cache_mb": cache_mb,
    }


def render(args: argparse.Namespace, results: dict) -> str:
    import tensorflow as tf

    many, cams = results["scans_many"], results["scans_cams"]
    paint = results["paint"]
    lines = [
        HEADING,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`python benchmarks/viewer.py --episodes {args.episodes} --camera-episodes "
        f"{args.camera_episodes} --steps {args.steps} --report` "
        "(under `flock /tmp/rlds-bench.lock`).",
        "",
        f"Machine: {os.cpu_count()} cores, shared with other work while this ran (figures are "
        f"noisy); Python {platform.python_version()}, numpy {np.__version__}, TensorFlow "
        f"{tf.__version__}, headless Chromium from Debian.",
        "",
        f"**First paint of the episode list** ({args.episodes} episodes, index cached): the "
        f"server starts from the cached index in {paint['server_start_s']:.2f} s (best of 3); "
        f"the page paints the first 50 rows {statistics.median(paint['paint_ms']):.0f} ms after "
        f"navigation (median of {len(paint['paint_ms'])} fresh loads; "
        f"{min(paint['paint_ms']):.0f}-{max(paint['paint_ms']):.0f} ms). Target < 1 s: "
        f"{'met' if statistics.median(paint['paint_ms']) < 1000 else 'NOT met'}.",
        "",
        "| list query (10,000 episodes) | answer ms (best of 5) |",
        "|---|---|",
    ]
    lines += [f"| {name} | {ms:.1f} |" for name, ms in paint["api_ms"].items()]
    lines += [
        "",
        "**Index build vs the reader's scans** of the same split (seconds, best of 2 for "
        "the first two):",
        "",
        "| dataset | index build | reader `episode_lengths` | reader, every episode decoded "
        "| `stats` |",
        "|---|---|---|---|---|",
        f"| {args.episodes} episodes, 10-60 steps, no images | {many['index']:.2f} | "
        f"{many['episode_lengths']:.2f} | {many['decode_all']:.2f} | {many['stats']:.2f} |",
        f"| {args.camera_episodes} episodes x {args.steps} steps, two 256x256 JPEG cameras | "
        f"{cams['index']:.2f} | {cams['episode_lengths']:.2f} | {cams['decode_all']:.2f} | "
        f"{cams['stats']:.2f} |",
        "",
        f"**Stepping two 256x256 JPEG cameras at {args.fps} fps** (play from step 0 to the "
        "end; *waits* counts steps the clock held because a frame was not decoded yet: "
        "dropped frames; *late* counts gaps between shown steps over 1.5 frame intervals, "
        "the page's main thread scheduled late; *one step's drawing* is the page's time to "
        "show a step: both cameras, every plot cursor and value):",
        "",
        "| episode | steps | shown in order | waits (dropped) | wall s | gap p50 ms | gap p99 ms "
        "| gap max ms | late | one step's drawing p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["stepping"]:
        lines.append(
            f"| {r['episode']} | {r['steps']} | {'yes' if r['in_order'] else 'NO'} "
            f"({r['shown']}) | {r['stalls']} | {r['wall_s']:.2f} | {r['gap_p50_ms']:.1f} | "
            f"{r['gap_p99_ms']:.1f} | {r['gap_max_ms']:.1f} | {r['late']} | "
            f"{r['show_p50_ms']:.1f} / {r['show_p99_ms']:.1f} |"
        )
    mem = results["memory"]
    after = mem["after_mb"]
    lines += [
        "",
        f"**Server memory** (`rlds-writer view --cache-mb {mem['cache_mb']}` in its own "
        f"process; every frame of {len(after)} episodes fetched in turn, "
        f"{mem['served_mb']:.0f} MB of frames served): RSS {mem['base_mb']:.0f} MB after "
        f"start, {after[0]:.0f} MB after the first episode, at most {max(after):.0f} MB, "
        f"{after[-1]:.0f} MB after the last (per episode: "
        + ", ".join(f"{a:.0f}" for a in after)
        + ").",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--camera-episodes", type=int, default=12)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument(
        "--parts",
        default="scans,list,stepping,memory",
        help="comma-separated parts to run (the report needs all four)",
    )
    add_report_argument(parser)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        many = os.path.join(tmp, "many")
        cams = os.path.join(tmp, "cams")
        t = time.perf_counter()
        if parts & {"scans", "list"}:
            write_list_dataset(many, args.episodes)
        if parts & {"scans", "stepping", "memory"}:
            write_camera_dataset(cams, args.camera_episodes, args.steps)
        print(f"datasets written in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        results = {}
        if "scans" in parts:
            results["scans_many"] = scans(many)
            results["scans_cams"] = scans(cams)
        if "list" in parts:
            results["paint"] = first_paint(many, args.loads)
        if "stepping" in parts:
            results["stepping"] = stepping(cams, [0, 1, 2], args.fps)
        if "memory" in parts:
            results["memory"] = memory(cams, args.camera_episodes, 64)
    if len(results) < 5:
        print(json.dumps(results, indent=1))
        return
    text = render(args, results)
    print(text)
    print(json.dumps(results, indent=1), file=sys.stderr)
    if args.report:
        write_section(args.report, HEADING, text)


if __name__ == "__main__":
    main()
