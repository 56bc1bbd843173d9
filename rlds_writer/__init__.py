"""rlds_writer: record RL rollouts as RLDS episodes in TFDS datasets.

The top level holds what a user types in the first hour: the recorders
(`EnvLogger`, `TFDSBackendWriter`, `RecordRLDS`, `RecordRLDSVector`,
`RecordRLDSParallel`, `RecordRLDSAEC`, `RLDSRecorder`), the feature config
(`DatasetConfig`, `config_from_env`, `config_from_spaces`), the demo env
`Catch`, reading (`open_dataset`), the whole-dataset verbs (`recover`,
`merge`, `convert`, `export`) and the error base `RLDSWriterError`.
Everything else is public in its subpackage, laid out by the stages data
passes through (docs/architecture.md):

- `rlds_writer.record`: adapters, the recorder, features from env specs and spaces;
- `rlds_writer.store`: the disk format and the dataset writer (`DatasetWriter`);
- `rlds_writer.read`: the TF-free reading path (`DatasetReader`, torch datasets);
- `rlds_writer.maintain`: `info`, `validate`, statistics, `show`;
- `rlds_writer.view`: `rlds-writer view`, the dataset browser in a web page;
- `rlds_writer.interop`: other formats in (`convert`) and out (`export.export_minari`,
  ..., `to_d3rlpy`);
- `rlds_writer.errors`: every error class; `rlds_writer.cli`: the `rlds-writer` tool.

Heavy modules (TensorFlow, TFDS) are imported only when a name that needs
them is first used, so `import rlds_writer` stays cheap, and it never fails
for a missing optional library: using a name that needs one raises
`MissingDependencyError`, naming the extra to install.

TensorFlow is quiet: its C++ log lines below warnings are off
(`TF_CPP_MIN_LOG_LEVEL=2` unless the variable is set), and the notices it
prints while it is imported, before it reads that variable (oneDNN, CPU
instructions, absl's "All log messages before absl::InitializeLog()"), are
held back by the same rule. Set `TF_CPP_MIN_LOG_LEVEL=0` before importing us
to see everything (`rlds_writer/_tensorflow.py`).
"""

from __future__ import annotations

from rlds_writer import _tensorflow
from rlds_writer._exports import lazy_exports

# First, before anything here can import TensorFlow.
_tensorflow.install()

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    # Recording.
    "EnvLogger": ("rlds_writer.record.dm_env.env_logger", "EnvLogger"),
    "TFDSBackendWriter": ("rlds_writer.record.dm_env.backend", "TFDSBackendWriter"),
    "RecordRLDS": ("rlds_writer.record.gymnasium.gymnasium_wrapper", "RecordRLDS"),
    "RecordRLDSVector": ("rlds_writer.record.gymnasium.gymnasium_vector", "RecordRLDSVector"),
    "RecordRLDSParallel": (
        "rlds_writer.record.pettingzoo.pettingzoo_wrappers",
        "RecordRLDSParallel",
    ),
    "RecordRLDSAEC": ("rlds_writer.record.pettingzoo.pettingzoo_wrappers", "RecordRLDSAEC"),
    "RLDSRecorder": ("rlds_writer.record.rllib.rllib_recorder", "RLDSRecorder"),
    # What is recorded.
    "DatasetConfig": ("rlds_writer.record.config", "dataset_config_class"),
    "config_from_env": ("rlds_writer.record.config", "config_from_env"),
    "config_from_spaces": ("rlds_writer.record.spaces", "config_from_spaces"),
    "Catch": ("rlds_writer.envs.catch", "Catch"),
    # Reading, and whole datasets.
    "open_dataset": ("rlds_writer.read.reader", "open_dataset"),
    "recover": ("rlds_writer.maintain.recover", "recover"),
    "merge": ("rlds_writer.store.repair.merge", "merge"),
    "convert": ("rlds_writer.interop", "convert"),
    "export": ("rlds_writer.interop.export", "export"),
    # The one error a user catches; the others are in rlds_writer.errors.
    "RLDSWriterError": ("rlds_writer.errors", "RLDSWriterError"),
}

# Names the top level held before 0.2 (CHANGELOG.md), and where they are now.
_MOVED = {
    **{
        name: f"rlds_writer.record.{name}"
        for name in ("feature_from_spec", "feature_from_space", "finish_recording")
    },
    **{
        name: f"rlds_writer.store.{name}"
        for name in ("DatasetWriter", "MergeReport", "writer_directory")
    },
    "DatasetReader": "rlds_writer.read.DatasetReader",
    **{
        name: f"rlds_writer.maintain.{name}"
        for name in (
            "info",
            "validate",
            "RecoveryReport",
            "compute_statistics",
            "dataset_statistics",
            "plot_statistics",
        )
    },
    "ExportReport": "rlds_writer.interop.ExportReport",
    "to_d3rlpy": "rlds_writer.interop.to_d3rlpy",
    **{
        name: f"rlds_writer.interop.export.{name}"
        for name in (
            "export_minari",
            "export_rllib",
            "export_hf",
            "export_d3rlpy",
            "export_lerobot",
        )
    },
    **{
        name: f"rlds_writer.errors.{name}"
        for name in (
            "StepValueError",
            "SpecError",
            "EncodingError",
            "DatasetExistsError",
            "IncompatibleDatasetError",
            "UnsupportedFeatureError",
            "LockedError",
            "WriterFailedError",
            "WriterClosedError",
            "CorruptRecordError",
            "DecodeError",
            "RecoveryError",
            "DiskFullError",
            "MergeError",
            "MissingDependencyError",
            "NotADatasetError",
            "SourceError",
        )
    },
}

# `DatasetConfig` is TFDS's class: `dataset_config_class` imports it on first use.
lazy_exports(
    globals(),
    _EXPORTS,
    factories={"DatasetConfig"},
    submodules=("record", "store", "read", "maintain", "view", "interop", "errors", "envs", "cli"),
    moved=_MOVED,
)
