"""record.rllib: recording the episodes RLlib's EnvRunners play.

`rllib_recorder` (`RLDSRecorder`, the callback, and `finish_recording`),
`rllib_options` (its options), `rllib_chunks` (episode chunks to one RLDS
episode), `rllib_multiagent` (one dataset per module), `rllib_directories`
(the runner directories: found, claimed, merged), `rllib_sink` and
`rllib_delivery` (how every runner's episodes reach the driver) and
`rllib_tf` (TensorFlow kept eager in RLlib processes).

Public here: `RLDSRecorder`, `finish_recording`, `runner_directories`,
`recorded_episode_counts`, `module_runner_directories`, `METRICS_KEY`.

May import: the recording core, `rlds_writer.store`, `rlds_writer.errors`.
Never another adapter.
"""

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        name: ("rlds_writer.record.rllib.rllib_recorder", name)
        for name in (
            "RLDSRecorder",
            "finish_recording",
            "runner_directories",
            "recorded_episode_counts",
            "module_runner_directories",
            "METRICS_KEY",
        )
    },
)
