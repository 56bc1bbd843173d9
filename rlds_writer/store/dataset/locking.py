"""One writer per dataset directory: a lock file naming its holder.

On a local file system (including NFS, which supports `flock` across hosts)
the lock is an `flock` on `.rlds_writer.lock`, held for as long as the writer
runs. The kernel drops it when the process dies, even by SIGKILL or an OOM
kill, so a dead writer can never keep a directory locked; the file's content
(host, pid, process start time) only serves the messages. A lock file left
behind by a dead writer is taken over with a warning.

On remote paths (`gs://`, `s3://`, ...) there is no `flock`: the lock is the
file's existence, created with the store's conditional create (S3
`If-None-Match: *`, GCS `ifGenerationMatch=0`; see `store.storage.storage`), so two
writers racing for it cannot both win; a protocol without one is refused.
A lock whose holder is on this host and dead (or whose pid now belongs to
another process, told apart by its start time) is stale and taken over with
a warning. A lock held by a process on another host is never taken over:
remove the file by hand if that host is gone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import LockedError
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage import file_io, storage
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None


def _host() -> str:
    # `socket.gethostname()` is uname's node name; `socket`'s import is 2-3 ms
    # of a short recording.
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket

    return socket.gethostname()


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3 onwards of /proc/<pid>/stat (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after
    # the last ')' start at field 3 (state).
    return stat[stat.rfind(b")") + 2 :].split()


def process_start_time(pid: int) -> int | None:
    """Returns the start time of a process in clock ticks since boot (Linux), or None."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19])  # starttime is field 22
    except (TypeError, IndexError, ValueError):
        return None


def _process_state(pid: int) -> bytes | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether process `pid` on this host runs (zombies count as dead).

    Args:
      pid: the process id.
      start_time: the start time recorded with the pid; if given and the
        process now running under that pid started at another time, the pid
        was reused and the recorded process is dead.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _process_state(pid) == b"Z":
        return False
    if start_time is not None:
        now = process_start_time(pid)
        if now is not None and now != start_time:
            return False
    return True


def describe_holder(holder: dict[str, Any] | None) -> str:
    """Returns `host H, pid P, since T` for a lock file's content."""
    if not holder:
        return "unknown holder"
    since = holder.get("time")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        if isinstance(since, int | float)
        else "?"
    )
    return (
        f"host {holder.get('host')}, pid {holder.get('pid')}, "
        f"{holder.get('purpose', 'write')} since {when}"
    )


def read_holder(directory: epath.PathLike) -> dict[str, Any] | None:
    """Returns the content of a directory's lock file, or None if there is none."""
    path = as_path(directory) / layout.LOCK
    try:
        if file_io.is_local(path):
            # Never read through a link: a crafted lock could point anywhere.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                return _read_fd(fd)
            finally:
                os.close(fd)
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def is_locked(directory: epath.PathLike) -> bool:
    """Whether a live process holds the directory's lock (local paths: by `flock`)."""
    path = as_path(directory) / layout.LOCK
    if not path.exists():
        return False
    if file_io.is_local(path) and fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, OSError):  # gone, or a link we do not follow
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            pass
        finally:
            os.close(fd)
        return False
    holder = read_holder(directory)
    return holder is not None and not _stale(holder, path)


def _stale(holder: dict[str, Any], path: Any = None) -> bool:
    pid = holder.get("pid")
    if holder.get("host") != _host() or not isinstance(pid, int):
        return False
    if pid == os.getpid() and holder.get("start_time") == process_start_time(pid):
        # This very process wrote it: stale unless one of its locks holds it now
        # (a release whose delete failed leaves it behind; the store was gone).
        return os.fspath(path) not in _HELD if path is not None else False
    return not pid_alive(pid, holder.get("start_time"))


# The lock files this process holds through the store (remote paths).
_HELD: set[str] = set()


class DirectoryLock:
    """An exclusive lock on a dataset directory.

    Args:
      directory: the dataset directory.
      purpose: what the holder does (`write`, `recover`, `merge`), for messages.
    """

    def __init__(self, directory: epath.PathLike, purpose: str = "write"):
        self.directory = as_path(directory)
        self.path = self.directory / layout.LOCK
        self.purpose = purpose
        self._fd: int | None = None
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    def _content(self) -> str:
        return json.dumps(
            {
                "host": _host(),
                "pid": os.getpid(),
                "start_time": process_start_time(os.getpid()),
                "time": time.time(),
                "purpose": self.purpose,
            }
        )

    def _refuse(self, holder: dict[str, Any] | None) -> LockedError:
        who = describe_holder(holder)
        if self.purpose == "write":
            advice = (
                "Only one writer may write a dataset directory: give each writer its own "
                "subdirectory (rlds_writer.store.writer_directory(root, writer_id)) and combine "
                "them afterwards with rlds_writer.merge or `rlds-writer merge`."
            )
        else:
            advice = f"Run {self.purpose} again once that process has finished."
        return LockedError(
            f"{self.directory} is locked by another process ({who}). {advice} "
            f"If that process is gone (e.g. on another host), remove {self.path}."
        )

    def acquire(self) -> None:
        """Takes the lock.

        Raises:
          LockedError: if another live process holds the directory.
        """
        if self._held:
            raise RuntimeError(f"{self.path} is already held by this lock object")
        file_io.refuse_symlink(self.path, "lock file")
        if file_io.is_local(self.path) and fcntl is not None:
            try:
                self._acquire_flock()
                return
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                _log.warning("flock unsupported on %s (%s); using a pid lock file", self.path, e)
        self._acquire_pid_file()

    # ------------------------------------------------------------- flock

    def _acquire_flock(self) -> None:
        busy = 0
        for _ in range(40):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_fd(fd)
                os.close(fd)
                busy += 1
                # `is_locked` (info, validate) holds a shared lock for an instant;
                # only a lock that stays taken refuses.
                if busy > 10:
                    raise self._refuse(holder) from None
                time.sleep(0.02)
                continue
            except BaseException:
                os.close(fd)
                raise
            # A holder releasing the lock unlinks the file before unlocking it;
            # if we locked an unlinked file, start over on the new one.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = _read_fd(fd)
            if previous:
                # The holder died without releasing (the kernel dropped its flock).
                _log.warning(
                    "taking over the stale lock of a writer that is gone (%s) on %s",
                    describe_holder(previous),
                    self.directory,
                )
            content = self._content().encode()
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, content, 0)
            except BaseException:
                os.close(fd)  # a full disk must not leave the lock held
                raise
            self._fd = fd
            self._held = True
            return
        raise LockedError(f"could not take the lock {self.path}: it keeps being replaced")

    # ---------------------------------------------------------- pid file

    def _acquire_pid_file(self) -> None:
        for _ in range(3):
            if self._try_create():
                self._held = True
                _HELD.add(os.fspath(self.path))
                return
            holder = read_holder(self.directory)
            if holder is None:
                time.sleep(0.05)  # removed or half-written meanwhile; retry
                continue
            if not _stale(holder, self.path):
                raise self._refuse(holder)
            _log.warning(
                "taking over the stale lock of dead writer (%s) on %s",
                describe_holder(holder),
                self.directory,
            )
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        raise LockedError(f"could not take the lock {self.path}")

    def _try_create(self) -> bool:
        if file_io.is_local(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(self._content())
            return True
        # The store's conditional create (S3 If-None-Match, GCS ifGenerationMatch=0);
        # a protocol without one refuses (StorageNotSupportedError).
        path = os.fspath(self.path)
        return storage.storage_for(path).create_exclusive(path, self._content().encode())

    def release(self) -> None:
        """Releases the lock (idempotent) and removes the lock file."""
        if not self._held:
            return
        self._held = False
        _HELD.discard(os.fspath(self.path))
        try:
            if self._fd is not None:
                # Emptied first: closing an unlinked file that still holds
                # data makes ext4 free its blocks there and then (~0.15 ms).
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
                # A directory turned read-only keeps the file: dropping the flock
                # below still frees the lock (the next taker overwrites the file).
                with contextlib.suppress(OSError):
                    self.path.unlink()
            else:
                self._remove_pid_file()
        finally:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)  # drops the flock

    def _remove_pid_file(self) -> None:
        # Never raises: a release runs in `close()` and `finally` blocks, where an
        # error here would hide the one that matters (a failed upload, say).
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - a store gone, a directory turned read-only
            _log.warning(
                "could not remove the lock %s (%s); the next writer on this host takes it "
                "over once this process has ended; from another host, delete it by hand",
                self.path,
                e,
            )

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read_fd(fd: int) -> dict[str, Any] | None:
    try:
        data = os.pread(fd, 4096, 0)
        return json.loads(data) if data else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
