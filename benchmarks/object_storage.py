"""Recording to and reading from S3 (moto in server mode) next to a local disk.

What object storage costs: steps per second recording Catch episodes and
reading them back with `open_dataset`, the requests each episode costs, the
bytes uploaded per step, and what reading one episode fetches. moto runs on
127.0.0.1 in this process's machine, so the figures count the protocol's
requests and the client's work, not a network's latency.

    python benchmarks/object_storage.py [--episodes 200] [--repeats 3] [--report]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_sections import add_report_argument, write_sections  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    tool = os.path.join(os.path.dirname(sys.executable), "moto_server")
    process = subprocess.Popen(
        [tool, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto_server did not start within 60 s")


class _Requests:
    """Counts the S3 requests an s3fs client sends, by method."""

    def __init__(self, fs):
        self.counts: collections.Counter = collections.Counter()
        fs.s3.meta.events.register("before-send.s3", self._count)

    def _count(self, request, **_):
        self.counts[request.method] += 1

    def take(self) -> collections.Counter:
        out, self.counts = self.counts, collections.Counter()
        return out


def _methods(counts: collections.Counter) -> str:
    return ", ".join(f"{method} {n}" for method, n in sorted(counts.items()))


def _record(path: str, episodes: int, flush_each: bool) -> tuple[float, int]:
    import rlds_writer

    steps = 0
    start = time.perf_counter()
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=path)
    for _ in range(episodes):
        ts = env.reset()
        while not ts.last():
            ts = env.step(1)
            steps += 1
        if flush_each:
            env.flush()
    env.close()
    return time.perf_counter() - start, steps


def _read(path: str) -> tuple[float, int]:
    import rlds_writer

    start = time.perf_counter()
    steps = 0
    with rlds_writer.open_dataset(path) as reader:
        for episode in reader.episodes("train"):
            steps += len(episode["steps"]["reward"])
    return time.perf_counter() - start, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    add_report_argument(parser)
    args = parser.parse_args()

    moto, endpoint = _start_moto()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="benchmark",
        AWS_SECRET_ACCESS_KEY="benchmark",
        AWS_DEFAULT_REGION="us-east-1",
    )
    tmp = tempfile.mkdtemp(prefix="rlds-objstore-bench-")
    try:
        import fsspec

        from rlds_writer.store.storage.storage import storage_for

        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        storage = storage_for("s3://bench")
        requests = _Requests(storage.fs)
        _record(os.path.join(tmp, "warm-up"), 5, False)  # imports, TFDS's first use
        rows = collections.defaultdict(list)
        counts: dict[str, collections.Counter] = {}
        sizes: dict[str, int] = {}
        steps_of: dict[str, int] = {}
        for rep in range(args.repeats):
            for where in ("local", "s3"):  # interleaved
                for flush_each in (False, True):
                    n = args.episodes if not flush_each else max(1, args.episodes // 10)
                    how = "flush() after every episode" if flush_each else "commit at close"
                    label = f"{where}, {how}"
                    if where == "local":
                        path = os.path.join(tmp, f"r{rep}-{int(flush_each)}")
                    else:
                        path = f"s3://bench/r{rep}-{int(flush_each)}"
                    requests.take()
                    seconds, steps = _record(path, n, flush_each)
                    sent = requests.take()
                    rows[("record", label)].append(steps / seconds)
                    steps_of[label] = steps
                    counts[label] = collections.Counter({"episodes": n, **sent})
                    if where == "local":
                        sizes[label] = sum(
                            os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                        )
                    if not flush_each:
                        requests.take()
                        seconds, read_steps = _read(path)
                        read_sent = requests.take()
                        rows[("read", where)].append(read_steps / seconds)
                        counts[f"read {where}"] = collections.Counter({"episodes": n, **read_sent})
        # What reading one episode of a bucket fetches.
        from rlds_writer.read.reader import open_dataset

        path = "s3://bench/r0-0"
        size = sum(fs.size(p) for p in fs.ls(path[5:], detail=False) if "tfrecord" in p)
        requests.take()
        with open_dataset(path) as reader:
            next(iter(reader.episodes("train")))
        one = requests.take()
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    lines = [
        "## Object storage: S3 (moto) next to a local disk",
        "",
        f"`python benchmarks/object_storage.py --episodes {args.episodes} --repeats "
        f"{args.repeats} --report`: Catch episodes recorded with `EnvLogger` to a "
        "local directory and to `s3://` on a moto server on 127.0.0.1 (so no network "
        "latency: the client's work and the request count), interleaved; medians of "
        f"{args.repeats} runs. Requests counted in s3fs's client.",
        "",
        "| recording | steps/s | requests per episode | bytes per step (dataset) |",
        "|---|---|---|---|",
    ]
    for where in ("local", "s3"):
        for flush in ("commit at close", "flush() after every episode"):
            label = f"{where}, {flush}"
            c = counts[label]
            episodes = c.pop("episodes")
            local_label = f"local, {flush}"
            per_step = sizes.get(local_label, 0) / max(1, steps_of[local_label])
            req = "-"
            if where == "s3":
                req = f"{sum(c.values()) / episodes:.2f} ({_methods(c)})"
            lines.append(
                f"| {label} | {statistics.median(rows[('record', label)]):,.0f} | {req} "
                f"| {per_step:.0f} |"
            )
    lines += [
        "",
        "| reading (`open_dataset`, every episode) | steps/s | requests |",
        "|---|---|---|",
    ]
    for where in ("local", "s3"):
        c = counts[f"read {where}"]
        c.pop("episodes")
        req = str(sum(c.values())) if where == "s3" else "-"
        lines.append(f"| {where} | {statistics.median(rows[('read', where)]):,.0f} | {req} |")
    lines += [
        "",
        f"Reading the first episode of the bucket's dataset ({size:,} bytes of shards) "
        f"took {sum(one.values())} requests ({_methods(one)}).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        write_sections(args.report, text)


if __name__ == "__main__":
    main()
