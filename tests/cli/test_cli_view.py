"""`rlds-writer view` as a user runs it: a free port printed, progress, Ctrl-C stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers_viewer import write_robot

from rlds_writer.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-m", "rlds_writer", "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_view") / "robot"
    write_robot(path, 5)
    return path


def test_view_serves_on_a_free_loopback_port_and_stops_on_ctrl_c(robot):
    process = _start(str(robot))
    try:
        line = process.stdout.readline()
        assert line.startswith(f"serving {robot} (5 episodes) at http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        with urllib.request.urlopen(url + "api/dataset", timeout=30) as response:
            assert json.loads(response.read())["splits"] == {"train": 5}
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.strip().endswith("stopped")
    assert "Traceback" not in err
    # The index was built with a line on the terminal, and cached beside the dataset.
    assert "indexed train: 5 episodes" in err
    assert (robot / "viewer_index_train.json").is_file()


def test_a_taken_port_or_a_bad_option_is_one_line(robot, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", str(robot), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"rlds-writer view: error: cannot listen on 127.0.0.1:{port}")
    assert len(err.strip().splitlines()) == 1
    assert main(["view", str(robot), "--port", "70000"]) == 1
    assert "--port must be in 0..65535" in capsys.readouterr().err
    assert main(["view", str(robot.parent / "nothing")]) == 1
    assert "rlds-writer view: error:" in capsys.readouterr().err


def test_a_host_other_than_loopback_is_warned_about(robot, monkeypatch, capsys):
    from rlds_writer.view import server as server_lib

    # Not bound for real: the warning comes before the socket.
    def refuse(*args, **kwargs):
        raise OSError(99, "not in this test")

    monkeypatch.setattr(server_lib.ViewerServer, "__init__", refuse)
    assert main(["view", str(robot), "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "warning: --host 0.0.0.0 lets other machines on the network read this dataset" in err
    assert main(["view", str(robot), "--host", "127.0.0.2"]) == 1
    assert "warning" not in capsys.readouterr().err
