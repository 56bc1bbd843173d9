"""record: turning rollouts into episodes handed to the store.

The recording core is the modules here: adapters talk to one recorder
contract (`recorder.Recorder`), which checks and buffers steps per episode
(`episode`, `appender`, `columns`, `values`, `step_kernel`), aligns them to
RLDS and hands finished episodes to `store.writing.writer.DatasetWriter`.
Each adapter is a subpackage:

- `dm_env/`: `EnvLogger`, with envlogger's backend name `TFDSBackendWriter`
  (which also writes whole episodes from arrays, `write_episode`);
- `gymnasium/`: `RecordRLDS`, `RecordRLDSVector`;
- `pettingzoo/`: `RecordRLDSParallel`, `RecordRLDSAEC`;
- `rllib/`: the `RLDSRecorder` callback and `finish_recording`.

The features recorded come from env specs (`config_from_env`,
`feature_from_spec`) or Gymnasium spaces (`config_from_spaces`,
`feature_from_space`). The names above are importable from here
(`from rlds_writer.record import feature_from_space`); the common ones also
from `rlds_writer`.

May import: `rlds_writer.errors`, `rlds_writer.store`. Never `read`,
`maintain`, `interop` or `cli`. The core never imports an adapter, and an
adapter never imports another (tests/package/test_layers.py).
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

# Modules that were in record/ before 0.2 (CHANGELOG.md), and where they are now.
_MOVED_MODULES = {
    "backend": "rlds_writer.record.dm_env.backend",
    "whole_episodes": "rlds_writer.record.dm_env.whole_episodes",
    "gymnasium_vector": "rlds_writer.record.gymnasium.gymnasium_vector",
    "pettingzoo_joint": "rlds_writer.record.pettingzoo.pettingzoo_joint",
    **{
        name: f"rlds_writer.record.rllib.{name}"
        for name in (
            "rllib_chunks",
            "rllib_delivery",
            "rllib_directories",
            "rllib_multiagent",
            "rllib_options",
            "rllib_sink",
            "rllib_tf",
        )
    },
}

lazy_exports(
    globals(),
    {
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
        "finish_recording": ("rlds_writer.record.rllib.rllib_recorder", "finish_recording"),
        "config_from_env": ("rlds_writer.record.config", "config_from_env"),
        "feature_from_spec": ("rlds_writer.record.config", "feature_from_spec"),
        "config_from_spaces": ("rlds_writer.record.spaces", "config_from_spaces"),
        "feature_from_space": ("rlds_writer.record.spaces", "feature_from_space"),
    },
    submodules=("dm_env", "gymnasium", "pettingzoo", "rllib"),
    moved=_MOVED_MODULES,
)
