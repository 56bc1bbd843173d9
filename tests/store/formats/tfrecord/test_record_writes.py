"""The extension's record writes (`_zero_ahead.write_all`): `storage.writev_all` in C.

A record goes out whole and in order whatever its parts (empty ones, one
larger than a 1 MiB `writev`, more than IOV_MAX of them), in `writev`s of at
most 1 MiB, and a short write is resumed where it stopped: a file size limit
(`RLIMIT_FSIZE`) makes the kernel write up to the limit and refuse the rest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rlds_writer.store.formats.tfrecord import write_ahead

pytestmark = pytest.mark.skipif(
    write_ahead.zero_ahead_type() is None, reason="the _zero_ahead extension is not built"
)


def test_parts_are_written_whole_and_in_order_however_they_are_cut(tmp_path):
    write_all = write_ahead.parts_writer()
    parts = [
        b"",
        b"head",
        os.urandom(3 << 20),  # cut across three 1 MiB writevs
        memoryview(b""),
        *[bytes([i % 256]) * (i % 7) for i in range(3000)],  # over IOV_MAX parts
        bytearray(os.urandom(1 << 20)),
    ]
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, parts)
        write_all(fd, [b"tail"])  # at the file's position, after the rest
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(bytes(p) for p in parts) + b"tail"
    with pytest.raises(TypeError):
        write_all(fd, b"not a list of parts")
    with pytest.raises(OSError):
        write_all(fd, [b"x"])  # closed


@pytest.mark.parametrize("size", [100_000, 3_000_000])  # with the GIL kept, and without
def test_a_short_write_is_resumed_where_it_stopped(tmp_path, size):
    # Past RLIMIT_FSIZE the kernel writes up to the limit (a short write) and
    # refuses the next write (EFBIG): the file ends exactly at the limit, and
    # the error is the resumed write's.
    limit = size // 2 + 12_345
    code = textwrap.dedent(
        f"""
        import errno, os, resource, signal
        from rlds_writer.store.formats.tfrecord import write_ahead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        fd = os.open({str(tmp_path / "file")!r}, os.O_WRONLY | os.O_CREAT, 0o644)
        data = bytes(range(256)) * ({size} // 256 + 1)
        try:
            write_ahead.parts_writer()(fd, [data[:1000], data[1000:{size}]])
        except OSError as error:
            assert error.errno == errno.EFBIG, error
        else:
            raise AssertionError("no error past the size limit")
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    data = (tmp_path / "file").read_bytes()
    assert len(data) == limit
    assert data == (bytes(range(256)) * (size // 256 + 1))[:limit]
