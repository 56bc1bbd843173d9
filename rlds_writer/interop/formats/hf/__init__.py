"""Hugging Face `datasets` directories, out: `exporter.py` (`export --to hf`)."""

from __future__ import annotations

from rlds_writer.interop.plugin import EPISODES_PER_FILE, Exporter

FORMATS = (
    Exporter(
        "hf",
        f"{__name__}.exporter:export",
        "Hugging Face datasets",
        "a new directory for datasets.load_dataset(DEST)",
        extra="hf",
        order=30,
        options=(EPISODES_PER_FILE,),
    ),
)
