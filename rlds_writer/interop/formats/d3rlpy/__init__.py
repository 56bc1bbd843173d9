"""d3rlpy's dataset files, out: `exporter.py` (`export --to d3rlpy`)."""

from __future__ import annotations

from rlds_writer.interop.plugin import Exporter, Option

FORMATS = (
    Exporter(
        "d3rlpy",
        f"{__name__}.exporter:export",
        "d3rlpy dataset files",
        "a new HDF5 file for d3rlpy.dataset.ReplayBuffer.load(DEST, "
        "d3rlpy.dataset.InfiniteBuffer())",
        extra="convert",
        order=40,
        writes="file",
        options=(
            Option(
                "compression",
                "compress the HDF5 arrays (default none, as d3rlpy writes)",
                choices=("gzip", "lzf"),
            ),
            Option(
                "channels_first",
                "store image observations (C, H, W), as d3rlpy's pixel encoder takes them",
                action="store_true",
            ),
        ),
    ),
)
