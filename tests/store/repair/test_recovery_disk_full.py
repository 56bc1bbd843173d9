"""A full disk during `recover` or an append-mode open: one-line error, nothing lost.

The disk is real: a 1 MiB tmpfs mounted for the test (skipped where mounting
is not allowed), filled with a filler file up to the page count each case
leaves free. tmpfs allocates whole pages, so the number of free pages picks
which write fails: 0 the lock, 1 the rewritten copy of a damaged shard, 2 the
new dataset_info.json (after the original shard was kept aside).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import crash_child
import pytest
from etils import epath

import rlds_writer
from rlds_writer.errors import DiskFullError
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats import shard_format
from rlds_writer.store.storage import file_io

PAGE = 4096
RLDS_WRITER = os.path.join(os.path.dirname(sys.executable), "rlds-writer")


@pytest.fixture
def small_disk(tmpfs):
    return epath.Path(tmpfs("1m"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """10 episodes in shards of 3, 3, 3, 1."""
    directory = tmp_path_factory.mktemp("pristine") / "ds"
    crash_child.write_dataset(directory, range(10), max_episodes_per_file=3)
    return directory


def _damaged_dataset_on(disk, pristine):
    """Copies the dataset onto `disk` and flips a bit in shard 0's first length header."""
    directory = disk / "ds"
    shutil.copytree(pristine, directory)
    shard = directory / layout.shard_name(crash_child.NAME, "train", "tfrecord", 0)
    data = bytearray(shard.read_bytes())
    data[3] ^= 0x40
    shard.write_bytes(bytes(data))
    return directory


def _fill(disk, free_pages):
    """Fills `disk`, then gives back `free_pages` pages; returns the filler's path."""
    filler = os.fspath(disk / "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as e:
        assert file_io.is_disk_full(e)
    os.ftruncate(fd, max(0, os.fstat(fd).st_size - free_pages * PAGE))
    os.close(fd)
    return filler


def _contents(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.name != layout.LOCK}


@pytest.mark.parametrize("free_pages", [0, 1, 2])
def test_recover_on_a_full_disk_is_one_line_loses_nothing_and_finishes_later(
    small_disk, pristine, free_pages
):
    directory = _damaged_dataset_on(small_disk, pristine)
    before = _contents(directory)
    filler = _fill(small_disk, free_pages)
    done = subprocess.run(
        [RLDS_WRITER, "recover", os.fspath(directory)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "the disk is full" in line and "run the same command again" in line
    after = _contents(directory)
    # Every file kept its bytes; at most the damaged shard's original was kept aside.
    damaged = layout.shard_name(crash_child.NAME, "train", "tfrecord", 0)
    kept = [name for name in after if name.startswith(shard_format.QUARANTINE_PREFIX)]
    assert set(after) - set(before) == set(kept) and len(kept) <= 1
    assert set(before) <= set(after)
    for name in kept:
        assert after[name] == before[damaged]
    changed = [name for name in before if after[name] != before[name]]
    # Only the damaged shard may have been rewritten, and only once its original was kept.
    assert changed in ([], [damaged]) and (not changed or kept)
    # No half-written temporary file is left filling the disk.
    assert not [p for p in directory.iterdir() if layout.TEMP_FILE.match(p.name)]

    os.unlink(filler)
    report = rlds_writer.recover(directory)
    assert report.splits["train"] == [2, 3, 3, 1]
    assert crash_child.check_records(directory) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert len([p for p in directory.iterdir() if p.name.startswith(".corrupt-")]) == 1


def test_append_on_a_full_disk_is_refused_cleanly_and_works_once_there_is_space(
    small_disk, pristine
):
    directory = _damaged_dataset_on(small_disk, pristine)
    filler = _fill(small_disk, 1)
    with pytest.raises(DiskFullError, match="the disk is full") as e:
        crash_child.write_dataset(directory, range(10, 12), mode="append")
    assert "\n" not in str(e.value)
    os.unlink(filler)
    crash_child.write_dataset(directory, range(10, 12), mode="append")
    assert crash_child.check_records(directory) == list(range(1, 12))
    assert crash_child.check_loaded(directory) == list(range(1, 12))
