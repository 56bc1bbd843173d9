"""rlds_writer: record RL rollouts as RLDS episodes in TFDS datasets.

The package is laid out by the stages data passes through (see
docs/architecture.md): `record` (adapters and the recorder) -> `store` (the
disk format and the dataset writer); `read` (the TF-free reading path);
`maintain` (recover, merge, inspect, statistics); `interop` (other formats in
and out); `cli`. Heavy modules (TensorFlow, TFDS) are imported only when a name
that needs them is first used, so `import rlds_writer` stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings
from typing import Any

__version__ = "0.1.0"

# TensorFlow's C++ start-up and tf.data info lines drown a recorder's own
# output; a user who wants them sets the variable before importing us.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


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
    "export_minari": ("rlds_writer.interop.export_minari", "export"),
    "export_rllib": ("rlds_writer.interop.export_rllib", "export"),
    "export_hf": ("rlds_writer.interop.export_hf", "export"),
    "export_d3rlpy": ("rlds_writer.interop.export_d3rlpy", "export"),
    "to_d3rlpy": ("rlds_writer.interop.export_d3rlpy", "to_d3rlpy"),
    "export_lerobot": ("rlds_writer.interop.export_lerobot", "export"),
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
}

# Names whose attribute is a factory returning the real object.
_FACTORIES = {"DatasetConfig"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlds_writer' has no attribute {name!r}")
    module_name, attr = _EXPORTS[name]
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
