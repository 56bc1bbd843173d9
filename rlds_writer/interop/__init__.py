"""interop: datasets in other formats, in and out.

Converters from other offline-RL formats to RLDS datasets.

Each source format has a module with `convert(src, dest, **options)` returning
a `ConversionReport`; `convert(source_format, src, dest, ...)` dispatches on
the format name used by `rlds-writer convert --from`:

* `minari`: Minari datasets (`rlds_writer.interop.minari`);
* `d4rl-hdf5`: D4RL-style flat HDF5 files (`rlds_writer.interop.d4rl`);
* `rllib-episodes`: RLlib's offline episode output
  (`rlds_writer.interop.rllib_episodes`);
* `lerobot`: LeRobot v3.0 dataset directories (`rlds_writer.interop.lerobot`);
* `npz-dir`, `hdf5-episodes`: one episode per `.npz` file (or directory of
  `.npy` files) or per HDF5 group, with a field mapping
  (`rlds_writer.interop.array_episodes`).

All of them write through `rlds_writer.DatasetWriter`; see
`rlds_writer.interop.episodes` for the common RLDS alignment.

Exporters the other way (RLDS to Minari, RLlib offline input, Hugging Face,
LeRobot) live in
`rlds_writer.interop.export` (`export(src, dest, to=...)`) and one
`export_<format>` module per target.

May import: `rlds_writer.errors`, `store`, `record`, `read`. Never `maintain`
or `cli`.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

FORMATS = {
    "minari": "rlds_writer.interop.minari",
    "d4rl-hdf5": "rlds_writer.interop.d4rl",
    "rllib-episodes": "rlds_writer.interop.rllib_episodes",
    "lerobot": "rlds_writer.interop.lerobot",
    # One module, two layouts: "module:function".
    "npz-dir": "rlds_writer.interop.array_episodes:convert_npz",
    "hdf5-episodes": "rlds_writer.interop.array_episodes:convert_hdf5",
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
    module, _, function = FORMATS[source_format].partition(":")
    return getattr(importlib.import_module(module), function or "convert")(src, dest, **options)


def _source_path(source_format: str, src: os.PathLike | str) -> str:
    """The path a source is read from (a local Minari id is its dataset directory)."""
    path = os.fspath(src)
    if source_format == "minari" and not os.path.exists(path):
        from rlds_writer.interop.staging import minari_root

        return os.fspath(minari_root() / path)
    return path
