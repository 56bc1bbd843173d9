"""A dataset directory that turns read-only under a writer: its error, then recovery in-process.

The directory is made read-only for real, with a read-only bind mount of it
over itself (skipped where mounting is not allowed). Files the writer already
has open stay writable, as on a file system remounted read-only under it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import rlds_writer
from rlds_writer.errors import WriterFailedError


@pytest.fixture
def read_only_later(tmp_path):
    """Yields `(directory, make_read_only)`; undoes the mount afterwards."""
    directory = tmp_path / "ds"
    mounted = []

    def make_read_only():
        path = os.fspath(directory)
        if subprocess.run(["mount", "--bind", path, path], capture_output=True).returncode:
            pytest.skip("cannot bind-mount here (needs root)")
        mounted.append(path)
        subprocess.run(["mount", "-o", "remount,ro,bind", path], check=True)

    yield directory, make_read_only
    for path in mounted:
        subprocess.run(["umount", "-l", path], check=False)


def test_close_on_a_read_only_directory_raises_the_writers_error_and_recover_works_after(
    read_only_later,
):
    directory, make_read_only = read_only_later
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=directory)
    ts = env.reset()
    while not ts.last():
        ts = env.step(1)
    env.reset()
    env.step(0)  # an open episode: close() writes it, cut short
    make_read_only()
    with pytest.raises(WriterFailedError, match="Read-only file system"):
        env.close()
    subprocess.run(["umount", "-l", os.fspath(directory)], check=True)
    # The same process may recover at once: its own lock is gone.
    report = rlds_writer.recover(directory)
    assert report.splits == {"train": [2]}
    episodes = list(rlds_writer.open_dataset(directory).episodes())
    assert [e["end_reason"] for e in episodes] == [b"terminated", b"cut_short"]
