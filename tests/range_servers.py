"""Real object-store servers on 127.0.0.1 for the read-side tests, and a byte counter.

`object_store(kind, tmp)` starts moto's S3 server (`moto_server`) or
`gcp-storage-emulator`, each on a free loopback port, behind `CountingProxy`:
a plain TCP relay that counts the bytes the server sends, so a test can prove
how much of a dataset a read fetched without touching the client. The fsspec
clients are pointed at the proxy through the environment, as a user's would
be (`AWS_ENDPOINT_URL`, `STORAGE_EMULATOR_HOST`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

BIN = Path(sys.executable).parent
BUCKET = "rlds-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"server did not listen on {port}: {log.read_text()[-2000:]}")


class CountingProxy:
    """Relays TCP connections from a loopback port to `target`, counting the bytes back."""

    def __init__(self, target: int):
        self.target = target
        self.received = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if count:
                    with self._lock:
                        self.received += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def reset(self) -> int:
        """Returns the bytes counted so far and starts again from zero."""
        with self._lock:
            n, self.received = self.received, 0
        return n

    def close(self) -> None:
        self._server.close()


def _clear_fsspec_caches() -> None:
    """fsspec keeps one client per protocol: a new server needs a new one."""
    for module, cls in (("s3fs", "S3FileSystem"), ("gcsfs", "GCSFileSystem")):
        with contextlib.suppress(ImportError):
            getattr(__import__(module), cls).clear_instance_cache()


@contextlib.contextmanager
def object_store(kind: str, tmp: Path) -> Iterator[tuple[str, CountingProxy]]:
    """Starts a server of `kind` ("s3" or "gs"); yields (bucket URL, proxy)."""
    port = free_port()
    log = tmp / f"{kind}-server.log"
    if kind == "s3":
        command = [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    else:
        command = [
            str(BIN / "gcp-storage-emulator"),
            "start",
            "--host=127.0.0.1",
            f"--port={port}",
            "--in-memory",
        ]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
    proxy = None
    saved = dict(os.environ)
    try:
        _wait_for(port, process, log)
        proxy = CountingProxy(port)
        endpoint = f"http://127.0.0.1:{proxy.port}"
        if kind == "s3":
            os.environ.update(
                AWS_ENDPOINT_URL=endpoint,
                AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="testing",
                AWS_DEFAULT_REGION="us-east-1",
            )
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = endpoint
        _clear_fsspec_caches()
        import fsspec

        fsspec.filesystem(kind).mkdir(BUCKET)
        yield f"{kind}://{BUCKET}", proxy
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _clear_fsspec_caches()
        if proxy is not None:
            proxy.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def upload(local: Path, url: str) -> None:
    """Copies a local dataset directory to `url` (object names as the local file names)."""
    import fsspec

    fs = fsspec.filesystem(url.split("://")[0])
    for name in sorted(os.listdir(local)):
        if (local / name).is_file():
            fs.put_file(str(local / name), f"{url}/{name}")
