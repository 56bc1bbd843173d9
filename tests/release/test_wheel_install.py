"""A wheel built from the checkout installs into a fresh venv and runs `rlds-writer record`.

By default the venv sees this interpreter's installed packages (a `.pth` line),
so only the wheel itself is installed (`--no-deps`) and `pip check` proves its
declared dependencies are satisfied: this checks that the wheel holds every
module and the console script. With RLDS_WHEEL_FULL_INSTALL=1 the venv sees
nothing else and pip resolves every dependency from the configured index, as a
user's `pip install rlds_writer-*.whl` does (minutes: TensorFlow is large).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from c_extensions import setup_py_extensions

_ROOT = Path(__file__).resolve().parents[2]
_FULL = os.environ.get("RLDS_WHEEL_FULL_INSTALL") == "1"
_PYCACHE = shutil.ignore_patterns("__pycache__")


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    # No PYTHONPATH: the checkout on it would be imported instead of the wheel.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy: building in the checkout would leave build/ and egg-info there.
    src = tmp_path_factory.mktemp("src")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(_ROOT / name, src / name)
    shutil.copytree(_ROOT / "rlds_writer", src / "rlds_writer", ignore=_PYCACHE)
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
        ],
        cwd=out,
        timeout=300,
    )
    (built,) = out.glob("rlds_writer-*.whl")
    return built


def _venv(path: Path) -> Path:
    # No pip of its own (ensurepip costs tens of seconds): this interpreter's pip
    # installs into it (`pip --python`).
    venv.EnvBuilder(with_pip=False).create(path)
    python = path / "bin" / "python"
    if not _FULL:
        purelib = _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=path,
            timeout=60,
        ).stdout.strip()
        outer = [p for p in site.getsitepackages() if "site-packages" in p]
        Path(purelib, "_outer_site_packages.pth").write_text("\n".join(outer) + "\n")
    return python


@pytest.mark.slow
def test_built_wheel_installs_in_a_fresh_venv_and_records_a_dataset(wheel, tmp_path):
    python = _venv(tmp_path / "venv")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", str(wheel)]
    _run(pip if _FULL else [*pip, "--no-deps"], cwd=tmp_path, timeout=1800 if _FULL else 300)
    if not _FULL:
        # Only our requirements: the venv's own old setuptools may not satisfy others'.
        check = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "check"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        ours = [line for line in check.stdout.splitlines() if line.startswith("rlds")]
        assert not ours, ours
    # The package comes from the venv, not from the checkout.
    where = _run(
        [str(python), "-c", "import rlds_writer; print(rlds_writer.__file__)"],
        cwd=tmp_path,
        timeout=120,
    ).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where

    output = tmp_path / "catch"
    result = _run(
        [
            str(tmp_path / "venv" / "bin" / "rlds-writer"),
            "record",
            "--output",
            str(output),
            "--episodes",
            "5",
            "--no-progress",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    assert "Recorded 5 episodes" in result.stdout, result.stdout
    assert "as_dataset: 5 episodes" in result.stdout, result.stdout
    assert (output / "dataset_info.json").is_file()


# --- The release: sdist and wheel as `python -m build` makes them, installed for real.

_LEAN_EXTRAS = "gymnasium,reader,plot,convert"
_SKIP_COPY = shutil.ignore_patterns(
    ".git", ".venv", ".cache", "__pycache__", "build", "dist", "*.egg-info", ".pytest_cache"
)


def _readme_block(heading: str) -> str:
    """The first fenced block under the README's `heading`."""
    text = (_ROOT / "README.md").read_text()
    section = text[text.index(f"\n{heading}\n") :]
    return section.split("```", 2)[1].split("\n", 1)[1]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("build")
    pytest.importorskip("twine")
    src = tmp_path_factory.mktemp("release-src") / "rlds_writer"
    shutil.copytree(_ROOT, src, ignore=_SKIP_COPY, symlinks=True)
    out = tmp_path_factory.mktemp("release-dist")
    # --no-isolation: the build requirements (setuptools>=77) are in the test extra,
    # so building needs no index.
    _run([sys.executable, "-m", "build", "--no-isolation", "-o", str(out), str(src)], out, 600)
    (sdist,) = out.glob("rlds_writer-*.tar.gz")
    (wheel,) = out.glob("rlds_writer-*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.mark.slow
@pytest.mark.release
def test_the_release_passes_twine_check_and_declares_version_license_and_classifiers(release):
    import tarfile
    import zipfile

    import rlds_writer

    _run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, release.values())],
        _ROOT,
        300,
    )
    version = rlds_writer.__version__
    # The C extensions (every one setup.py lists) make the wheel this
    # interpreter's and platform's (the machine that builds the release has a
    # C compiler).
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert release["wheel"].name.startswith(f"rlds_writer-{version}-{tag}-{tag}-"), release
    with zipfile.ZipFile(release["wheel"]) as whl:
        metadata = whl.read(f"rlds_writer-{version}.dist-info/METADATA").decode()
        names = whl.namelist()
    # Every extension setup.py builds, found in its source list (not a copy of it).
    extensions = setup_py_extensions()
    for module, _, _ in extensions:
        built = module.replace(".", "/")
        assert any(n.startswith(f"{built}.") and n.endswith(".so") for n in names), module
    assert f"\nVersion: {version}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "\nLicense-File: LICENSE\n" in metadata
    assert "Classifier: Programming Language :: Python :: 3.11" in metadata
    assert "Requires-Python: >=3.10" in metadata
    assert f"rlds_writer-{version}.dist-info/licenses/LICENSE" in names
    assert "rlds_writer/envs/catch.py" in names or any(
        n.startswith("rlds_writer/envs/") for n in names
    )
    with tarfile.open(release["sdist"]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    # An sdist builds, tests and documents itself.
    for name in (
        "LICENSE",
        "CHANGELOG.md",
        "README.md",
        "setup.py",
        "pyproject.toml",
        "tests/conftest.py",
        "docs/architecture.md",
        # what builds the extensions: every source and header setup.py names
        *(path for e in extensions for path in e.sources + e.headers),
    ):
        assert name in members, name
    assert "Apache License" in (_ROOT / "LICENSE").read_text()
    assert f"## {version}" in (_ROOT / "CHANGELOG.md").read_text()


@pytest.mark.slow
@pytest.mark.release
def test_a_pure_python_build_makes_a_wheel_for_any_platform(release, tmp_path):
    """RLDS_WRITER_PURE_PYTHON=1 at build time: no C step, a py3-none-any wheel."""
    import zipfile

    out = tmp_path / "pure"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RLDS_WRITER_PURE_PYTHON"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "-o", str(out)]
        + [str(release["sdist"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("rlds_writer-*.whl")
    assert "-py3-none-any" in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as whl:
        assert not [n for n in whl.namelist() if n.endswith(".so")]


@pytest.mark.slow
@pytest.mark.release
def test_the_wheel_installs_with_the_lean_extras_and_runs_the_readme_quick_start(release, tmp_path):
    # A venv that sees nothing else: pip resolves every dependency from the index.
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    bin_dir = tmp_path / "venv" / "bin"
    _run(
        [str(bin_dir / "pip"), "install", f"{release['wheel']}[{_LEAN_EXTRAS}]"],
        tmp_path,
        1800,
    )
    # The README's first command, after its install: .venv/bin/rlds-writer record ...
    (first,) = [
        line
        for line in (_ROOT / "README.md").read_text().splitlines()
        if line.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")
    ]
    record = first.split(" && ")[-1]
    assert record.startswith(".venv/bin/rlds-writer record --output /tmp/catch_dataset ")
    dataset = tmp_path / "catch_dataset"
    args = record.replace("/tmp/catch_dataset", str(dataset)).split()
    result = _run([str(bin_dir / "rlds-writer"), *args[1:]], tmp_path, 900)
    assert "Recorded 100 episodes" in result.stdout, result.stdout
    assert "as_dataset: 100 episodes" in result.stdout, result.stdout

    # A reading block of the README, as pasted (its path moved to the recording),
    # in the wheel's venv: the reader needs no TensorFlow.
    block = _readme_block("## Reading without TensorFlow")
    assert '"/data/catch"' in block
    script = block.replace('"/data/catch"', repr(str(dataset)))
    script += (
        "\nimport sys\n"
        "assert 'tensorflow' not in sys.modules\n"
        "print('episodes', len(episodes), episodes[3]['steps']['observation'].shape)\n"
    )
    (tmp_path / "read.py").write_text(script)
    result = _run([str(bin_dir / "python"), "read.py"], tmp_path, 600)
    assert "episodes 10 (" in result.stdout, result.stdout
