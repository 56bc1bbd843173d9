"""An HTTP relay on loopback in front of a test object store that breaks requests on command.

`fault_proxy(bucket, monkeypatch)` starts one in front of the server behind a
`tests/object_stores.py` bucket (S3's moto or the GCS emulator) and points the
clients at it. Each request is
read up to its headers, then `proxy.rule(method, path, headers)` (or the
faults set with `proxy.fail`) picks what happens to it:

- `pass`: relayed to the server (one request per connection: `Connection: close`);
- `reset`: the connection is reset (TCP RST), as a store that went away;
- `503`, `403`: answered with that status and an S3 error body (`SlowDown`,
  `SignatureDoesNotMatch`: a wrong secret);
- `hold`: kept unanswered until `proxy.release()` (a stalled store), then relayed;
- `blackhole`: read and never answered (until the proxy closes).

It counts the requests it saw and holds. Nothing but 127.0.0.1 is ever reached.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

_HOST = "127.0.0.1"
_BODIES = {
    "503": (
        "503 Slow Down",
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    ),
    "403": (
        "403 Forbidden",
        "<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we "
        "calculated does not match the signature you provided.</Message></Error>",
    ),
}

Rule = Callable[[str, str, dict[str, str]], str]


class FaultProxy:
    """Relays HTTP requests from a loopback port to `target`, breaking the ones told."""

    def __init__(self, target: int):
        self.target = target
        self.rule: Rule = lambda method, path, headers: "pass"
        self.seen: list[tuple[str, str, str]] = []  # (method, path, action)
        self.held = 0
        self._release = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((_HOST, 0))
        self._server.listen(128)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def fail(self, action: str, method: str | None = None, ranged: bool = False) -> None:
        """Applies `action` to every request (of `method`; with a Range header if `ranged`)."""

        def rule(m: str, path: str, headers: dict[str, str]) -> str:
            if method is not None and m != method:
                return "pass"
            if ranged and "range" not in headers:
                return "pass"
            return action

        self.rule = rule

    def heal(self) -> None:
        """Every request passes again; held ones go on."""
        self.rule = lambda method, path, headers: "pass"
        self.release()

    def release(self) -> None:
        """Lets the held requests go on (relayed), and any held later."""
        self._release.set()

    def count(self, action: str, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for m, _, a in self.seen if a == action and method in (None, m))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            head, rest = _read_head(client)
            if head is None:
                client.close()
                return
            method, path, headers = _parse(head)
            action = self.rule(method, path, headers)
            with self._lock:
                self.seen.append((method, path, action))
            if action == "reset":
                _reset(client)
            elif action in _BODIES:
                _answer(client, *_BODIES[action], with_body=method != "HEAD")
            elif action == "blackhole":
                self._closed.wait()
                _reset(client)
            else:
                if action == "hold":
                    with self._lock:
                        self.held += 1
                    self._release.wait()
                    with self._lock:
                        self.held -= 1
                self._relay(client, _closing(head) + rest)
        except OSError:
            with contextlib.suppress(OSError):
                client.close()

    def _relay(self, client: socket.socket, first: bytes) -> None:
        upstream = socket.create_connection((_HOST, self.target))
        upstream.sendall(first)
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join(60)

    def close(self) -> None:
        self._closed.set()
        self._release.set()
        self._server.close()


def _read_head(client: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = (lines[0].split(" ") + ["", "", ""])[:3]
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _closing(head: bytes) -> bytes:
    """The request head with `Connection: close`: one request per relayed connection."""
    lines = [
        line for line in head.split(b"\r\n") if line and not line.lower().startswith(b"connection:")
    ]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


def _reset(client: socket.socket) -> None:
    # SO_LINGER 0: close sends RST, as a store that went away mid-request.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def _answer(client: socket.socket, status: str, body: str, with_body: bool) -> None:
    data = body.encode()
    client.sendall(
        f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + (data if with_body else b"")  # a HEAD answer has no body
    )
    with contextlib.suppress(OSError):
        client.shutdown(socket.SHUT_WR)
    client.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def fault_proxy(bucket, monkeypatch) -> FaultProxy:
    """Puts a `FaultProxy` between the clients and `bucket`'s server (moto for S3,
    the GCS emulator for gs://)."""
    from object_stores import _point_clients

    variable, protocols = {
        "s3": ("AWS_ENDPOINT_URL", ("s3",)),
        "gs": ("STORAGE_EMULATOR_HOST", ("gs", "gcs")),
    }[bucket.protocol]
    proxy = FaultProxy(urlsplit(bucket.env[variable]).port)
    env = dict(bucket.env, **{variable: f"http://{_HOST}:{proxy.port}"})
    _point_clients(monkeypatch, env, protocols)
    return proxy
