"""The package's top level: a short list of names, the rest in subpackages, and reloadable."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import rlds_writer

_ROOT = Path(__file__).resolve().parents[2]

# What a user types in the first hour (CHANGELOG.md lists where the rest went).
TOP_LEVEL = {
    "EnvLogger",
    "TFDSBackendWriter",
    "RecordRLDS",
    "RecordRLDSVector",
    "RecordRLDSParallel",
    "RecordRLDSAEC",
    "RLDSRecorder",
    "DatasetConfig",
    "config_from_env",
    "config_from_spaces",
    "Catch",
    "open_dataset",
    "recover",
    "merge",
    "convert",
    "export",
    "RLDSWriterError",
}
SUBPACKAGES = ("record", "store", "read", "maintain", "interop")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environ.update(env)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300
    )


def _resolve(dotted: str) -> object:
    """`rlds_writer.a.b` by attribute access from `import rlds_writer`, as a user types it.

    A name whose extra is not installed (a lean install) raises the one-line
    `MissingDependencyError` for a module that is indeed missing: then None.
    """
    value: object = rlds_writer
    try:
        for part in dotted.split(".")[1:]:
            value = getattr(value, part)
    except rlds_writer.errors.MissingDependencyError as e:
        assert importlib.util.find_spec(e.name) is None, e
        return None
    return value


def test_the_top_level_holds_the_first_hour_names_and_each_resolves():
    assert set(rlds_writer.__all__) == TOP_LEVEL
    resolved = {name: _resolve(f"rlds_writer.{name}") for name in TOP_LEVEL}
    # The core and the Gymnasium recorder, at least, are there in every install we test.
    assert resolved["open_dataset"] is not None and resolved["RecordRLDS"] is not None
    assert rlds_writer.RecordRLDS.__module__ == "rlds_writer.record.gymnasium.gymnasium_wrapper"
    assert issubclass(rlds_writer.RLDSWriterError, Exception)


@pytest.mark.parametrize("package", ("", *SUBPACKAGES))
def test_dir_shows_public_names_and_subpackages_only(package):
    module = importlib.import_module(f"rlds_writer.{package}".rstrip("."))
    shown = {name for name in dir(module) if not (name.startswith("__") and name.endswith("__"))}
    # Submodules show once imported, as in any package.
    submodules = {
        p.name.split(".")[0]
        for p in Path(module.__file__).parent.iterdir()
        if p.suffix in (".py", ".so") or (p / "__init__.py").exists()
    }
    stray = shown - set(module.__all__) - submodules
    assert not stray, f"rlds_writer.{package}: stray names in dir(): {sorted(stray)}"
    assert "annotations" not in dir(module)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_subpackage_lists_its_public_names_and_each_resolves(package):
    module = getattr(rlds_writer, package)  # subpackages load as attributes
    assert module.__name__ == f"rlds_writer.{package}"
    assert module.__all__, package
    folder = _ROOT / "rlds_writer" / package
    for name in module.__all__:
        # A submodule of the same name would replace the name once imported.
        assert not (folder / f"{name}.py").exists(), f"rlds_writer.{package}.{name} is a module"
        assert not (folder / name).is_dir(), f"rlds_writer.{package}.{name} is a package"
        value = _resolve(f"rlds_writer.{package}.{name}")
        assert not isinstance(value, types.ModuleType), f"rlds_writer.{package}.{name}"
    assert set(module.__all__) <= set(dir(module))


def test_a_moved_name_says_where_it_is_and_is_there():
    moved = rlds_writer._MOVED
    assert not set(moved) & TOP_LEVEL
    assert len(moved) + len(TOP_LEVEL) == 54  # the top level before the trim
    for name, place in moved.items():
        with pytest.raises(AttributeError, match=rf"has no attribute '{name}'; it is {place}$"):
            getattr(rlds_writer, name)
        assert not isinstance(_resolve(place), types.ModuleType), place
    assert rlds_writer.maintain.validate.__module__ == "rlds_writer.maintain.validation"
    assert rlds_writer.errors.SpecError.__name__ == "SpecError"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'$"):
        rlds_writer.no_such_name  # noqa: B018


# Paths users type into the package's own subpackages (README, docs, RLlib configs).
_SUBPACKAGE_PATHS = (
    "rlds_writer.store.DatasetWriter",
    "rlds_writer.store.MergeReport",
    "rlds_writer.store.writer_directory",
    "rlds_writer.store.dataset.Dataset",
    "rlds_writer.record.dm_env.EnvLogger",
    "rlds_writer.record.dm_env.TFDSBackendWriter",
    "rlds_writer.record.gymnasium.RecordRLDS",
    "rlds_writer.record.gymnasium.RecordRLDSVector",
    "rlds_writer.record.pettingzoo.RecordRLDSParallel",
    "rlds_writer.record.pettingzoo.RecordRLDSAEC",
    "rlds_writer.record.rllib.RLDSRecorder",
    "rlds_writer.record.rllib.finish_recording",
    "rlds_writer.record.rllib.runner_directories",
    "rlds_writer.record.rllib.module_runner_directories",
)


@pytest.mark.parametrize("path", _SUBPACKAGE_PATHS)
def test_a_public_path_into_store_or_record_still_works(path):
    module_name, name = path.rsplit(".", 1)
    value = _resolve(path)
    if value is None:  # its extra is not installed here
        return
    assert not isinstance(value, types.ModuleType), path
    # `from rlds_writer.record.rllib import RLDSRecorder`, as the README has it.
    assert getattr(importlib.import_module(module_name), name) is value


@pytest.mark.parametrize("package", ["store", "record"])
def test_a_module_moved_into_a_room_says_where_it_is_and_is_there(package):
    module = importlib.import_module(f"rlds_writer.{package}")
    moved = module._MOVED_MODULES
    assert moved
    for name, place in moved.items():
        with pytest.raises(AttributeError, match=rf"has no attribute '{name}'; it is {place}$"):
            getattr(module, name)
        assert place.rsplit(".", 1)[1] == name  # a moved module kept its name
        assert (_ROOT / Path(*place.split("."))).with_suffix(".py").is_file(), place


def test_old_module_paths_are_gone():
    # Nothing was released with them: no finder keeps them alive.
    done = _python(
        "import importlib, rlds_writer\n"
        "for old in ('rlds_writer.reader', 'rlds_writer.wrappers.gymnasium', "
        "'rlds_writer.converters'):\n"
        "    try:\n"
        "        importlib.import_module(old)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(f'{old} still imports')\n"
        "print('ok')\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_reload_installs_nothing_twice_and_keeps_the_names():
    done = _python(
        "import importlib, os, sys, rlds_writer\n"
        "first = rlds_writer.Catch\n"
        "for _ in range(2):\n"
        "    importlib.reload(rlds_writer)\n"
        "names = [type(f).__name__ for f in sys.meta_path]\n"
        "print(names.count('_TensorFlowLocalRuntime'), names.count('_QuietTensorFlowFinder'))\n"
        "print(rlds_writer.Catch is first, rlds_writer.maintain.validate.__name__)\n"
        "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])\n"
        # --verbose takes back our default level, also after a reload.
        "rlds_writer._tensorflow.show_tensorflow_logs()\n"
        "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["1 1", "True validate", "2", "None"]


def test_a_users_log_level_survives_a_reload_and_verbose():
    done = _python(
        "import importlib, os, rlds_writer\n"
        "importlib.reload(rlds_writer)\n"
        "rlds_writer._tensorflow.show_tensorflow_logs()\n"
        "print(os.environ['TF_CPP_MIN_LOG_LEVEL'])\n",
        TF_CPP_MIN_LOG_LEVEL="1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "1"


def test_importing_and_using_the_package_raises_no_deprecation_warning_of_ours():
    # pyproject no longer ignores DeprecationWarning: ours would fail the suite.
    done = _python(
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import rlds_writer\n"
        "for package in ('record', 'store', 'read', 'maintain', 'interop'):\n"
        "    getattr(rlds_writer, package)\n"
        "rlds_writer.open_dataset, rlds_writer.TFDSBackendWriter\n"
        "print('ok')\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
