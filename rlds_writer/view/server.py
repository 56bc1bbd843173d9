"""The viewer's HTTP server: the page, its JSON API and the frames, on loopback.

Routes (GET and HEAD; everything else is 405):

* `/` the page; `/static/<name>` its scripts and styles, from a fixed list of
  files shipped in the package (a request never names a file);
* `/api/dataset`: name, splits, cameras, plots, fields left out and why;
* `/api/episodes?split=&<list query>`: a page of the episode list
  (`listing.py`);
* `/api/episodes/<id>?split=`: one episode for the player;
* `/api/episodes/<id>/steps?split=&start=&stop=`: exact values of some steps;
* `/api/episodes/<id>/next?split=&dir=1|-1&<list query>`: its neighbour in the list;
* `/api/episodes/<id>/frames/<camera>/<step>?split=`: a frame's stored bytes,
  with range requests.

Ids are integers; anything else is a 404. Every response forbids the page
from loading anything from elsewhere (`Content-Security-Policy`), and a
request whose `Host` is not this server's loopback address is refused (a web
page cannot reach the viewer through a name that resolves to 127.0.0.1).
"""

from __future__ import annotations

import http.server
import ipaddress
import json
import re
import socket
import threading
import urllib.parse
from importlib import resources
from typing import Any

from rlds_writer.errors import DecodeError, RLDSWriterError, ViewerRequestError
from rlds_writer.view import listing
from rlds_writer.view.source import ViewerSource

# The page's files: name -> media type. Nothing else under /static/ exists.
ASSETS = {
    "viewer.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "list.js": "text/javascript; charset=utf-8",
    "player.js": "text/javascript; charset=utf-8",
    "plots.js": "text/javascript; charset=utf-8",
}
PAGE = "index.html"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_ID = r"(\d{1,12})"
_ROUTES = [
    (re.compile(r"/api/dataset"), "dataset"),
    (re.compile(r"/api/episodes"), "episodes"),
    (re.compile(rf"/api/episodes/{_ID}"), "episode"),
    (re.compile(rf"/api/episodes/{_ID}/steps"), "steps"),
    (re.compile(rf"/api/episodes/{_ID}/next"), "next"),
    (re.compile(rf"/api/episodes/{_ID}/frames/{_ID}/{_ID}"), "frame"),
]
# At most 18 digits: a longer position is past any frame, and int() refuses 4,300+ digits.
_RANGE = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")


def asset(name: str) -> bytes:
    """The bytes of one of the page's files shipped in the package."""
    return resources.files("rlds_writer.view").joinpath("static", name).read_bytes()


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`); names are not looked up."""
    if host.strip("[]").lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Handler(http.server.BaseHTTPRequestHandler):
    """One request; the server's `source` is the dataset."""

    server: ViewerServer
    server_version = "rlds-writer-view"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        if self.server.log:
            super().log_message(format, *args)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        super().log_message(format, *args)  # errors are shown, requests only with --verbose

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._respond(head=True)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._respond(head=False)

    def _method_not_allowed(self) -> None:
        self._send(405, json.dumps({"error": "only GET and HEAD"}).encode(), "application/json")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _method_not_allowed  # noqa: N815

    def _respond(self, head: bool) -> None:
        self._head = head
        try:
            if not self._host_allowed():
                raise ViewerRequestError(
                    403, "this viewer answers requests to its own loopback address only"
                )
            url = urllib.parse.urlsplit(self.path)
            params = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            if url.path == "/":
                self._send(200, asset(PAGE), "text/html; charset=utf-8", cache=False)
                return
            if url.path.startswith("/static/"):
                name = url.path[len("/static/") :]
                if name not in ASSETS:
                    raise ViewerRequestError(404, "no such file")
                self._send(200, asset(name), ASSETS[name], cache=False)
                return
            for pattern, name in _ROUTES:
                match = pattern.fullmatch(url.path)
                if match:
                    ids = [int(g) for g in match.groups()]
                    getattr(self, f"_api_{name}")(params, *ids)
                    return
            raise ViewerRequestError(404, f"no such page: {url.path[:80]}")
        except ViewerRequestError as e:
            self._json({"error": str(e)}, e.status)
        except (RLDSWriterError, OSError, ValueError) as e:
            # A damaged record, a vanished shard: one line for the page, not a dropped answer.
            if isinstance(e, BrokenPipeError | ConnectionResetError):
                return
            self.log_error("%s", e)
            self._json({"error": f"{type(e).__name__}: {e}"}, 500)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away mid-answer (a seek, a closed tab)

    def _host_allowed(self) -> bool:
        if not self.server.check_host:
            return True
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name)

    # -- API -----------------------------------------------------------------

    def _split(self, params: dict[str, str], refresh: bool = False) -> Any:
        if refresh:  # the list follows new commits; an episode's frames need not look
            self.server.source.refresh()
        try:
            return self.server.source.split(params.get("split"))
        except KeyError:
            raise ViewerRequestError(404, f"no split {params.get('split', '')[:80]!r}") from None

    def _query(self, params: dict[str, str]) -> listing.Query:
        try:
            return listing.Query.parse(params)
        except ValueError as e:
            raise ViewerRequestError(400, str(e)) from None

    def _api_dataset(self, params: dict[str, str]) -> None:
        self.server.source.refresh()
        self._json(self.server.source.describe())

    def _api_episodes(self, params: dict[str, str]) -> None:
        index = self._split(params, refresh=True)
        self._json(listing.page(index, self._query(params)))

    def _episode(self, params: dict[str, str], episode: int) -> Any:
        index = self._split(params)
        if episode >= len(index):
            raise ViewerRequestError(
                404, f"split {index.split!r} has {len(index)} episodes, no {episode}"
            )
        try:
            return index, self.server.source.episode(index.split, episode)
        except DecodeError as e:
            raise ViewerRequestError(422, str(e)) from None

    def _api_episode(self, params: dict[str, str], episode: int) -> None:
        index, data = self._episode(params, episode)
        self._json({"id": episode, "split": index.split, **index.rows[episode], **data.overview()})

    def _api_steps(self, params: dict[str, str], episode: int) -> None:
        _, data = self._episode(params, episode)
        try:
            start = int(params.get("start", "0"))
            stop = int(params.get("stop", str(start + 1)))
        except ValueError:
            raise ViewerRequestError(400, "start and stop: expected step numbers") from None
        self._json(data.steps(start, stop))

    def _api_next(self, params: dict[str, str], episode: int) -> None:
        index = self._split(params, refresh=True)
        step = -1 if params.get("dir") == "-1" else 1
        self._json({"id": listing.neighbour(index, self._query(params), episode, step)})

    def _api_frame(self, params: dict[str, str], episode: int, camera: int, step: int) -> None:
        _, data = self._episode(params, episode)
        if camera >= len(data.frames):
            raise ViewerRequestError(404, f"no camera {camera}")
        if step >= len(data.frames[camera]):
            raise ViewerRequestError(
                404, f"camera {camera} has {len(data.frames[camera])} frames, no {step}"
            )
        try:
            body, media_type = data.frame(camera, step)
        except DecodeError as e:
            raise ViewerRequestError(415, str(e)) from None
        self._send_range(body, media_type)

    # -- responses -------------------------------------------------------------

    def _send_range(self, body: bytes, media_type: str) -> None:
        """The body, or the one byte range asked for (206), or 416 past its end."""
        size = len(body)
        match = _RANGE.fullmatch((self.headers.get("Range") or "").strip())
        if match is None or match.groups() == ("", ""):
            # No range, another unit, several ranges or bad syntax: the whole body
            # is a valid answer to each (RFC 9110, 14.2).
            self._send(200, body, media_type, cache=True)
            return
        first, last = match.groups()
        if first == "":
            start, stop = max(0, size - int(last)), size
        else:
            start, stop = int(first), size if last == "" else min(size, int(last) + 1)
        if start >= size or start >= stop:
            self._unsatisfiable(size)
            return
        extra = {"Content-Range": f"bytes {start}-{stop - 1}/{size}"}
        self._send(206, body[start:stop], media_type, cache=True, extra=extra)

    def _unsatisfiable(self, size: int) -> None:
        extra = {"Content-Range": f"bytes */{size}"}
        self._send(416, b"", "application/octet-stream", extra=extra)

    def _json(self, value: Any, status: int = 200) -> None:
        body = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        self._send(status, body, "application/json")

    def _send(
        self,
        status: int,
        body: bytes,
        media_type: str,
        cache: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Cache-Control", "private, max-age=600" if cache else "no-store")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not self._head:
            self.wfile.write(body)


class ViewerServer(http.server.ThreadingHTTPServer):
    """A threaded HTTP server over one `ViewerSource`.

    Attributes:
      source: the dataset served.
      check_host: refuse requests whose `Host` is not a loopback name (on by
        default; off when the user binds another address).
      log: log each request on stderr.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], source: ViewerSource, log: bool = False):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.source = source
        self.log = log
        self.check_host = is_loopback(address[0])
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


def start(
    source: ViewerSource, host: str = "127.0.0.1", port: int = 0, log: bool = False
) -> tuple[ViewerServer, threading.Thread]:
    """Starts serving `source` on a thread; returns the server (`.url`) and the thread.

    Stop it with `server.shutdown(); server.server_close()`.
    """
    server = ViewerServer((host, port), source, log=log)
    thread = threading.Thread(target=server.serve_forever, name="rlds-writer-view", daemon=True)
    thread.start()
    return server, thread
