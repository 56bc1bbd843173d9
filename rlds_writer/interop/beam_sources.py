"""How each `convert` source format splits into Beam work items (`beam_convert`).

A `Splitter` lists a source's units on the driver (episode files, groups,
ids or row ranges, in the order the format's own reader reads them) and
reads some of them on a worker, through the format's public reader. A
format runs on Beam once it has an entry in `SPLITTERS`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlds_writer.interop import episodes as ep


@dataclasses.dataclass(frozen=True)
class Splitter:
    """How a source format splits into work items.

    Attributes:
      units: `(src, options) -> [unit, ...]`, run on the driver: the source's
        episode files, groups or ids, in the order the format reads them.
      read: `(src, units, options) -> episodes`, run on workers: the
        `SourceEpisode`s of some units, in order.
      per_item: units per work item.
    """

    units: Callable[[str, Mapping[str, Any]], list[Any]]
    read: Callable[[str, Sequence[Any], Mapping[str, Any]], Iterator[ep.SourceEpisode]]
    per_item: int = 1


def _npz_units(src: str, options: Mapping[str, Any]) -> list[str]:
    from rlds_writer.interop.formats.arrays import importer as array_episodes

    return array_episodes.npz_entries(src)


def _npz_read(
    src: str, units: Sequence[str], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop.formats.arrays import importer as array_episodes

    mapping = array_episodes.parse_mapping(options.get("mapping"))
    for name in units:
        yield array_episodes.read_npz_entry(src, name, mapping, options.get("max_inflation"))


def _hdf5_units(src: str, options: Mapping[str, Any]) -> list[str]:
    from rlds_writer.interop.formats.arrays import importer as array_episodes

    return array_episodes.hdf5_episode_names(src, options.get("episodes_group") or "data")


def _hdf5_read(
    src: str, units: Sequence[str], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop.formats.arrays import importer as array_episodes

    yield from array_episodes.read_hdf5_episodes(
        src,
        array_episodes.parse_mapping(options.get("mapping")),
        options.get("episodes_group") or "data",
        options.get("max_inflation"),
        names=list(units),
    )


def _rllib_units(src: str, options: Mapping[str, Any]) -> list[str]:
    from rlds_writer.interop.formats.rllib import importer as rllib_episodes

    return [os.fspath(f) for f in rllib_episodes.parquet_files(src)]


def _rllib_read(
    src: str, units: Sequence[str], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop.formats.rllib import importer as rllib_episodes

    for file in units:
        yield from rllib_episodes.read_episodes(file)


def _d4rl_units(src: str, options: Mapping[str, Any]) -> list[int]:
    from rlds_writer.interop.formats.d4rl import importer as d4rl

    count = d4rl.count_episodes(
        src, options.get("drop_partial", False), options.get("max_inflation")
    )
    return list(range(count))


def _d4rl_read(
    src: str, units: Sequence[int], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop.formats.d4rl import importer as d4rl

    yield from d4rl.read_episodes(
        src,
        options.get("drop_partial", False),
        max_inflation=options.get("max_inflation"),
        select=units,
    )


def _lerobot_units(src: str, options: Mapping[str, Any]) -> list[list[str]]:
    """Data files, those that share an episode grouped (LeRobot itself never splits one)."""
    from rlds_writer.interop.formats.lerobot import importer as lerobot

    units: list[list[str]] = []
    last = None
    for name in lerobot.data_files(src):
        first, end = _first_and_last_episode(Path(src) / "data" / name)
        if units and first is not None and first == last:
            units[-1].append(name)
        else:
            units.append([name])
        last = end if end is not None else last
    return units


def _first_and_last_episode(file: Path) -> tuple[int | None, int | None]:
    """The `episode_index` of a data file's first and last frame (two row groups read)."""
    import pyarrow.parquet as pq

    from rlds_writer.interop.source_limits import check_parquet, source_errors

    check_parquet(file)
    with source_errors(file):
        parquet = pq.ParquetFile(file)
        if "episode_index" not in parquet.schema_arrow.names:
            return None, None  # the worker refuses it, naming it
        groups = [
            g
            for g in range(parquet.metadata.num_row_groups)
            if parquet.metadata.row_group(g).num_rows
        ]
        if not groups:
            return None, None
        head = parquet.read_row_group(groups[0], columns=["episode_index"]).column(0)
        tail = parquet.read_row_group(groups[-1], columns=["episode_index"]).column(0)
        return head[0].as_py(), tail[len(tail) - 1].as_py()


def _lerobot_read(
    src: str, units: Sequence[list[str]], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop.formats.lerobot import importer as lerobot

    yield from lerobot.read_episodes(src, files=[f for unit in units for f in unit])


def _minari_units(src: str, options: Mapping[str, Any]) -> list[int]:
    from rlds_writer.interop.formats.minari import importer as minari

    return minari.episode_indices(src)


def _minari_read(
    src: str, units: Sequence[int], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop.formats.minari import importer as minari

    yield from minari.read_episodes(src, indices=list(units))


SPLITTERS = {
    "npz-dir": Splitter(_npz_units, _npz_read),
    "hdf5-episodes": Splitter(_hdf5_units, _hdf5_read),
    "rllib-episodes": Splitter(_rllib_units, _rllib_read),
    # Episodes of one HDF5 file: a few per item pays for opening the dataset.
    "minari": Splitter(_minari_units, _minari_read, per_item=16),
    # Row ranges of one flat table: each work item reads the flag columns
    # (a byte a row) to find its episodes, and only their rows of the rest.
    "d4rl-hdf5": Splitter(_d4rl_units, _d4rl_read, per_item=64),
    # A data file each (files that continue an episode of the previous one together).
    "lerobot": Splitter(_lerobot_units, _lerobot_read),
}


def read_src(source_format: str, src: os.PathLike | str) -> str:
    """The path workers read: a local Minari id becomes its dataset directory."""
    if source_format == "minari":
        from rlds_writer.interop.formats.minari import importer as minari

        return os.fspath(minari.resolve_data_path(src).resolve())
    return os.fspath(Path(os.fspath(src)).resolve())
