"""The longest `env.step()` while S3 stalls every upload (moto behind tests/fault_proxy.py).

Catch episodes are recorded to `s3://` with `max_episodes_per_file=5` while
the proxy holds every PUT for `--stall` seconds (a timer releases them); the
writer thread is idle between short episodes, so a shard fills at an inline
write. Prints the longest env step, the episodes recorded and those found
afterwards. Everything runs on 127.0.0.1.

    python benchmarks/stalled_upload.py [--episodes 20] [--stall 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from object_storage import _start_moto  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--stall", type=float, default=5.0)
    args = parser.parse_args()
    from fault_proxy import FaultProxy

    process, endpoint = _start_moto()
    proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
    try:
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )
        import fsspec

        import rlds_writer

        bucket = f"rlds-{uuid.uuid4().hex[:12]}"
        fsspec.filesystem("s3").mkdir(bucket)
        url = f"s3://{bucket}/run"
        env = rlds_writer.EnvLogger(
            rlds_writer.Catch(seed=0), data_directory=url, max_episodes_per_file=5
        )
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(0)
        proxy.fail("hold", method="PUT")
        threading.Timer(args.stall, proxy.release).start()
        longest = 0.0
        started = time.perf_counter()
        for i in range(1, args.episodes):
            timestep = env.reset()
            while not timestep.last():
                t = time.perf_counter()
                timestep = env.step(i % 3)
                longest = max(longest, time.perf_counter() - t)
        loop = time.perf_counter() - started
        proxy.heal()
        env.close()
        found = len(rlds_writer.open_dataset(url).episodes("train"))
        print(
            f"stall {args.stall:.1f} s: longest env step {longest * 1e3:.2f} ms, env loop "
            f"{loop:.2f} s, episodes recorded {args.episodes}, found {found}"
        )
    finally:
        proxy.close()
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
