"""The optional C extensions: every source listed, and a build from other sources never used.

A C module whose `ABI` is not the one `rlds_writer/_native.py` lists (an in-place
build not rebuilt after a `git pull`) is refused at import with one warning naming
the file and the command that rebuilds it, and the Python path records instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from c_extensions import ROOT, setup_py_extensions

from rlds_writer import _native

_ABI_DEFINE = re.compile(r"^#define RLDS_ABI (\d+)$", re.MULTILINE)


def _defined_abi(sources: list[str]) -> int:
    found = [int(m) for s in sources for m in _ABI_DEFINE.findall((ROOT / s).read_text())]
    assert len(found) == 1, f"{sources}: one `#define RLDS_ABI n` expected, found {found}"
    return found[0]


def test_no_c_source_or_header_is_over_500_lines():
    # GUIDE.md: one concept per file, never over 500 lines (C as Python).
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for pattern in ("*.c", "*.h")
        for p in (ROOT / "rlds_writer").rglob(pattern)
    }
    assert sizes and not {k: n for k, n in sizes.items() if n > 500}, (
        "split these by concept into more sources of the same extension (setup.py): "
        f"{ {k: n for k, n in sizes.items() if n > 500} }"
    )


def test_every_c_source_and_header_of_the_package_is_listed_in_setup_py():
    listed = {path for e in setup_py_extensions() for path in e.sources + e.headers}
    present = {
        p.relative_to(ROOT).as_posix()
        for pattern in ("*.c", "*.h")
        for p in (ROOT / "rlds_writer").rglob(pattern)
    }
    # A source left out is not compiled; a header left out is not in the sdist.
    assert present == listed, (
        f"not in setup.py (a .c in its Extension's sources, a .h in its depends): "
        f"{sorted(present - listed)}; listed but missing: {sorted(listed - present)}"
    )


def test_each_extensions_abi_is_the_one_its_python_callers_expect():
    extensions = {e.module: e for e in setup_py_extensions()}
    assert set(_native.ABI) == set(extensions), (
        "every extension setup.py builds defines `#define RLDS_ABI n` in its source, adds it "
        'to its module (`PyModule_AddIntConstant(m, "ABI", RLDS_ABI)`), is listed in '
        "rlds_writer/_native.py's ABI with the same n and is loaded by `_native.load(name)`; "
        f"these are not: {sorted(set(extensions) ^ set(_native.ABI))}"
    )
    for module, extension in extensions.items():
        abi = _defined_abi(extension.sources)
        assert _native.ABI[module] == abi, (
            f"{module}: its source defines RLDS_ABI {abi}, rlds_writer/_native.py lists "
            f"{_native.ABI[module]}: bump both together"
        )
        loaded = _native.load(module)
        if loaded is not None:
            assert loaded.ABI == abi


# Records with every extension the Catch env's recording reaches: the C step,
# the CRC-32C, the zeros ahead (a shard past 64 KiB) and the NaN scan; the
# batched recorder's modules are imported (they load theirs at import).
_RECORD = textwrap.dedent(
    """
    import sys
    import rlds_writer
    from rlds_writer.envs import catch
    from rlds_writer.record import step_kernel
    from rlds_writer.record.batch import frame_chunks, vector_step
    from rlds_writer.store.features import field_encoding
    from rlds_writer.store.writing import batch_records
    from rlds_writer.store.formats.tfrecord import tfrecord, write_ahead

    env = catch.Catch(seed=0)
    with rlds_writer.EnvLogger(env, data_directory=sys.argv[1]) as logged:
        for _ in range(30):
            timestep = logged.reset()
            while not timestep.last():
                timestep = logged.step(1)
    assert write_ahead.ZeroAhead is not write_ahead._NOT_LOADED  # a shard wrote zeros ahead
    print(
        step_kernel.available(),
        tfrecord._TAKES_MEMORYVIEW,
        write_ahead.ZeroAhead is not None,
        field_encoding.quiet_nans is not field_encoding.numpy_quiet_nans,
        vector_step.native is not None,
        batch_records.native is not None,
        frame_chunks._native_rows is not None,
    )
    """
)


def _shards(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.rglob("*.tfrecord-*"))}


def test_a_stale_build_is_refused_at_import_with_its_rebuild_command_and_recording_goes_on(
    tmp_path,
):
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip("no C compiler here: the extensions are never built")
    # A checkout built in place, then its sources moved on (as after a `git pull`
    # without rebuilding): built here from sources whose ABI is one behind.
    copy = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "rlds_writer",
        copy / "rlds_writer",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, copy / name)
    extensions = setup_py_extensions()
    for path in (copy / s for e in extensions for s in e.sources):
        text = path.read_text()
        path.write_text(_ABI_DEFINE.sub(lambda m: f"#define RLDS_ABI {int(m[1]) - 1}", text))
    build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    subprocess.run(build, cwd=copy, check=True, capture_output=True, timeout=600)

    env = {**os.environ, "PYTHONPATH": str(copy), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("RLDS_WRITER_PURE_PYTHON", None)
    stale = subprocess.run(
        [sys.executable, "-c", _RECORD, str(tmp_path / "stale")],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stale.returncode == 0, stale.stderr[-3000:]
    assert stale.stdout.split() == ["False"] * 7, stale.stdout  # every Python path
    warnings = [line for line in stale.stderr.splitlines() if "built from other sources" in line]
    assert len(warnings) == len(extensions), stale.stderr[-3000:]  # one each, once
    for e in extensions:
        (line,) = [w for w in warnings if f"/{e.module.replace('.', '/')}." in w]
        assert line.startswith(str(copy)) and ".so was built" in line, line
        assert line.endswith(
            f"Rebuild it: cd {copy} && {sys.executable} setup.py build_ext --inplace"
        )

    # The same episodes as this checkout records them: not one byte lost or changed.
    here = subprocess.run(
        [sys.executable, "-c", _RECORD, str(tmp_path / "here")],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert here.returncode == 0, here.stderr[-3000:]
    assert here.stdout.split() == ["True"] * 7, here.stdout  # every C path
    assert _shards(tmp_path / "stale") and _shards(tmp_path / "stale") == _shards(tmp_path / "here")
