"""rlds_writer: record RL rollouts as RLDS episodes in TFDS datasets.

The package is laid out by the stages data passes through (see
docs/architecture.md): `record` (adapters and the recorder) -> `store` (the
disk format and the dataset writer); `read` (the TF-free reading path);
`maintain` (recover, merge, inspect, statistics); `interop` (other formats in
and out); `cli`. Heavy modules (TensorFlow, TFDS) are imported only when a name
that needs them is first used, so `import rlds_writer` stays cheap, and it
never fails for a missing optional library: using a name that needs one raises
`MissingDependencyError`, naming the extra to install.

TensorFlow is quiet: its C++ log lines below warnings are off
(`TF_CPP_MIN_LOG_LEVEL=2` unless the variable is set), and the notices it
prints while it is imported, before it reads that variable (oneDNN, CPU
instructions, absl's "All log messages before absl::InitializeLog()"), are
held back by the same rule. Set `TF_CPP_MIN_LOG_LEVEL=0` before importing us
to see everything.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from typing import Any

__version__ = "0.1.0"

# TensorFlow's C++ start-up and tf.data info lines drown a recorder's own
# output; a user who wants them sets the variable before importing us.
_TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
_TF_LOG_LEVEL_OURS = _TF_LOG_LEVEL not in os.environ
os.environ.setdefault(_TF_LOG_LEVEL, "2")


class _TensorFlowLocalRuntime(importlib.abc.MetaPathFinder):
    """Makes TensorFlow load its runtime RTLD_LOCAL, as its releases other than 2.20-2.21 do.

    TensorFlow 2.20-2.21's PyPI wheels load their runtime with RTLD_GLOBAL, which
    puts its statically linked LLVM in the process's symbol table; triton (which
    PyPI's CUDA build of torch brings, and which torch imports at its first
    optimizer) then binds to that LLVM and aborts the process (SIGSEGV/SIGABRT).
    TensorFlow's own fix (tensorflow#124205) leaves out the module that asks for
    RTLD_GLOBAL; this finder makes importing it fail the same way. It has effect
    only if installed before TensorFlow loads.
    """

    _NAME = "tensorflow.python.pywrap_dlopen_global_flags"

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self._NAME:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if not any(isinstance(f, _TensorFlowLocalRuntime) for f in sys.meta_path):
    sys.meta_path.insert(0, _TensorFlowLocalRuntime())

# public name -> (module, attribute)
_EXPORTS = {
    "DatasetConfig": ("rlds_writer.record.config", "dataset_config_class"),
    "config_from_env": ("rlds_writer.record.config", "config_from_env"),
    "feature_from_spec": ("rlds_writer.record.config", "feature_from_spec"),
    "TFDSBackendWriter": ("rlds_writer.record.backend", "TFDSBackendWriter"),
    "DatasetWriter": ("rlds_writer.store.writer", "DatasetWriter"),
    "EnvLogger": ("rlds_writer.record.dm_env", "EnvLogger"),
    "recover": ("rlds_writer.maintain.recover", "recover"),
    "RecoveryReport": ("rlds_writer.maintain.recover", "RecoveryReport"),
    "merge": ("rlds_writer.store.merge", "merge"),
    "MergeReport": ("rlds_writer.store.merge", "MergeReport"),
    "writer_directory": ("rlds_writer.store.merge", "writer_directory"),
    "info": ("rlds_writer.maintain.inspection", "info"),
    "validate": ("rlds_writer.maintain.inspection", "validate"),
    "Catch": ("rlds_writer.envs.catch", "Catch"),
    "RecordRLDS": ("rlds_writer.record.gymnasium", "RecordRLDS"),
    "RecordRLDSVector": ("rlds_writer.record.gymnasium", "RecordRLDSVector"),
    "config_from_spaces": ("rlds_writer.record.spaces", "config_from_spaces"),
    "feature_from_space": ("rlds_writer.record.spaces", "feature_from_space"),
    "RecordRLDSParallel": ("rlds_writer.record.pettingzoo", "RecordRLDSParallel"),
    "RecordRLDSAEC": ("rlds_writer.record.pettingzoo", "RecordRLDSAEC"),
    "RLDSRecorder": ("rlds_writer.record.rllib", "RLDSRecorder"),
    "finish_recording": ("rlds_writer.record.rllib", "finish_recording"),
    "compute_statistics": ("rlds_writer.maintain.statistics", "compute_statistics"),
    "dataset_statistics": ("rlds_writer.maintain.field_statistics", "dataset_statistics"),
    "plot_statistics": ("rlds_writer.maintain.statistics", "plot_statistics"),
    "convert": ("rlds_writer.interop", "convert"),
    "export": ("rlds_writer.interop.export", "export"),
    "ExportReport": ("rlds_writer.interop.export", "ExportReport"),
    "export_minari": ("rlds_writer.interop.export", "export_minari"),
    "export_rllib": ("rlds_writer.interop.export", "export_rllib"),
    "export_hf": ("rlds_writer.interop.export", "export_hf"),
    "export_d3rlpy": ("rlds_writer.interop.export", "export_d3rlpy"),
    "to_d3rlpy": ("rlds_writer.interop.formats.d3rlpy.exporter", "to_d3rlpy"),
    "export_lerobot": ("rlds_writer.interop.export", "export_lerobot"),
    "open_dataset": ("rlds_writer.read.reader", "open_dataset"),
    "DatasetReader": ("rlds_writer.read.reader", "DatasetReader"),
    "RLDSWriterError": ("rlds_writer.errors", "RLDSWriterError"),
    "StepValueError": ("rlds_writer.errors", "StepValueError"),
    "SpecError": ("rlds_writer.errors", "SpecError"),
    "EncodingError": ("rlds_writer.errors", "EncodingError"),
    "DatasetExistsError": ("rlds_writer.errors", "DatasetExistsError"),
    "IncompatibleDatasetError": ("rlds_writer.errors", "IncompatibleDatasetError"),
    "UnsupportedFeatureError": ("rlds_writer.errors", "UnsupportedFeatureError"),
    "LockedError": ("rlds_writer.errors", "LockedError"),
    "WriterFailedError": ("rlds_writer.errors", "WriterFailedError"),
    "WriterClosedError": ("rlds_writer.errors", "WriterClosedError"),
    "CorruptRecordError": ("rlds_writer.errors", "CorruptRecordError"),
    "DecodeError": ("rlds_writer.errors", "DecodeError"),
    "RecoveryError": ("rlds_writer.errors", "RecoveryError"),
    "DiskFullError": ("rlds_writer.errors", "DiskFullError"),
    "MergeError": ("rlds_writer.errors", "MergeError"),
    "MissingDependencyError": ("rlds_writer.errors", "MissingDependencyError"),
    "NotADatasetError": ("rlds_writer.errors", "NotADatasetError"),
    "SourceError": ("rlds_writer.errors", "SourceError"),
}

# Names whose attribute is a factory returning the real object.
_FACTORIES = {"DatasetConfig"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlds_writer' has no attribute {name!r}")
    from rlds_writer.errors import optional_dependencies

    module_name, attr = _EXPORTS[name]
    # RecordRLDS without gymnasium, RLDSRecorder without ray...: one clear line.
    with optional_dependencies(f"rlds_writer.{name}"):
        value = getattr(importlib.import_module(module_name), attr)
    if name in _FACTORIES:
        value = value()
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


# Module paths of releases before the stage layout, still importable (with a
# DeprecationWarning) so that existing scripts and pickled RLlib configs load.
# `rlds_writer.merge` and `rlds_writer.convert` are functions, not listed here.
_MOVED_MODULES = {
    "rlds_writer.reader": "rlds_writer.read.reader",
    "rlds_writer.torch_data": "rlds_writer.read.torch_data",
    "rlds_writer.inspection": "rlds_writer.maintain.inspection",
    "rlds_writer.statistics": "rlds_writer.maintain.statistics",
    "rlds_writer.recovery": "rlds_writer.maintain.recover",
    "rlds_writer.writer": "rlds_writer.store.writer",
    "rlds_writer.config": "rlds_writer.record.config",
    "rlds_writer.spaces": "rlds_writer.record.spaces",
    "rlds_writer.backend": "rlds_writer.record.backend",
    "rlds_writer.wrappers": None,
    "rlds_writer.wrappers.dm_env_logger": "rlds_writer.record.dm_env",
    "rlds_writer.wrappers.gymnasium": "rlds_writer.record.gymnasium",
    "rlds_writer.integrations": None,
    "rlds_writer.integrations.rllib": "rlds_writer.record.rllib",
    "rlds_writer.converters": "rlds_writer.interop",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the module that now holds its code."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, is_package=_MOVED_MODULES[fullname] is None
        )

    def create_module(self, spec: Any) -> types.ModuleType:
        new = _MOVED_MODULES[spec.name]
        if new is None:  # an old package that now only holds aliases
            return types.ModuleType(spec.name)
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (or use rlds_writer.<name>)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


# The notices TensorFlow writes to stderr while it is imported, before it reads
# TF_CPP_MIN_LOG_LEVEL: absl-format lines ("I0000 00:00:... port.cc:153] oneDNN
# custom operations are on...") and absl's own preamble. TF 2.21 prints them
# whatever the variable says; only TF_ENABLE_ONEDNN_OPTS=0 (which changes
# numerics) stops the oneDNN one. We apply the variable to them ourselves.
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called"
# The second line of TF's cpu_feature_guard notice.
_CONTINUATION = b"To enable the following instructions"
_SEVERITIES = b"IWEF"


def _min_log_level() -> int:
    try:
        return int(os.environ.get(_TF_LOG_LEVEL, "0"))
    except ValueError:
        return 0


def _below_level(output: bytes, level: int) -> bytes:
    """`output` without the absl lines whose severity is below `level`."""
    kept = []
    dropped = False
    for line in output.splitlines(keepends=True):
        match = _ABSL_LINE.match(line)
        if match:
            dropped = _SEVERITIES.index(match.group(1)) < level
        elif line.startswith(_ABSL_PREAMBLE):
            dropped = level >= 1
        elif not (dropped and line.startswith(_CONTINUATION)):
            dropped = False
        if not dropped:
            kept.append(line)
    return b"".join(kept)


@contextlib.contextmanager
def _stderr_filtered(level: int) -> Iterator[None]:
    """Holds back what is written to file descriptor 2, then writes it minus the notices.

    Everything else written meanwhile (other threads, Python warnings, an
    error while importing) is written out afterwards, in order.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):  # no usable stderr: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            rest = _below_level(held.read(), level)
            if rest:
                os.write(2, rest)


class _QuietTensorFlowLoader(importlib.abc.Loader):
    """Runs TensorFlow's own loader with its import notices filtered (`_below_level`)."""

    def __init__(self, loader: Any, level: int):
        self._loader = loader
        self._level = level

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps TensorFlow's loader (resources, reloads): we only wrap this call.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with _stderr_filtered(self._level):
            self._loader.exec_module(module)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as the other finders do, with `_QuietTensorFlowLoader` around it."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "tensorflow" or self._finding:
            return None
        level = _min_log_level()
        if level < 1:  # the user asked for everything
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _QuietTensorFlowLoader(spec.loader, level)
        return spec


def _show_tensorflow_logs() -> None:
    """Lets TensorFlow log as it would without us (`rlds-writer --verbose`).

    A level the user set stays; only our default is taken back.
    """
    if _TF_LOG_LEVEL_OURS:
        os.environ.pop(_TF_LOG_LEVEL, None)


if not any(type(f).__name__ == "_QuietTensorFlowFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietTensorFlowFinder())
