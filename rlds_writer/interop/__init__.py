"""interop: datasets in other formats, in and out.

In: each source format has a module with `convert(src, dest, **options)`
returning a `ConversionReport`; `convert(source_format, src, dest, ...)`
(also `rlds_writer.convert`) dispatches on the format name used by
`rlds-writer convert --from`:

* `minari`: Minari datasets (`rlds_writer.interop.minari`);
* `d4rl-hdf5`: D4RL-style flat HDF5 files (`rlds_writer.interop.d4rl`);
* `rllib-episodes`: RLlib's offline episode output
  (`rlds_writer.interop.rllib_episodes`);
* `lerobot`: LeRobot v3.0 dataset directories (`rlds_writer.interop.lerobot`);
* `npz-dir`, `hdf5-episodes`: one episode per `.npz` file (or directory of
  `.npy` files) or per HDF5 group, with a field mapping
  (`rlds_writer.interop.array_episodes`).

All of them write through `store.writer.DatasetWriter`; see
`rlds_writer.interop.episodes` for the common RLDS alignment.

Out: `export(src, dest, to=...)` in `rlds_writer.interop.export` (also
`rlds_writer.export`; that module has one function per format too,
`export_minari`, `export_rllib`, `export_hf`, `export_d3rlpy`,
`export_lerobot`, returning an `ExportReport`) writes Minari datasets,
RLlib offline input, Hugging Face datasets, d3rlpy dataset files
(`to_d3rlpy`, public here, gives a d3rlpy `ReplayBuffer` in memory) and
LeRobot v3.0 datasets, one `export_<format>` module per target.
`FORMATS` and `EXPORT_FORMATS` below list them all; the command line builds its
choices and help from them.

May import: `rlds_writer.errors`, `store`, `record`, `read`. Never `maintain`
or `cli`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any

from rlds_writer._exports import lazy_exports
from rlds_writer.errors import optional_dependencies


@dataclasses.dataclass(frozen=True)
class Format:
    """A format `convert` reads or `export` writes: its code and how to describe it.

    The command line builds its choices and help from these, so they cannot drift.

    Attributes:
      code: the module with its `convert`/`export`, or "module:function".
      title: what it is, in a user's words ("Minari datasets").
      path: what SRC (convert) or DEST (export) is for it.
      extra: the setup.py extra(s) that install its libraries ("rllib,convert"),
        or None if the core install has them.
    """

    code: str
    title: str
    path: str
    extra: str | None = None

    def run(self, feature: str, *args: Any, **options: Any) -> Any:
        """Calls the format's function with `args`, `options`.

        A missing optional library is a `MissingDependencyError` naming `feature`
        ("converting Minari datasets") and the extra to install.
        """
        module, _, function = self.code.partition(":")
        with optional_dependencies(feature, self.extra):
            return getattr(importlib.import_module(module), function)(*args, **options)


# The sources of `convert(source_format, ...)`.
FORMATS = {
    "minari": Format(
        "rlds_writer.interop.minari:convert",
        "Minari datasets",
        "a Minari dataset directory or local dataset id",
        "convert",
    ),
    "d4rl-hdf5": Format(
        "rlds_writer.interop.d4rl:convert", "D4RL-style HDF5 files", "an .hdf5 file", "convert"
    ),
    "rllib-episodes": Format(
        "rlds_writer.interop.rllib_episodes:convert",
        "RLlib offline episode output",
        "the directory given to RLlib's config.offline_data(output=...)",
        "rllib,convert",
    ),
    "lerobot": Format(
        "rlds_writer.interop.lerobot:convert",
        "LeRobot v3.0 datasets",
        "a LeRobot dataset directory",
        "lerobot",
    ),
    "npz-dir": Format(
        "rlds_writer.interop.array_episodes:convert_npz",
        "episodes as .npz files (or directories of .npy files)",
        "a directory of them, one per episode",
    ),
    "hdf5-episodes": Format(
        "rlds_writer.interop.array_episodes:convert_hdf5",
        "HDF5 files of episode groups",
        "an .hdf5 file with one group per episode",
        "convert",
    ),
}


# The targets of `export(src, dest, to=...)` (`rlds_writer.interop.export`).
EXPORT_FORMATS = {
    "minari": Format(
        "rlds_writer.interop.export_minari:export",
        "Minari datasets",
        "a Minari dataset id (e.g. cartpole/random-v0), created in the local Minari root "
        "(MINARI_DATASETS_PATH); minari.load_dataset(DEST) opens it",
        "convert",
    ),
    "rllib-episodes": Format(
        "rlds_writer.interop.export_rllib:export",
        "RLlib offline input",
        "a new directory for config.offline_data(input_=[DEST])",
        "rllib,convert",
    ),
    "hf": Format(
        "rlds_writer.interop.export_hf:export",
        "Hugging Face datasets",
        "a new directory for datasets.load_dataset(DEST)",
        "hf",
    ),
    "d3rlpy": Format(
        "rlds_writer.interop.export_d3rlpy:export",
        "d3rlpy dataset files",
        "a new HDF5 file for d3rlpy.dataset.ReplayBuffer.load(DEST, "
        "d3rlpy.dataset.InfiniteBuffer())",
        "convert",
    ),
    "lerobot": Format(
        "rlds_writer.interop.export_lerobot:export",
        "LeRobot v3.0 datasets",
        "a new directory for LeRobotDataset(repo_id, root=DEST)",
        "lerobot",
    ),
}


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
    from rlds_writer.store import names

    names.check_disjoint(_source_path(source_format, src), dest)
    source = FORMATS[source_format]
    return source.run(f"converting {source.title}", src, dest, **options)


def _source_path(source_format: str, src: os.PathLike | str) -> str:
    """The path a source is read from (a local Minari id is its dataset directory)."""
    path = os.fspath(src)
    if source_format == "minari" and not os.path.exists(path):
        from rlds_writer.interop.staging import minari_root

        return os.fspath(minari_root() / path)
    return path


# `export` (the module: the function is `rlds_writer.export`) with the exporters
# by name, `export.export_minari`, ...; the names `export_<format>` here are the
# formats' modules.
lazy_exports(
    globals(),
    {
        "ExportReport": ("rlds_writer.interop.export", "ExportReport"),
        "to_d3rlpy": ("rlds_writer.interop.export_d3rlpy", "to_d3rlpy"),
    },
    submodules=("export",),
    defined=("Format", "FORMATS", "EXPORT_FORMATS", "convert"),
)
