"""record: turning rollouts into episodes handed to the store.

Adapters talk to one recorder contract (`recorder.Recorder`), which checks and
buffers steps per episode, aligns them to RLDS and hands finished episodes to
`store.writer.DatasetWriter`:

- dm_env: `EnvLogger`, with envlogger's backend name `TFDSBackendWriter`
  (which also writes whole episodes from arrays, `write_episode`);
- Gymnasium: `RecordRLDS`, `RecordRLDSVector`;
- PettingZoo: `RecordRLDSParallel`, `RecordRLDSAEC`;
- RLlib: the `RLDSRecorder` callback and `finish_recording`.

The features recorded come from env specs (`config_from_env`,
`feature_from_spec`) or Gymnasium spaces (`config_from_spaces`,
`feature_from_space`). The names above are importable from here
(`from rlds_writer.record import feature_from_space`); the common ones also
from `rlds_writer`.

May import: `rlds_writer.errors`, `rlds_writer.store`. Never `read`,
`maintain`, `interop` or `cli`.
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "EnvLogger": ("rlds_writer.record.dm_env", "EnvLogger"),
        "TFDSBackendWriter": ("rlds_writer.record.backend", "TFDSBackendWriter"),
        "RecordRLDS": ("rlds_writer.record.gymnasium", "RecordRLDS"),
        "RecordRLDSVector": ("rlds_writer.record.gymnasium_vector", "RecordRLDSVector"),
        "RecordRLDSParallel": ("rlds_writer.record.pettingzoo", "RecordRLDSParallel"),
        "RecordRLDSAEC": ("rlds_writer.record.pettingzoo", "RecordRLDSAEC"),
        "RLDSRecorder": ("rlds_writer.record.rllib", "RLDSRecorder"),
        "finish_recording": ("rlds_writer.record.rllib", "finish_recording"),
        "config_from_env": ("rlds_writer.record.config", "config_from_env"),
        "feature_from_spec": ("rlds_writer.record.config", "feature_from_spec"),
        "config_from_spaces": ("rlds_writer.record.spaces", "config_from_spaces"),
        "feature_from_space": ("rlds_writer.record.spaces", "feature_from_space"),
    },
)
