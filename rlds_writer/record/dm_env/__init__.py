"""record.dm_env: the dm_env adapter, envlogger's interface.

`env_logger` (`EnvLogger`, a `dm_env.Environment` wrapper), `backend`
(`TFDSBackendWriter`, envlogger's backend by name) and `whole_episodes`
(`write_episode`: episodes a user already has, through the same recorder).

May import: the recording core (`rlds_writer.record.*` modules at its top),
`rlds_writer.store`, `rlds_writer.errors`. Never another adapter.
"""

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "EnvLogger": ("rlds_writer.record.dm_env.env_logger", "EnvLogger"),
        "StepFn": ("rlds_writer.record.dm_env.env_logger", "StepFn"),
        "TFDSBackendWriter": ("rlds_writer.record.dm_env.backend", "TFDSBackendWriter"),
    },
)
