"""D4RL-style flat HDF5 files, in: `importer.py` (`convert --from d4rl-hdf5`)."""

from __future__ import annotations

from rlds_writer.interop.plugin import MAX_INFLATION, Importer, Option

FORMATS = (
    Importer(
        "d4rl-hdf5",
        f"{__name__}.importer:convert",
        "D4RL-style HDF5 files",
        "an .hdf5 file",
        extra="convert",
        order=20,
        options=(
            Option(
                "drop_partial",
                "drop a trailing episode with no terminal/timeout (default: keep it as truncated)",
                action="store_true",
            ),
            MAX_INFLATION,
        ),
    ),
)
