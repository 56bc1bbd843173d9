"""Consumer venvs: libraries the main venv cannot hold, for tests that run them for real.

d3rlpy 2.8.1 pins gymnasium 1.0.0 while rlds_writer's gymnasium extra needs
1.1 or newer, so d3rlpy lives in its own venv, `.cache/consumer-venvs/d3rlpy`
(gitignored): created by `python -m venv` and pip the first time a test asks
for it, reused afterwards (a marker file records what was installed; a change
of the requirements, of setup.py or of the shared torch rebuilds it). The venv
also holds rlds_writer itself (editable, core dependencies only: no gymnasium
extra), which is what a user who wants `rlds_writer.interop.to_d3rlpy` installs beside
d3rlpy.

torch is not installed a second time: on Linux, PyPI's torch is the CUDA build
(several GB). The venv sees the main venv's torch and the distributions it
depends on (nvidia-*, triton, sympy, ...) through a `.pth` line naming a
directory of links to them, `.cache/consumer-venvs/shared/d3rlpy`, and pip
counts them as installed. Without torch in the main venv (an install without
the `torch`/`rllib` extras) the tests that need it skip.

If the venv cannot be built (no network, a registry refusing), the tests that
need it fail with pip's output under CI (`CI=true`) and are skipped with the
reason otherwise.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".cache" / "consumer-venvs"

# What docs/sharing.md tells d3rlpy users to install beside their torch.
D3RLPY_REQUIREMENTS = ("d3rlpy==2.8.1",)
# Distributions the d3rlpy venv takes from the main venv instead of downloading them.
D3RLPY_SHARED = ("torch",)
_MARKER = "rlds-writer-consumer.txt"


def _closure(names: Sequence[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` and everything they require, recursively.

    Raises:
      importlib.metadata.PackageNotFoundError: a name in `names` is not installed.
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, importlib.metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) already followed
    todo = [(name, "", True) for name in names]
    while todo:
        name, extra, required = todo.pop()
        key = canonicalize_name(name)
        if (key, extra) in done:
            continue
        try:
            dist = found.get(key) or importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            if required:
                raise
            continue  # an optional dependency that is not installed
        found[key] = dist
        done.add((key, extra))
        for line in dist.requires or ():
            requirement = Requirement(line)
            # `extra` is "" for the distribution itself, or one of its extras that a
            # dependant asked for (torch asks for cuda-toolkit[cublas,...]).
            marker = requirement.marker
            if marker is None or marker.evaluate({"extra": extra}):
                if extra and (marker is None or marker.evaluate({"extra": ""})):
                    continue  # a plain dependency, followed with extra ""
                for wanted in ("", *sorted(requirement.extras)):
                    todo.append((requirement.name, wanted, True))
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def _link_shared(directory: Path, dists: Sequence[importlib.metadata.Distribution]) -> None:
    """Fills `directory` with links to the top-level files and folders of `dists`."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for dist in dists:
        base = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in sorted(tops):
            # Namespace folders (nvidia/, cuda/) hold several distributions: one link.
            if (base / top).exists() and not (directory / top).exists():
                (directory / top).symlink_to(base / top)


def _wanted(requirements: Sequence[str], shared: Sequence[str]) -> str:
    setup = hashlib.sha256((ROOT / "setup.py").read_bytes()).hexdigest()
    lines = [*requirements, f"-e {ROOT}", f"setup.py sha256 {setup}"]
    lines += [
        f"shared {d.metadata['Name']}=={d.version} {d.locate_file('')}" for d in _closure(shared)
    ]
    return "\n".join(lines) + "\n"


def _give_up(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def consumer_python(name: str, requirements: Sequence[str], shared: Sequence[str] = ()) -> Path:
    """The python of the consumer venv `name`, created with `requirements` the first time.

    Args:
      name: the venv's directory name under `.cache/consumer-venvs`.
      requirements: pip requirement specifiers; rlds_writer (this checkout,
        editable) is added.
      shared: distributions the venv takes from this interpreter's environment,
        with everything they require, instead of installing them (torch: one
        copy of several GB); the test skips if one is not installed here.

    Returns:
      The venv's `bin/python`.
    """
    venv = VENVS / name
    python = venv / "bin" / "python"
    try:
        wanted = _wanted(requirements, shared)
    except importlib.metadata.PackageNotFoundError as e:
        pytest.skip(f"the {name} consumer venv shares {e.name} with this venv, which lacks it")
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / f"{name}.lock", "w") as lock:
        # Two pytest processes must not build the same venv at once.
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = venv / _MARKER
        if python.exists() and marker.exists() and marker.read_text() == wanted:
            return python
        shutil.rmtree(venv, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        start = time.monotonic()
        # Outside the venv's folder: pip never uninstalls what lies outside it.
        links = VENVS / "shared" / name
        commands = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", *requirements, "-e", str(ROOT)],
        ]
        for i, command in enumerate(commands):
            if i == 1 and shared:
                _link_shared(links, _closure(shared))
                purelib = subprocess.run(
                    [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                Path(purelib, "rlds-writer-shared.pth").write_text(f"{links}\n")
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, env=env, timeout=1800
                )
            except subprocess.TimeoutExpired as e:
                shutil.rmtree(venv, ignore_errors=True)
                _give_up(f"creating the {name} consumer venv timed out: {e}")
            if done.returncode:
                shutil.rmtree(venv, ignore_errors=True)
                _give_up(
                    f"could not create the {name} consumer venv ({venv}): "
                    f"`{' '.join(command)}` exited with {done.returncode}:\n"
                    f"{done.stdout[-8000:]}\n{done.stderr[-8000:]}"
                )
        marker.write_text(wanted)
        (venv / "created-in-seconds.txt").write_text(f"{time.monotonic() - start:.1f}\n")
    return python


def run_consumer(python: Path, *args: str, cwd: Path, timeout: float = 900) -> str:
    """Runs a consumer venv's python with `args` (a script and its arguments, or `-c CODE`).

    Fails the test with the output if it exits non-zero.

    Returns:
      The script's stdout.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # One torch thread: on a shared 2-core machine two are about ten times slower.
    env.update(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [str(python), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )
    if done.returncode:
        pytest.fail(
            f"{python} {' '.join(args)} exited with {done.returncode}:\n"
            f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}",
            pytrace=False,
        )
    return done.stdout
