"""LeRobot v3.0 datasets, both ways.

`importer.py` (`convert --from lerobot`, with `meta.py` reading `info.json`,
`tasks.parquet` and `meta/episodes` as untrusted input) and `exporter.py`
(`export --to lerobot`, in steps: `export_plan.py` maps the features to
columns and schemas, `export_episodes.py` writes the frames and episode rows,
`export_meta.py` the metadata files); shared by both: `layout.py` (paths,
names, `RollingParquet`), `columns.py` (columns and Arrow types), `stats.py`
and `video.py` (MP4 cameras).
"""

from __future__ import annotations

from rlds_writer.interop.plugin import Exporter, Importer, Option

FORMATS = (
    Importer(
        "lerobot",
        f"{__name__}.importer:convert",
        "LeRobot v3.0 datasets",
        "a LeRobot dataset directory",
        extra="lerobot",
        order=40,
    ),
    Exporter(
        "lerobot",
        f"{__name__}.exporter:export",
        "LeRobot v3.0 datasets",
        "a new directory for LeRobotDataset(repo_id, root=DEST)",
        extra="lerobot",
        order=50,
        options=(
            Option("fps", "frames per second (default metadata or 10)", type=int),
            Option("task", "the task text of every frame (default: env id or name)"),
            Option(
                "task_field",
                "a Text step or episode field holding the task (e.g. language_instruction)",
            ),
            Option("robot_type", "LeRobot's robot_type (default none)"),
            Option(
                "video",
                "RGB cameras as MP4 videos (lossy; needs PyAV) instead of PNG images",
                action="store_true",
            ),
        ),
    ),
)
