"""maintain: user-facing tools over whole datasets on disk.

`recover` (repair after a crash: `rlds_writer.recover`, with its
`RecoveryReport`), `info` and `validate` (inspection), per-split episode
statistics (`compute_statistics`, `plot_statistics`), per-dimension statistics
for normalisation (`dataset_statistics`, also as an Apache Beam pipeline in
`beam_statistics.py`) and `show` (an episode as a GIF or MP4,
`episode_video.py`). Combining directories (`merge`) is in `store`, which
the writer and the RLlib recorder need it from.

Public here: `info`, `validate`, `RecoveryReport`, `compute_statistics`,
`plot_statistics`, `dataset_statistics`.

May import: `rlds_writer.errors`, `rlds_writer.store`, `rlds_writer.read`.
Never `record`, `interop` or `cli`.
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "info": ("rlds_writer.maintain.summary", "info"),
        "validate": ("rlds_writer.maintain.validation", "validate"),
        "RecoveryReport": ("rlds_writer.maintain.recover", "RecoveryReport"),
        "compute_statistics": ("rlds_writer.maintain.statistics", "compute_statistics"),
        "plot_statistics": ("rlds_writer.maintain.statistics", "plot_statistics"),
        "dataset_statistics": ("rlds_writer.maintain.field_statistics", "dataset_statistics"),
    },
)
