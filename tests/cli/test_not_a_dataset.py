"""A path that is not a dataset gets one error, from every command and from `open_dataset`.

The message names the path, what was expected and what is there instead; for
a directory with datasets below it (the RLlib recorder's `merged/<module>`),
it lists them with the command that opens each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_core import run_cli

import rlds_writer

BIN = Path(sys.executable).parent / "rlds-writer"
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")
EXPECTED = "not an RLDS dataset directory (expected one with dataset_info.json and features.json)"


@pytest.fixture()
def paths(tmp_path, catch):
    """Each kind of not-a-dataset, and a directory of datasets laid out as RLlib's."""
    parent = tmp_path / "ppo"
    for module in ("module_a", "module_b"):
        shutil.copytree(catch, parent / "merged" / module)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    return {
        "missing": (tmp_path / "nope", "it does not exist"),
        "file": (tmp_path / "notes.txt", "it is a file"),
        "empty": (tmp_path / "empty", "it is an empty directory"),
        "parent": (parent, "it has no dataset_info.json; 2 datasets below it, pick one: "),
    }


def _run(*args):
    """The one line a command says, in a real process for `info`, through `main()` otherwise."""
    if args[0] == "info":  # the process boundary: exit code 1, one line, no traceback
        result = subprocess.run(
            [str(BIN), *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300
        )
    else:
        result = run_cli(*args, expect=1)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# Every command that reads a dataset; PATH stands for the path given.
COMMANDS = {
    "info": ["info", "PATH"],
    "validate": ["validate", "PATH"],
    "stats": ["stats", "PATH"],
    "stats --per-dimension": ["stats", "PATH", "--per-dimension"],
    "recover": ["recover", "PATH"],
    "show": ["show", "PATH", "--out", "OUT/x.gif"],
    "export": ["export", "PATH", "OUT/hf", "--to", "hf"],
    "merge": ["merge", "PATH", "-o", "OUT/merged"],
    "view": ["view", "PATH"],
}


def _argv(command, path, out):
    return [str(path) if a == "PATH" else a.replace("OUT", str(out)) for a in COMMANDS[command]]


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_says_the_same_line_for_a_path_that_is_not_a_dataset(
    tmp_path, paths, command, kind
):
    path, reason = paths[kind]
    line = _run(*_argv(command, path, tmp_path))
    assert line == f"rlds-writer {command.split()[0]}: error: {path}: {EXPECTED}: {reason}"
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_directory_of_datasets_lists_them_with_the_command_to_open_each(tmp_path, paths, command):
    parent, reason = paths["parent"]
    argv = _argv(command, parent, tmp_path)
    line = _run(*argv)
    a, b = (parent / "merged" / m for m in ("module_a", "module_b"))
    head = f"rlds-writer {command.split()[0]}: error: {parent}: {EXPECTED}: "
    if command == "merge":
        # A merge's sources: all of them, in one command.
        rerun = " ".join(["rlds-writer", "merge", str(a), str(b), *argv[2:]])
        assert line == (
            f"{head}it has no dataset_info.json; 2 datasets below it, merge them: `{rerun}`"
        )
        return
    reruns = []
    for dataset in (a, b):
        words = [str(dataset) if word == str(parent) else word for word in argv]
        reruns.append(f"`rlds-writer {' '.join(words)}`")
    assert line == head + reason + ", ".join(reruns)
    # The command given works as it says.
    run_cli("info", a)


def test_a_file_inside_a_dataset_names_the_dataset(catch):
    line = _run("info", catch / "dataset_info.json")
    assert line.endswith(f"it is a file of the dataset in {catch}: pass that directory")


def test_open_dataset_raises_the_same_error_with_the_python_call_for_each_dataset(paths):
    parent, _ = paths["parent"]
    with pytest.raises(rlds_writer.errors.NotADatasetError) as raised:
        rlds_writer.open_dataset(parent)
    error = raised.value
    assert isinstance(error, FileNotFoundError) and isinstance(error, rlds_writer.RLDSWriterError)
    a, b = (str(parent / "merged" / m) for m in ("module_a", "module_b"))
    assert error.datasets == [a, b]
    assert str(error) == (
        f"{parent}: {EXPECTED}: it has no dataset_info.json; 2 datasets below it, pick one: "
        f"rlds_writer.open_dataset({a!r}), rlds_writer.open_dataset({b!r})"
    )
    assert rlds_writer.open_dataset(a).splits == {"train": 2}
    for kind in ("missing", "file", "empty"):
        path, reason = paths[kind]
        with pytest.raises(rlds_writer.errors.NotADatasetError, match=reason):
            rlds_writer.open_dataset(path)


def test_the_search_below_a_directory_skips_hidden_and_linked_directories(tmp_path, catch):
    shutil.copytree(catch, tmp_path / ".hidden" / "ds")
    (tmp_path / "link").symlink_to(catch.parent, target_is_directory=True)
    shutil.copytree(catch, tmp_path / "a" / "b" / "c" / "too_deep")
    shutil.copytree(catch, tmp_path / "a" / "b" / "shallow")
    with pytest.raises(rlds_writer.errors.NotADatasetError) as raised:
        rlds_writer.open_dataset(tmp_path)
    assert raised.value.datasets == [str(tmp_path / "a" / "b" / "shallow")]


def test_more_than_ten_datasets_below_are_counted_not_all_listed(tmp_path, catch):
    for i in range(12):
        shutil.copytree(catch, tmp_path / f"writer-{i:02d}")
    with pytest.raises(rlds_writer.errors.NotADatasetError) as raised:
        rlds_writer.open_dataset(tmp_path)
    message = str(raised.value)
    assert "12 datasets below it" in message and message.endswith("(and 2 more)")
    assert "writer-09" in message and "writer-10" not in message
