"""interop: datasets in other formats, in and out, one plugin per format.

Each format is a subpackage of `rlds_writer.interop.formats` holding its
importer (`convert`: another format to an RLDS dataset) and/or its exporter
(`export`: an RLDS dataset to another format) and declaring both, with their
options, in its `__init__` (`plugin.Importer`, `plugin.Exporter`,
`plugin.Option`). `registry` collects them: `FORMATS` (the sources of
`convert(source_format, ...)` and `rlds-writer convert --from`) and
`EXPORT_FORMATS` (the targets of `export(..., to=...)` and `rlds-writer
export --to`). `register` adds a format from outside the package.

Built in: `minari` (both ways), `d4rl-hdf5` (in), `rllib-episodes` (both
ways), `lerobot` (both ways), `npz-dir` and `hdf5-episodes` (in, package
`arrays`), `hf` and `d3rlpy` (out).

What the formats share stays here: `episodes` (source episodes → RLDS
alignment → `DatasetWriter`) with `source_schema` (their merged schema),
`export` (the export dispatch, the streaming source, the report), `staging`
(complete-or-absent exports), `export_spaces` and `space_text` (spaces as
data), and the untrusted-source readers `source_limits`, `hdf5_source` and
`npy_source`. `package_sources` is what the TFDS builders of `builders/` run;
`beam_convert` (with `beam_sources`, `beam_steps`) runs `convert` as an
Apache Beam pipeline.

May import: `rlds_writer.errors`, `store`, `record`, `read`. Never `maintain`
or `cli`.
"""

from __future__ import annotations

import os
from typing import Any

from rlds_writer._exports import lazy_exports
from rlds_writer.interop.plugin import Exporter, Importer, Option
from rlds_writer.interop.registry import EXPORT_FORMATS, FORMATS, register, unregister

__all__ = [
    "EXPORT_FORMATS",
    "FORMATS",
    "Exporter",
    "Importer",
    "Option",
    "convert",
    "register",
    "unregister",
]


def convert(
    source_format: str, src: os.PathLike | str, dest: os.PathLike | str, **options: Any
) -> Any:
    """Converts a dataset of another format into an RLDS dataset in TFDS format.

    Args:
      source_format: one of `FORMATS` (`minari`, `d4rl-hdf5`, `rllib-episodes`,
        `lerobot`, `npz-dir`, `hdf5-episodes`).
      src: the source dataset (path; for Minari also a local dataset id).
      dest: the dataset directory to write.
      **options: options of the format's `convert` and of
        `episodes.write_episodes` (name, mode, file_format, split,
        max_episodes_per_file, version, progress, drop_partial for D4RL).

    Returns:
      The `ConversionReport`.

    Raises:
      ValueError: for an unknown format.
      MissingDependencyError: the format's optional libraries are not installed
        (the message names the extra to install).
      UnsafePathError: for a destination that is, is inside or contains the
        source (nothing is written).
    """
    if source_format not in FORMATS:
        raise ValueError(
            f"unknown source format {source_format!r}; expected one of {list(FORMATS)}"
        )
    # Before anything is written: a destination over the source would destroy it.
    from rlds_writer.store.dataset import names

    source = FORMATS[source_format]
    names.check_disjoint(source.resolve_source(os.fspath(src)), dest)
    return source.run(src, dest, **options)


# `export` (the module: the function is `rlds_writer.export`) with the exporters
# by name, `export.export_minari`, ...
lazy_exports(
    globals(),
    {
        "ExportReport": ("rlds_writer.interop.export", "ExportReport"),
        "to_d3rlpy": ("rlds_writer.interop.formats.d3rlpy.exporter", "to_d3rlpy"),
    },
    submodules=("export",),
    defined=tuple(__all__),
)
