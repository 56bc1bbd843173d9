"""The Docker image installs the package with the README's own commands."""

from __future__ import annotations

import re
from pathlib import Path

from c_extensions import setup_py_extensions

_ROOT = Path(__file__).resolve().parents[2]
_DOCKERFILE = (_ROOT / "docker" / "Dockerfile").read_text()
_README = (_ROOT / "README.md").read_text()


def _build_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", _DOCKERFILE, re.MULTILINE)
    assert match, f"docker/Dockerfile has no default for ARG {name}"
    return match[1]


def _dockerfile_pip_install(extras: str) -> str:
    """The Dockerfile's install command with EXTRAS set to `extras`."""
    joined = _DOCKERFILE.replace("\\\n", " ")
    run_lines = [line[4:] for line in joined.splitlines() if line.startswith("RUN ")]
    command = '.venv/bin/pip install -e ".[$EXTRAS]"'
    installs = [line for line in run_lines if command in line]
    assert len(installs) == 1, f"expected one RUN line with {command}, got {installs}"
    return command.replace("$EXTRAS", extras)


def _readme_commands() -> list[str]:
    return [line for line in _README.splitlines() if line.startswith("python3 -m venv .venv")]


def test_default_image_installs_the_readme_lean_command_and_runs_the_tests():
    assert re.search(r"^FROM python:3\.11-slim$", _DOCKERFILE, re.MULTILINE)
    lean = _build_arg("EXTRAS")
    assert lean == "gymnasium,reader,plot,convert,test"
    install = _dockerfile_pip_install(lean)
    assert any(install in command for command in _readme_commands())
    assert 'CMD [".venv/bin/python", "-m", "pytest", "-q"]' in _DOCKERFILE


def test_full_image_installs_the_readme_everything_command():
    install = _dockerfile_pip_install("all,test")
    (everything,) = [c for c in _readme_commands() if install in c]
    # The default run, then the release checks (built wheel, fresh venv from the index),
    # the multi-node cluster tests and the executed docs and notebooks.
    assert everything.endswith(
        " && .venv/bin/python -m pytest -q"
        ' && .venv/bin/python -m pytest -q -m "release or cluster or docs"'
    )


def test_ci_runs_the_readme_test_command_and_nothing_names_an_index_but_pypi():
    ci = (_ROOT / ".ci" / "run").read_text()
    (everything,) = [c for c in _readme_commands() if '".[all,test]"' in c]
    assert everything in ci.splitlines()
    # A user's machine may reach PyPI only: an index it cannot reach costs minutes
    # of retries. pip's own options and URLs of other indexes are refused alike.
    for name, text in (("README.md", _README), (".ci/run", ci), ("Dockerfile", _DOCKERFILE)):
        for option in ("--index-url", "--extra-index-url", "--find-links", "PIP_INDEX_URL"):
            assert option not in text, f"{name} names a package index ({option!r})"
        assert "download.pytorch.org" not in text, name


def test_image_gets_every_c_extension_setup_py_builds():
    # setup.py's extensions are optional (a user without a compiler still
    # installs); the image builds each in its compiler stage, copies the module
    # in and fails to build without it.
    final = _DOCKERFILE.rsplit("\nFROM ", 1)[1]
    for module, sources, headers in setup_py_extensions():
        package_dir, name = module.rsplit(".", 1)
        package_dir = package_dir.replace(".", "/")
        for source in sources + headers:  # each .c compiled in, each header they include
            assert f"COPY {source} {source.rsplit('/', 1)[0]}/" in _DOCKERFILE, source
        assert f"COPY --from=extensions /src/{package_dir}/*.so {package_dir}/" in final, module
        check = re.search(r'^RUN \.venv/bin/python -c "import ([\w., ]+)"$', final, re.MULTILINE)
        assert check and module in check[1].split(", "), module
