"""Minari datasets, both ways: `importer.py` (`convert --from minari`), `exporter.py`
(`export --to minari`) and `staging.py` (the export built under a private Minari root)."""

from __future__ import annotations

from rlds_writer.interop.plugin import ACTION_SPACE, OBSERVATION_SPACE, Exporter, Importer, Option

FORMATS = (
    Importer(
        "minari",
        f"{__name__}.importer:convert",
        "Minari datasets",
        "a Minari dataset directory or local dataset id",
        extra="convert",
        order=10,
        source_path=f"{__name__}.staging:source_directory",
    ),
    Exporter(
        "minari",
        f"{__name__}.exporter:export",
        "Minari datasets",
        "a Minari dataset id (e.g. cartpole/random-v0), created in the local Minari root "
        "(MINARI_DATASETS_PATH); minari.load_dataset(DEST) opens it",
        extra="convert",
        order=10,
        staging=f"{__name__}.staging:export_staged",
        options=(
            Option(
                "env_id",
                "the registered Gymnasium env whose spec recover_environment() makes "
                "(module:Env-v0 imports module first; default: the dataset's env_id, if "
                "registered)",
            ),
            OBSERVATION_SPACE,
            ACTION_SPACE,
            Option(
                "data_format",
                "storage format (default hdf5)",
                choices=("hdf5", "arrow"),
            ),
            Option(
                "jpeg_encoding",
                "JPEG-encode image observations (lossy; default raw)",
                flag="--jpeg",
                action="store_true",
            ),
        ),
    ),
)
