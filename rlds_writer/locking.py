"""One writer per dataset directory: a lock file naming its holder.

The lock file holds the writer's host and pid. A lock left by a dead process on
this host is stale and is taken over with a warning; a lock held by a live
process, or by a process on another host, refuses the new writer.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

from etils import epath

from rlds_writer import layout
from rlds_writer.errors import LockedError

_log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DirectoryLock:
    """An exclusive lock on a dataset directory.

    Args:
      directory: the dataset directory.
    """

    def __init__(self, directory: epath.PathLike):
        self.path = epath.Path(directory) / layout.LOCK
        self._held = False

    def _content(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})

    def acquire(self) -> None:
        """Takes the lock.

        Raises:
          LockedError: if another live writer holds the directory.
        """
        for _ in range(3):
            if self._try_create():
                self._held = True
                return
            holder = self._read_holder()
            if holder is None:
                continue  # removed or half-written meanwhile; retry
            host, pid = holder.get("host"), holder.get("pid")
            if host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
                _log.warning(
                    "taking over the stale lock of dead writer pid %d on %s (%s)",
                    pid,
                    host,
                    self.path,
                )
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
                continue
            raise LockedError(
                f"{self.path.parent} is being written by another writer (host {host}, pid {pid}). "
                "Give each writer its own subdirectory (see rlds_writer.writer_directory) and "
                "merge them afterwards, or remove the lock file "
                f"{self.path} if that writer is gone."
            )
        raise LockedError(f"could not take the lock {self.path}")

    def _try_create(self) -> bool:
        if layout.is_local(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(self._content())
            return True
        if self.path.exists():
            return False
        self.path.write_text(self._content())
        return True

    def _read_holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def release(self) -> None:
        if self._held:
            self._held = False
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
