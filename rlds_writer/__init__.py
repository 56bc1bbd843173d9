"""rlds_writer: record RL rollouts as RLDS episodes in TFDS datasets.

Heavy modules (TensorFlow, TFDS) are imported only when a name that needs them
is first used, so `import rlds_writer` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    "DatasetConfig": ("rlds_writer.config", "dataset_config_class"),
    "config_from_env": ("rlds_writer.config", "config_from_env"),
    "feature_from_spec": ("rlds_writer.config", "feature_from_spec"),
    "TFDSBackendWriter": ("rlds_writer.backend", "TFDSBackendWriter"),
    "DatasetWriter": ("rlds_writer.writer", "DatasetWriter"),
    "EnvLogger": ("rlds_writer.wrappers.dm_env_logger", "EnvLogger"),
    "recover": ("rlds_writer.recovery", "recover"),
    "RecoveryReport": ("rlds_writer.recovery", "RecoveryReport"),
    "merge": ("rlds_writer.merge", "merge"),
    "MergeReport": ("rlds_writer.merge", "MergeReport"),
    "writer_directory": ("rlds_writer.merge", "writer_directory"),
    "info": ("rlds_writer.inspection", "info"),
    "validate": ("rlds_writer.inspection", "validate"),
    "Catch": ("rlds_writer.envs.catch", "Catch"),
    "RecordRLDS": ("rlds_writer.wrappers.gymnasium", "RecordRLDS"),
    "RecordRLDSVector": ("rlds_writer.wrappers.gymnasium", "RecordRLDSVector"),
    "config_from_spaces": ("rlds_writer.spaces", "config_from_spaces"),
    "feature_from_space": ("rlds_writer.spaces", "feature_from_space"),
    "RLDSRecorder": ("rlds_writer.integrations.rllib", "RLDSRecorder"),
    "finish_recording": ("rlds_writer.integrations.rllib", "finish_recording"),
    "compute_statistics": ("rlds_writer.statistics", "compute_statistics"),
    "plot_statistics": ("rlds_writer.statistics", "plot_statistics"),
    "convert": ("rlds_writer.converters", "convert"),
    "open_dataset": ("rlds_writer.reader", "open_dataset"),
    "DatasetReader": ("rlds_writer.reader", "DatasetReader"),
    "RLDSWriterError": ("rlds_writer.errors", "RLDSWriterError"),
    "StepValueError": ("rlds_writer.errors", "StepValueError"),
    "SpecError": ("rlds_writer.errors", "SpecError"),
    "EncodingError": ("rlds_writer.errors", "EncodingError"),
    "DatasetExistsError": ("rlds_writer.errors", "DatasetExistsError"),
    "IncompatibleDatasetError": ("rlds_writer.errors", "IncompatibleDatasetError"),
    "LockedError": ("rlds_writer.errors", "LockedError"),
    "WriterFailedError": ("rlds_writer.errors", "WriterFailedError"),
    "WriterClosedError": ("rlds_writer.errors", "WriterClosedError"),
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
