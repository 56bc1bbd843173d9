"""A shard dataset_info.json lists that is gone: one project error naming it, from every reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers_core import run_cli

import rlds_writer
from rlds_writer.errors import MissingShardError


@pytest.fixture()
def damaged(tmp_path):
    """A Catch dataset of 3 shards (2 episodes each) whose middle shard was deleted."""
    path = tmp_path / "ds"
    env = rlds_writer.EnvLogger(
        rlds_writer.Catch(seed=0), data_directory=path, max_episodes_per_file=2
    )
    for _ in range(6):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(1)
    env.close()
    shards = sorted(path.glob("*.tfrecord-*"))
    assert len(shards) == 3
    shards[1].unlink()
    return path, shards[1]


def _check(error: BaseException, shard: Path) -> None:
    # Still a FileNotFoundError (code catching that keeps working), and the project's.
    assert isinstance(error, MissingShardError) and isinstance(error, FileNotFoundError)
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"{shard}: shard 1 of split 'train' is listed in dataset_info.json")
    assert f"rlds-writer recover {shard.parent}" in message


def test_a_missing_listed_shard_is_one_project_error_from_every_reader(damaged):
    path, shard = damaged
    with pytest.raises(MissingShardError) as raised:
        sum(1 for _ in rlds_writer.open_dataset(path)["train"])
    _check(raised.value, shard)

    torch_data = pytest.importorskip("rlds_writer.read.torch_data")
    with pytest.raises(MissingShardError) as raised:
        sum(1 for _ in torch_data.RLDSIterableDataset(os.fspath(path)))
    _check(raised.value, shard)

    from rlds_writer.interop import package_sources

    with pytest.raises(MissingShardError) as raised:
        package_sources.split_shards([path])
    assert "rlds-writer recover" in str(raised.value)

    # The command line: one line, exit code 1, no traceback (`run_cli` fails on one).
    for argv in (
        ["export", path, path.parent / "out", "--to", "d3rlpy"],
        ["stats", path],
    ):
        result = run_cli(*argv, expect=1)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"rlds-writer {argv[0]}: error: {shard}: shard 1 of split 'train'")
        assert "rlds-writer recover" in line
