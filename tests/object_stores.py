"""Object-store servers for the tests: moto's S3 and the GCS emulator, on loopback.

Each server is a subprocess started once per session on 127.0.0.1 at a free
port (startup bounded, killed at the end). `s3_bucket` and `gcs_bucket` make
a fresh bucket per test and point the clients at the server through the
environment (monkeypatched), the way a user configures s3fs and gcsfs:
`AWS_ENDPOINT_URL` with dummy credentials, `STORAGE_EMULATOR_HOST`. Child
processes a test starts inherit that environment. `object_store` runs a
test against both. Imported into tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

_HOST = "127.0.0.1"
_STARTUP_SECONDS = 60


@dataclass(frozen=True)
class Bucket:
    """A fresh bucket on a test server.

    Attributes:
      protocol: "s3" or "gs".
      name: the bucket's name.
      env: the environment variables that point clients at the server.
    """

    protocol: str
    name: str
    env: dict[str, str]

    @property
    def url(self) -> str:
        """`s3://name` or `gs://name`."""
        return f"{self.protocol}://{self.name}"

    def path(self, *names: str) -> str:
        """A path in the bucket: `bucket.path("run")` is `s3://name/run`."""
        return "/".join([self.url, *names])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((_HOST, 0))
        return s.getsockname()[1]


def _tool(name: str) -> str:
    # The server scripts are installed next to the interpreter running the tests.
    path = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install the test extra)")
    return found


def _start(command: list[str], port: int, log_path: str) -> subprocess.Popen:
    log = open(log_path, "wb")  # noqa: SIM115 - kept open for the server's life
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + _STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            socket.create_connection((_HOST, port), timeout=0.5).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    process.wait()
    with open(log_path, "rb") as f:
        tail = f.read()[-2000:].decode(errors="replace")
    pytest.fail(f"{command[0]} did not start on {_HOST}:{port}: {tail}")


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=30)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory) -> Iterator[str]:
    """The endpoint URL of a moto S3 server on loopback, for the session."""
    port = _free_port()
    log = str(tmp_path_factory.mktemp("moto") / "server.log")
    process = _start([_tool("moto_server"), "-H", _HOST, "-p", str(port)], port, log)
    yield f"http://{_HOST}:{port}"
    _stop(process)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory) -> Iterator[str]:
    """The address of a gcp-storage-emulator on loopback (in memory), for the session."""
    port = _free_port()
    log = str(tmp_path_factory.mktemp("gcs") / "server.log")
    command = [_tool("gcp-storage-emulator"), "start", "--host", _HOST, "--port", str(port)]
    process = _start([*command, "--in-memory", "--quiet"], port, log)
    yield f"http://{_HOST}:{port}"
    _stop(process)


def s3_env(endpoint: str) -> dict[str, str]:
    """What points boto (s3fs) at `endpoint`, with dummy credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def gcs_env(endpoint: str) -> dict[str, str]:
    """What points gcsfs at the emulator `endpoint`, anonymously (no credential lookup).

    gcsfs 2026's default class first asks the bucket's layout over gRPC (with
    TLS, which the emulator does not speak: a minute of retries per bucket);
    `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` selects the plain JSON-API class.
    """
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "FSSPEC_GCS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }


def _point_clients(monkeypatch, env: dict[str, str], protocols: tuple[str, ...]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import fsspec
    import fsspec.config
    from fsspec.registry import _registry

    from rlds_writer.store.storage import storage

    if "FSSPEC_GCS_TOKEN" in env:
        # This process read FSSPEC_* and GCSFS_* at import, before the fixture set them.
        from gcsfs.core import GCSFileSystem

        for name in ("gcs", "gs"):
            monkeypatch.setitem(fsspec.config.conf, name, {"token": "anon"})
            monkeypatch.setitem(_registry, name, GCSFileSystem)
    # Clients cached by fsspec and by rlds_writer's seam were made for other settings.

    for protocol in protocols:
        fsspec.get_filesystem_class(protocol).clear_instance_cache()
        storage._FSSPEC.pop(protocol, None)


def _new_bucket(protocol: str) -> str:
    import fsspec

    name = f"rlds-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem(protocol).mkdir(name)
    return name


@pytest.fixture
def s3_bucket(moto_server, monkeypatch) -> Bucket:
    """A fresh S3 bucket on the moto server; clients (and child processes) point at it."""
    pytest.importorskip("s3fs")
    env = s3_env(moto_server)
    _point_clients(monkeypatch, env, ("s3",))
    return Bucket("s3", _new_bucket("s3"), env)


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch) -> Bucket:
    """A fresh GCS bucket on the emulator; clients (and child processes) point at it."""
    env = gcs_env(gcs_emulator)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    pytest.importorskip("gcsfs")
    _point_clients(monkeypatch, env, ("gs", "gcs"))
    return Bucket("gs", _new_bucket("gs"), env)


@pytest.fixture(params=["s3", "gs"])
def object_store(request) -> Bucket:
    """A fresh bucket on each test server in turn (S3 on moto, then GCS on the emulator)."""
    return request.getfixturevalue("s3_bucket" if request.param == "s3" else "gcs_bucket")
