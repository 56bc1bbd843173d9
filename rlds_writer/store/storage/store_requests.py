"""Requests to an object store: bounded in time, retried, and their errors worded.

Every call `store.storage.storage_remote` makes to fsspec goes through `call`. An
attempt may take at most `RLDS_WRITER_STORE_TIMEOUT` seconds (default 60)
plus one second per MiB it carries, after which it is cancelled (fsspec's
async file systems, s3fs and gcsfs, cancel the request); a failed attempt is
retried up to `RLDS_WRITER_STORE_ATTEMPTS` attempts in all (default 3), with
a pause doubling from half a second. So a stalled or black-holed store fails
a commit or a `close()` in bounded time instead of blocking it forever.

Errors come out as ours, naming the object and what to check: a refused
credential is `StorageAccessError`, a missing bucket `BucketNotFoundError`,
anything else after the last attempt (a reset, a timeout, an aiohttp or
botocore error that is no `OSError`) `StorageError`. A missing object stays
the `FileNotFoundError` the callers expect, an existing one `FileExistsError`.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any

from rlds_writer.errors import (
    BucketNotFoundError,
    RLDSWriterError,
    StorageAccessError,
    StorageError,
)

DEFAULT_TIMEOUT = 60.0
DEFAULT_ATTEMPTS = 3
_FIRST_PAUSE = 0.5
_MIB = 1 << 20
_LOOKUPS = ("exists", "isdir", "isfile", "size", "ls", "info")
# Errors that are answers, not faults: passed on as they are, never retried.
_ANSWERS = (
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    RLDSWriterError,
    ValueError,
    TypeError,
    NotImplementedError,
)


def _number(variable: str, default: float, kind: type) -> Any:
    text = os.environ.get(variable)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(
            f"{variable} must be a positive {'integer' if kind is int else 'number'}, got {text!r}"
        )
    return value


def timeout_seconds() -> float:
    """Seconds one attempt of a request may take (before its per-MiB allowance)."""
    return float(_number("RLDS_WRITER_STORE_TIMEOUT", DEFAULT_TIMEOUT, float))


def attempts() -> int:
    """How many attempts a request gets before its error is raised."""
    return int(_number("RLDS_WRITER_STORE_ATTEMPTS", DEFAULT_ATTEMPTS, int))


def bucket_of(path: str) -> str:
    """`bucket` for `s3://bucket/key`."""
    return path.partition("://")[2].split("/", 1)[0]


def endpoint(protocol: str) -> str:
    """Where the clients send requests for `protocol`, as the environment says."""
    if protocol in ("s3", "s3a"):
        url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return f"endpoint {url} (AWS_ENDPOINT_URL)" if url else "AWS's endpoint for the region"
    if protocol in ("gs", "gcs"):
        host = os.environ.get("STORAGE_EMULATOR_HOST")
        return f"endpoint {host} (STORAGE_EMULATOR_HOST)" if host else "storage.googleapis.com"
    return f"the {protocol}:// file system"


def _credentials(protocol: str) -> str:
    if protocol in ("s3", "s3a"):
        return "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE and ~/.aws/credentials)"
    if protocol in ("gs", "gcs"):
        return "GOOGLE_APPLICATION_CREDENTIALS (or `gcloud auth application-default login`)"
    return "the file system's credentials"


def access_error(path: str, cause: BaseException) -> StorageAccessError:
    """The store refused the credentials for `path`."""
    protocol = path.partition("://")[0]
    return StorageAccessError(
        f"{path}: the store refused access ({_said(cause)}): check {_credentials(protocol)} "
        f"and that they may read and write bucket {bucket_of(path)!r} at {endpoint(protocol)}",
        path,
    )


def bucket_error(path: str) -> BucketNotFoundError:
    """`path`'s bucket does not exist (or these credentials do not see it)."""
    protocol = path.partition("://")[0]
    return BucketNotFoundError(
        f"{path}: bucket {bucket_of(path)!r} does not exist at {endpoint(protocol)}: check the "
        "bucket's name and the endpoint, or create the bucket first (rlds_writer creates "
        "objects, never buckets)",
        path,
    )


def _said(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _no_bucket(error: FileNotFoundError) -> bool:
    text = str(error).lower()
    return "nosuchbucket" in text or ("bucket" in text and "not exist" in text)


def call(
    fs: Any,
    name: str,
    path: str,
    *args: Any,
    doing: str = "reading",
    nbytes: int = 0,
    retry: bool = True,
    writes: bool = False,
    **kwargs: Any,
) -> Any:
    """`fs.<name>(*args, **kwargs)`, bounded in time, retried, its errors worded.

    Args:
      fs: the fsspec file system.
      name: the method (`put_file`, `cat_file`, ...).
      path: the object the request is for (`s3://bucket/key`), for messages.
      doing: what the request does, for messages (`uploading`, ...).
      nbytes: bytes the request carries (each MiB adds a second to its bound).
      retry: whether a failed attempt may be repeated (not for a conditional create).
      writes: the request creates the object (a missing object means a missing bucket).

    Raises:
      StorageAccessError, BucketNotFoundError, StorageError: see the module.
      FileNotFoundError: the object does not exist (reads).
    """
    if doing == "reading" and name in _LOOKUPS:
        doing = "looking up"
    tries = attempts() if retry else 1
    limit = timeout_seconds() + nbytes / _MIB
    last: BaseException | None = None
    for attempt in range(tries):
        try:
            return _bounded(fs, name, limit, *args, **kwargs)
        except _ANSWERS:
            raise
        except PermissionError as e:
            raise access_error(path, e) from e
        except FileNotFoundError as e:
            if writes or _no_bucket(e):
                raise bucket_error(path) from e
            raise
        except Exception as e:  # noqa: BLE001 - aiohttp, botocore, timeouts: retried
            last = e
        if attempt + 1 < tries:
            time.sleep(_FIRST_PAUSE * 2**attempt)
    protocol = path.partition("://")[0]
    raise StorageError(
        f"{path}: {doing} failed after {tries} attempt{'s' if tries > 1 else ''} of at most "
        f"{limit:.0f} s ({type(last).__name__}: {_said(last)}): check that the store is "
        f"reachable at {endpoint(protocol)} and the network; RLDS_WRITER_STORE_TIMEOUT and "
        "RLDS_WRITER_STORE_ATTEMPTS set the bounds",
        path,
    ) from last


def _bounded(fs: Any, name: str, limit: float, *args: Any, **kwargs: Any) -> Any:
    coroutine = getattr(fs, f"_{name}", None) if getattr(fs, "async_impl", False) else None
    if coroutine is None or not inspect.iscoroutinefunction(coroutine):
        return getattr(fs, name)(*args, **kwargs)
    from fsspec.asyn import sync

    # Cancelled on the file system's loop when the bound passes (FSTimeoutError).
    return sync(fs.loop, coroutine, *args, timeout=limit, **kwargs)


def worded(path: str, error: BaseException, doing: str = "reading") -> BaseException:
    """`error` raised by a file object's read, as `call` would have raised it."""
    if isinstance(error, _ANSWERS) or not isinstance(error, Exception):
        return error
    if isinstance(error, PermissionError):
        return access_error(path, error)
    if isinstance(error, FileNotFoundError):
        return bucket_error(path) if _no_bucket(error) else error
    protocol = path.partition("://")[0]
    return StorageError(
        f"{path}: {doing} failed ({type(error).__name__}: {_said(error)}): check that the "
        f"store is reachable at {endpoint(protocol)} and the network",
        path,
    )
