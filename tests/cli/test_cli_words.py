"""The command line speaks its own words: options, not Python arguments; nouns that agree.

`--help` of `convert` and `export` lists every format of the registry the
code dispatches on (`rlds_writer.interop.FORMATS`, `EXPORT_FORMATS`).
"""

from __future__ import annotations

import pytest
from helpers_core import run_cli, skip_without_format

import rlds_writer
from rlds_writer.errors import counted
from rlds_writer.interop import EXPORT_FORMATS, FORMATS


def _run(*args, expect=0):
    # What the commands say, not the process around them: through main(), in this process.
    return run_cli(*args, expect=expect)


def _flat(text):
    return " ".join(text.split())


@pytest.mark.parametrize("command, registry", [("convert", FORMATS), ("export", EXPORT_FORMATS)])
def test_help_lists_every_format_of_the_registry(command, registry):
    own = _flat(_run(command, "--help").stdout)
    for name, fmt in registry.items():
        assert f"{name} {fmt.title}" in own, (name, own)
        assert _flat(fmt.path) in own, (name, own)
        if fmt.extra:
            assert f'needs pip install "rlds_writer[{fmt.extra}]"' in own, (name, own)
    # The one-line summary in `rlds-writer --help` names them all too (argparse
    # may wrap a line after a hyphen).
    top = _flat(_run("--help").stdout).replace("- ", "-")
    following = {"convert": " export ", "export": " info "}[command]
    summary = top.split(f" {command} ", 1)[1].split(following)[0]
    assert [name for name in registry if name in summary] == list(registry), summary


@pytest.fixture(scope="module")
def one_episode(tmp_path_factory):
    path = tmp_path_factory.mktemp("one") / "ds"
    result = _run("record", "--output", path, "--episodes", 1)
    return path, result.stdout


def test_a_dataset_already_there_is_refused_with_the_mode_option(one_episode, tmp_path):
    path, _ = one_episode
    skip_without_format("export", "lerobot")
    for argv in (
        ["record", "--output", path, "--episodes", 1, "--no-load-back"],
        ["convert", "--from", "lerobot", tmp_path / "lerobot", path],
    ):
        if argv[0] == "convert":
            _run("export", path, tmp_path / "lerobot", "--to", "lerobot")
        result = _run(*argv, expect=1)
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line == (
            f"rlds-writer {argv[0]}: error: {path} already holds a dataset; rerun with "
            "--mode append to add episodes to it or --mode overwrite to replace it"
        )
    assert rlds_writer.open_dataset(path).splits == {"train": 1}


def test_one_episode_is_one_episode_everywhere(one_episode, tmp_path):
    path, recorded = one_episode
    skip_without_format("export", "hf")
    assert "Recorded 1 episode (9 transitions)" in recorded
    assert ": 1 episode, 10 steps in split 'train'" in recorded
    assert "train: 1 episode, 10 steps," in _run("info", path).stdout
    assert "train: 1 episode, 10 steps decoded" in _run("validate", path).stdout
    assert "split train: 1 episode, 10 steps," in _run("stats", path).stdout
    assert "split train: 1 episode, 9 transitions" in _run("stats", path, "--per-dimension").stdout
    exported = _run("export", path, tmp_path / "hf", "--to", "hf").stdout
    assert exported.startswith("1 episode (9 transitions; ")
    converted = _run("convert", "--from", "npz-dir", _one_npz(tmp_path), tmp_path / "c").stdout
    assert converted.startswith("1 episode (6 steps; ")
    merged = _run("merge", path, "-o", tmp_path / "m").stdout
    assert "merged 1 directory into" in merged and "train: 1 episode in 1 shard" in merged


def _one_npz(tmp_path):
    import numpy as np

    src = tmp_path / "npz"
    src.mkdir()
    np.savez(
        src / "episode_0.npz",
        observations=np.zeros((6, 2), np.float32),
        actions=np.zeros(5, np.int64),
        rewards=np.zeros(5, np.float32),
        terminals=np.array([0, 0, 0, 0, 1], dtype=bool),
    )
    return src


def test_counted():
    assert counted(1, "episode") == "1 episode"
    assert counted(0, "episode") == "0 episodes"
    assert counted(2, "directory", "directories") == "2 directories"
