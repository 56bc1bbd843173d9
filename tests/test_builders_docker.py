"""The Docker image installs the package with the README's own command."""

from __future__ import annotations

import re
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


def _readme_install_command() -> str:
    readme = (_ROOT / "README.md").read_text()
    for line in readme.splitlines():
        if '".[all,test]"' in line and "python3 -m venv" in line:
            # The README line also runs the tests; the image runs them as its CMD.
            return line.split(" && .venv/bin/python -m pytest")[0].strip()
    raise AssertionError("README.md has no 'Install everything' command with .[all,test]")


def test_dockerfile_installs_with_the_readme_command_and_runs_the_tests():
    dockerfile = (_ROOT / "docker" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.MULTILINE)
    run_lines = [line[4:] for line in dockerfile.splitlines() if line.startswith("RUN ")]
    assert _readme_install_command() in run_lines
    assert 'CMD [".venv/bin/python", "-m", "pytest", "-q"]' in dockerfile
