"""A missing optional library is one line: the feature, the module, the `pip install` of its extra.

The real install has every extra, so each test runs in a subprocess whose
import system refuses the library, exactly as if it were not installed
(`ModuleNotFoundError` with its `name`), before `rlds_writer` is imported.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlds_writer import errors
from rlds_writer.interop import EXPORT_FORMATS, FORMATS

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="")

# Makes the modules in BLOCKED unimportable, as when they are not installed.
BLOCKER = """
import importlib.abc, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

CLI = BLOCKER + "from rlds_writer.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"


def _python(code, blocked, *args):
    program = f"BLOCKED = {set(blocked)!r}\n" + code
    return subprocess.run(
        [sys.executable, "-c", program, *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        cwd=ROOT,
    )


def _one_line(result):
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# (blocked module, argv with SRC for the Catch dataset and OUT for a new path, expected line)
CASES = {
    "stats --plot": (
        "matplotlib",
        ["stats", "SRC", "--plot", "OUT.png"],
        "rlds-writer stats: error: plotting statistics needs matplotlib, which is not "
        'installed: pip install "rlds_writer[plot]"',
    ),
    "export --to hf": (
        "datasets",
        ["export", "SRC", "OUT", "--to", "hf"],
        "rlds-writer export: error: exporting to Hugging Face datasets needs datasets, which "
        'is not installed: pip install "rlds_writer[hf]"',
    ),
    "export --to minari": (
        "minari",
        ["export", "SRC", "catch/blocked-v0", "--to", "minari"],
        "rlds-writer export: error: exporting to Minari datasets needs minari, which is not "
        'installed: pip install "rlds_writer[convert]"',
    ),
    "export --to lerobot": (
        "pyarrow",
        ["export", "SRC", "OUT", "--to", "lerobot"],
        "rlds-writer export: error: exporting to LeRobot v3.0 datasets needs pyarrow, which "
        'is not installed: pip install "rlds_writer[lerobot]"',
    ),
    "export --to rllib-episodes": (
        "ray",
        ["export", "SRC", "OUT", "--to", "rllib-episodes"],
        "rlds-writer export: error: exporting to RLlib offline input needs ray, which is not "
        'installed: pip install "rlds_writer[rllib,convert]"',
    ),
    "convert --from minari": (
        "minari",
        ["convert", "--from", "minari", "cartpole/x-v0", "OUT"],
        "rlds-writer convert: error: converting Minari datasets needs minari, which is not "
        'installed: pip install "rlds_writer[convert]"',
    ),
    "convert --from d4rl-hdf5": (
        "h5py",
        ["convert", "--from", "d4rl-hdf5", "SRC.hdf5", "OUT"],
        "rlds-writer convert: error: converting D4RL-style HDF5 files needs h5py, which is not "
        'installed: pip install "rlds_writer[convert]"',
    ),
}


# The RLlib export case took 15.7 s under load, 3-6x each other case: slow.
_SLOW_CASES = {"export --to rllib-episodes"}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in _SLOW_CASES else c for c in CASES]
)
def test_the_command_line_names_the_extra_to_install(tmp_path, catch, case):
    blocked, argv, expected = CASES[case]
    argv = [str(catch) if a == "SRC" else a.replace("SRC", str(tmp_path / "src")) for a in argv]
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    line = _one_line(_python(CLI, [blocked], *argv))
    assert line == expected
    assert not (tmp_path / "out").exists()


def test_nothing_optional_is_needed_to_import_or_to_ask_for_help():
    code = BLOCKER + (
        "import rlds_writer, rlds_writer.cli, rlds_writer.interop\n"
        "from rlds_writer.cli.main import main\n"
        "for argv in (['--help'], ['convert', '--help'], ['export', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e\n"
        "print('ok')\n"
    )
    result = _python(code, list(errors.OPTIONAL_MODULES))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_import_never_fails_and_using_the_feature_names_the_extra():
    code = BLOCKER + (
        "import rlds_writer\n"
        "print('imported')\n"
        "try:\n"
        "    from rlds_writer import RecordRLDS\n"
        "except rlds_writer.errors.MissingDependencyError as e:\n"
        "    assert isinstance(e, ModuleNotFoundError) and isinstance(e, ImportError)\n"
        "    assert isinstance(e, rlds_writer.RLDSWriterError)\n"
        "    print(e.name, e.extra)\n"
        "    print(e)\n"
    )
    result = _python(code, ["gymnasium"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "imported",
        "gymnasium gymnasium",
        "rlds_writer.RecordRLDS needs gymnasium, which is not installed: "
        'pip install "rlds_writer[gymnasium]"',
    ]


@pytest.mark.parametrize(
    "call, blocked, expected",
    [
        (
            "rlds_writer.export(SRC, OUT, to='hf')",
            "datasets",
            "exporting to Hugging Face datasets needs datasets, which is not installed: "
            'pip install "rlds_writer[hf]"',
        ),
        (
            "rlds_writer.interop.export.export_hf(SRC, OUT)",
            "datasets",
            "exporting to Hugging Face datasets needs datasets, which is not installed: "
            'pip install "rlds_writer[hf]"',
        ),
        (
            "rlds_writer.maintain.plot_statistics(rlds_writer.maintain.compute_statistics(SRC, "
            "per_episode=True), OUT + '.png')",
            "matplotlib",
            "plotting statistics needs matplotlib, which is not installed: "
            'pip install "rlds_writer[plot]"',
        ),
        (
            "from rlds_writer.read.ray_data import read_rlds",
            "ray",
            "rlds_writer.read.ray_data (reading RLDS with Ray Data) needs ray, which is not "
            'installed: pip install "rlds_writer[rllib]"',
        ),
        (
            "from rlds_writer.interop.formats.rllib.offline import offline_config",
            "ray",
            "rlds_writer.interop.formats.rllib.offline (RLlib offline training) needs ray, which "
            'is not installed: pip install "rlds_writer[rllib]"',
        ),
        pytest.param(
            # Checked on the driver: on Ray's read tasks the ImportError came too late, buried.
            "from ray.rllib.algorithms.bc import BCConfig\n"
            "    from rlds_writer.interop.formats.rllib.offline import offline_config\n"
            "    offline_config(BCConfig(), SRC, schema='episodes')",
            "msgpack_numpy",
            "reading RLlib's episode schema (offline_config(schema='episodes')) needs "
            'msgpack_numpy, which is not installed: pip install "rlds_writer[rllib]"',
            marks=pytest.mark.slow,  # imports RLlib: 10-20 s
            id="offline_config-episodes",
        ),
        (
            "from rlds_writer.read.torch_data import RLDSIterableDataset",
            "torch",
            "rlds_writer.read.torch_data (PyTorch datasets) needs torch, which is not installed: "
            'pip install "rlds_writer[torch]"',
        ),
        (
            "rlds_writer.convert('minari', 'cartpole/x-v0', OUT)",
            "minari",
            "converting Minari datasets needs minari, which is not installed: "
            'pip install "rlds_writer[convert]"',
        ),
    ],
)
def test_python_calls_raise_the_same_error(tmp_path, catch, call, blocked, expected):
    code = BLOCKER + (
        f"import rlds_writer\nSRC, OUT = {str(catch)!r}, {str(tmp_path / 'out')!r}\n"
        f"try:\n    {call}\n"
        "except rlds_writer.errors.MissingDependencyError as e:\n    print(e)\n"
    )
    result = _python(code, [blocked])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def _setup_extras():
    """setup.py's `_EXTRAS`, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_EXTRAS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no _EXTRAS literal")


def test_each_optional_module_is_installed_by_the_extra_named_for_it():
    extras = _setup_extras()
    providers = importlib.metadata.packages_distributions()

    def requirement_names(extra):
        return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in extras[extra]}

    def norm(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    for module, extra in errors.OPTIONAL_MODULES.items():
        assert extra in extras, f"{module}: extra {extra!r} is not in setup.py"
        # The distributions that provide the module (its own name if not installed here).
        dists = {norm(d) for d in providers.get(module, [module])}
        assert dists & {norm(r) for r in requirement_names(extra)}, (module, extra, dists)
    # And each format's extras exist.
    for fmt in [*FORMATS.values(), *EXPORT_FORMATS.values()]:
        for extra in (fmt.extra or "").split(","):
            assert not extra or extra in extras, (fmt, extra)


def test_the_rllib_extra_installs_what_the_documented_offline_examples_import():
    # docs/reader.md's MARWIL example reads RLlib's episode schema (msgpack'd episodes):
    # a user with only the `rllib` extra the docs name could not run it.
    names = {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in _setup_extras()["rllib"]}
    assert {"ray", "torch", "msgpack", "msgpack-numpy"} <= names, names
