"""A TCP relay in front of a test object-store server that counts the bytes it sends.

`relay(bucket, monkeypatch)` starts one in front of the server behind a
`tests/object_stores.py` bucket and points the clients at it, so a test can
prove how much of a dataset a read fetched without touching the client.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST")


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


def relay(bucket, monkeypatch) -> CountingProxy:
    """Puts a `CountingProxy` between the clients and `bucket`'s server."""
    from object_stores import _point_clients

    (variable,) = [v for v in _ENDPOINT_VARIABLES if v in bucket.env]
    proxy = CountingProxy(urlsplit(bucket.env[variable]).port)
    env = dict(bucket.env, **{variable: f"http://127.0.0.1:{proxy.port}"})
    _point_clients(monkeypatch, env, ("s3",) if bucket.protocol == "s3" else ("gs", "gcs"))
    return proxy


def upload(local, url: str) -> None:
    """Copies a local dataset directory to `url` (objects named as the local files)."""
    import os

    from rlds_writer.store.storage.storage import storage_for

    store = storage_for(url)
    for name in sorted(os.listdir(local)):
        if (local / name).is_file():
            store.upload(str(local / name), store.join(url, name))
