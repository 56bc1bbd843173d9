"""Recording, loading and every command print nothing the user did not ask for.

No TensorFlow, absl or oneDNN line (not even those TensorFlow prints while it
is imported, before it reads TF_CPP_MIN_LOG_LEVEL), no progress bar in a
pipe; `--verbose` or the user's own TF_CPP_MIN_LOG_LEVEL lets TensorFlow log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers_core import skip_without_format

SCRIPT = """
    import rlds_writer
    import tensorflow_datasets as tfds

    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=OUT)
    for _ in range(3):
        ts = env.reset()
        while not ts.last():
            ts = env.step(1)
    env.close()
    episodes = list(tfds.builder_from_directory(OUT).as_dataset(split="train"))
    assert len(episodes) == 3
    print("ok")
"""

BIN = os.path.join(os.path.dirname(sys.executable), "rlds-writer")
ABSL_LINE = re.compile(r"^[IWEF]\d{4} ")


def _user_env(**extra):
    """The environment of a user's fresh shell: no TF_CPP_MIN_LOG_LEVEL of ours."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return dict(env, CUDA_VISIBLE_DEVICES="", **extra)


def _cli(*args, env=None):
    result = subprocess.run(
        [BIN, *map(str, args)],
        capture_output=True,
        text=True,
        env=env or _user_env(),
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result


@pytest.mark.slow  # a subprocess that imports TensorFlow
def test_recording_catch_and_loading_it_prints_no_log_lines(tmp_path):
    code = f"OUT = {str(tmp_path / 'ds')!r}\n" + textwrap.dedent(SCRIPT)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_user_env()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    # Not even TensorFlow's oneDNN and absl notices at its import.
    assert result.stderr == ""


@pytest.mark.slow  # a subprocess that imports TensorFlow
def test_the_readmes_first_command_prints_nothing_on_stderr(tmp_path):
    out = tmp_path / "catch_dataset"
    result = _cli("record", "--output", out, "--episodes", 100, "--mode", "overwrite")
    assert result.stderr == ""
    assert "Recorded 100 episodes (900 transitions)" in result.stdout


@pytest.fixture(scope="module")
def catch(tmp_path_factory):
    path = tmp_path_factory.mktemp("quiet") / "ds"
    _cli("record", "--output", path, "--episodes", 3, "--no-load-back")
    return path


# Every command on a small dataset; SRC is the dataset, OUT a new path.
COMMANDS = {
    "info": ["info", "SRC"],
    "validate": ["validate", "SRC"],
    "stats": ["stats", "SRC"],
    "stats --per-dimension": ["stats", "SRC", "--per-dimension"],
    "stats --plot": ["stats", "SRC", "--plot", "OUT.png"],
    "recover": ["recover", "SRC"],
    "merge": ["merge", "SRC", "-o", "OUT"],
    "show": ["show", "SRC", "--out", "OUT.gif"],
    "export --to hf": ["export", "SRC", "OUT", "--to", "hf"],
    "export --to rllib-episodes": ["export", "SRC", "OUT", "--to", "rllib-episodes"],
    "export --to lerobot": ["export", "SRC", "OUT", "--to", "lerobot"],
    "export --to d3rlpy": ["export", "SRC", "OUT.h5", "--to", "d3rlpy"],
    "export --to minari": ["export", "SRC", "catch/quiet-v0", "--to", "minari"],
}
# Converted back: a directory of .npz episodes, and the LeRobot export above.
CONVERTS = {
    "npz-dir": ["convert", "--from", "npz-dir", "NPZ", "OUT"],
    "lerobot": ["convert", "--from", "lerobot", "LEROBOT", "OUT"],
}

# Runs each command through main() in one fresh process, with file descriptor 2
# (where TensorFlow's C++ logs go, not only sys.stderr) caught per command.
RUN_ALL = """
import json, os, sys, tempfile, traceback
from rlds_writer.cli.main import main

results = {}
for name, argv in json.loads(sys.argv[1]).items():
    with tempfile.TemporaryFile() as caught:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "raised"
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        results[name] = [code, caught.read().decode(errors="replace")]
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def _npz_episodes(path):
    path.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(
            path / f"episode_{i}.npz",
            observations=rng.normal(size=(6, 2)).astype(np.float32),
            actions=rng.integers(0, 3, size=5),
            rewards=rng.normal(size=5).astype(np.float32),
            terminals=np.array([0, 0, 0, 0, 1], dtype=bool),
        )
    return path


@pytest.fixture(scope="module")
def every_command(tmp_path_factory, catch):
    """{name: [exit code, what it wrote on fd 2]} of every command, run in one new process.

    One process instead of one each: TensorFlow's import-time lines come once per
    process, and the process-per-command checks are the README's and the Python
    script's above; every command's own output is still caught on its own.
    """
    tmp = tmp_path_factory.mktemp("every_command")
    places = {"SRC": str(catch), "NPZ": str(_npz_episodes(tmp / "npz"))}
    places["LEROBOT"] = str(tmp / "export --to lerobot" / "out")
    argvs = {}
    for name, argv in [*COMMANDS.items(), *(("convert " + k, v) for k, v in CONVERTS.items())]:
        (tmp / name).mkdir()
        out = str(tmp / name / "out")
        argvs[name] = [places.get(a, a.replace("OUT", out)) for a in argv]
    report = tmp / "report.json"
    result = subprocess.run(
        [sys.executable, "-c", RUN_ALL, json.dumps(argvs), str(report)],
        capture_output=True,
        text=True,
        env=_user_env(MINARI_DATASETS_PATH=str(tmp / "minari")),
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr
    # Nothing outside the commands either (the interpreter's start and exit).
    assert result.stderr == ""
    return json.loads(report.read_text())


# Every command, in one subprocess (TensorFlow imported once): about 10 s.
@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_prints_nothing_on_stderr(every_command, command):
    if command.startswith("export --to "):
        skip_without_format("export", command.rpartition(" ")[2])
    code, stderr = every_command[command]
    assert code == 0, stderr
    # No TensorFlow, absl or oneDNN line, and no progress bar: stderr is not a terminal.
    assert stderr == ""


@pytest.mark.slow
@pytest.mark.parametrize("source", list(CONVERTS))
def test_convert_prints_nothing_on_stderr(every_command, source):
    skip_without_format("convert", source)
    if source == "lerobot":  # converts the LeRobot export back
        skip_without_format("export", "lerobot")
    code, stderr = every_command["convert " + source]
    assert code == 0, stderr
    assert stderr == ""


def _tf_prints_log_lines_at_import(env):
    """Whether TensorFlow alone, without us, writes absl lines at import (CPU-dependent)."""
    result = subprocess.run(
        [sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env
    )
    return [line for line in result.stderr.splitlines() if ABSL_LINE.match(line)]


# Three processes importing TensorFlow for the opt-in path: slow.
@pytest.mark.slow
def test_verbose_and_a_users_tf_cpp_min_log_level_let_tensorflow_log(catch):
    users = _cli("validate", catch, env=_user_env(TF_CPP_MIN_LOG_LEVEL="0"))
    if not any(ABSL_LINE.match(line) for line in users.stderr.splitlines()):
        # Fine only where TensorFlow itself has nothing to say (CPU-dependent).
        if not _tf_prints_log_lines_at_import(_user_env(TF_CPP_MIN_LOG_LEVEL="0")):
            pytest.skip("this TensorFlow prints no log line at import on this machine")
        raise AssertionError(f"TF_CPP_MIN_LOG_LEVEL=0 held TensorFlow's lines back: {users.stderr}")
    verbose = _cli("--verbose", "validate", catch)
    assert any(ABSL_LINE.match(line) for line in verbose.stderr.splitlines()), verbose.stderr


# A stand-in `tensorflow` package writing what TensorFlow writes at import,
# and a line of someone else's, to file descriptor 2.
FAKE_TENSORFLOW = r"""
import os
for line in (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795654068.963506   28117 port.cc:153] oneDNN custom operations are on.",
    "I0000 00:00:1795654068.963506   28117 cpu_feature_guard.cc:227] This TensorFlow binary",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild",
    "W0000 00:00:1795654068.963506   28117 some.cc:1] a warning",
    "E0000 00:00:1795654068.963506   28117 some.cc:2] an error",
    "a line of someone else",
):
    os.write(2, line.encode() + b"\n")
if os.environ.get("FAIL"):
    raise ImportError("the import failed")
"""


def _fake_tensorflow(tmp_path, **extra):
    package = tmp_path / "fake" / "tensorflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_TENSORFLOW)
    path = os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")])
    return _user_env(PYTHONPATH=path, **extra)


@pytest.mark.parametrize(
    "level, kept",
    [
        (None, ["E0000", "a line of someone else"]),
        ("1", ["W0000", "E0000", "a line of someone else"]),
        ("3", ["a line of someone else"]),
        ("0", ["WARNING: All log", "I0000", "I0000", "To enable", "W0000", "E0000", "a line"]),
    ],
)
def test_only_tensorflows_log_lines_below_the_level_are_held_back_at_its_import(
    tmp_path, level, kept
):
    env = _fake_tensorflow(tmp_path)
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    code = "import rlds_writer, tensorflow; assert 'fake' in tensorflow.__file__"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == len(kept), lines
    assert all(line.startswith(start) for line, start in zip(lines, kept)), lines


def test_an_import_that_fails_keeps_its_output_and_its_error(tmp_path):
    env = _fake_tensorflow(tmp_path, FAIL="1")
    code = "import rlds_writer, tensorflow"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert "a line of someone else" in result.stderr
    assert "ImportError: the import failed" in result.stderr
    assert "oneDNN" not in result.stderr


def test_version_is_printed():
    result = subprocess.run([BIN, "--version"], capture_output=True, text=True)
    assert result.returncode == 0
    import rlds_writer

    assert result.stdout.strip() == f"rlds-writer {rlds_writer.__version__}"
