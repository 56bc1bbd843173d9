"""One TF-free read path: stats without TensorFlow, and damage reported alike by every command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import crash_child
import pytest

from rlds_writer.store.dataset import layout
from rlds_writer.store.formats.tfrecord import tfrecord

BIN = Path(sys.executable).parent / "rlds-writer"
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine") / "ds"
    crash_child.write_dataset(directory, range(6), max_episodes_per_file=3)
    return directory


@pytest.fixture
def corrupt(pristine, tmp_path):
    """A copy whose shard 1 has a data-CRC error in record 1; returns (dir, expected text)."""
    directory = tmp_path / "ds"
    shutil.copytree(pristine, directory)
    shard = directory / layout.shard_name(crash_child.NAME, "train", "tfrecord", 1)
    offset = tfrecord.scan(shard).spans[1][0]
    data = bytearray(shard.read_bytes())
    data[offset + tfrecord.HEADER_SIZE + 7] ^= 0x02
    shard.write_bytes(bytes(data))
    return directory, f"{shard.name}: record 1 at byte offset {offset} is corrupt"


def test_statistics_never_import_tensorflow(pristine):
    code = (
        "import sys\n"
        "for m in ('tensorflow', 'tensorflow_datasets'):\n"
        "    sys.modules[m] = None  # any import of it fails\n"
        "import rlds_writer\n"
        "stats = rlds_writer.maintain.compute_statistics(sys.argv[1])\n"
        "print(stats['splits']['train']['episodes'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(pristine)], capture_output=True, text=True, env=ENV
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6"


@pytest.mark.parametrize("command", ["stats", "info", "validate"])
def test_every_command_reports_a_corrupt_record_in_one_line_with_its_place(corrupt, command):
    directory, where = corrupt
    result = subprocess.run(
        [str(BIN), command, str(directory)], capture_output=True, text=True, env=ENV, timeout=300
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    lines = [ln for ln in output.splitlines() if where in ln]
    assert lines, output
    for line in lines:  # each mention is whole on its line, with the advice
        assert "rlds-writer recover" in line, line
    assert result.returncode != 0 or command == "info"
