"""An image-encoding process: PNG/JPEG-encodes frames that the recorder keeps in shared memory.

Started by `image_processes.ImageProcessPool` as `python -I -c BOOTSTRAP PATH
REQUESTS RESULTS` (isolated: nothing is imported from the working directory or
PYTHONPATH; PATH lists where the recording process found this package, numpy
and Pillow), with two sockets inherited from the recording process:

* REQUESTS (`SOCK_SEQPACKET`, one message per task): a pickled
  `(task, codec, quality, offset, count, shape, dtype)`: encode `count`
  frames of `shape` and `dtype` found at `offset` in the recorder's
  shared-frame file (`shared_frames`), whose descriptor comes with the first
  task as ancillary data.
* RESULTS (a stream): per task, a header `RESULT_HEADER` (task, payload
  length, status), then for status 0 the encoded frames as `BytesList`
  entries (a slice of the feature's payload, written as it is); for status 1
  an error message.

The process exits when the recording process closes REQUESTS or dies.
Encoding runs here, not on a thread of the recorder, because Pillow holds the
GIL for part of each JPEG; separate processes use every core.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import struct
import sys

import numpy as np

from rlds_writer.store.features.wire import bytes_entries
from rlds_writer.store.images.image_codecs import encode_jpeg, encode_png

RESULT_HEADER = struct.Struct("<QQB")
OK, FAILED = 0, 1


def _encode(codec: str, quality: int, frames: np.ndarray) -> list[bytes]:
    if codec == "jpeg":
        return [encode_jpeg(frame, quality) for frame in frames]
    return [encode_png(frame) for frame in frames]


def serve(requests: socket.socket, results: socket.socket) -> None:
    """Answers tasks until REQUESTS is closed."""
    fd = -1
    view: mmap.mmap | None = None
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(requests, 1 << 16, 1)
        except OSError:
            return
        if not message:
            return
        if fds:
            fd, view = fds[0], None
        task, codec, quality, offset, count, shape, dtype = pickle.loads(message)
        try:
            dtype = np.dtype(dtype)
            items = count * int(np.prod(shape, dtype=np.int64))
            if view is None or offset + items * dtype.itemsize > len(view):
                # The file grows as the recorder takes chunks: map all of it again.
                view = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
            frames = np.frombuffer(view, dtype, items, offset).reshape((count, *shape))
            entries = bytes_entries(_encode(codec, quality, frames))
            del frames
            results.sendall(RESULT_HEADER.pack(task, len(entries), OK) + entries)
        except Exception as e:  # noqa: BLE001 - reported to the recorder, which names the field
            text = f"{type(e).__name__}: {e}".encode("utf-8", "replace")
            results.sendall(RESULT_HEADER.pack(task, len(text), FAILED) + text)


def main(argv: list[str]) -> None:
    """Serves the sockets whose descriptors are `argv[0]` (REQUESTS) and `argv[1]` (RESULTS)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    except (AttributeError, OSError):
        pass
    requests = socket.socket(fileno=int(argv[0]))
    results = socket.socket(fileno=int(argv[1]))
    try:
        serve(requests, results)
    except (BrokenPipeError, ConnectionResetError):  # the recorder is gone
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
