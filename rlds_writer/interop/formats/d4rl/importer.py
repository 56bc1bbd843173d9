"""D4RL-style flat HDF5 files to RLDS.

A D4RL file holds one row per transition, all episodes concatenated:
`observations[N, ...]`, `actions[N, ...]`, `rewards[N]`, `terminals[N]`,
optionally `timeouts[N]`, `next_observations[N, ...]`, `infos/<key>[N, ...]`,
any other `[N, ...]` dataset, and a `metadata` group (attributes and small
datasets: algorithm, policy, ...).

Episode boundary rules (each one tested):

* row `i` is the transition `(o_i, a_i, r_i)`; an episode ends *at* row `i`
  when `terminals[i]` or `timeouts[i]` is set (both set: terminated, since a
  termination is what happened in the env). The next row starts a new episode.
* `terminals[i]` gives `is_terminal=True`; a timeout gives an episode that is
  `is_last` but not terminal (truncated).
* rows after the last flagged row form a trailing partial episode (the data
  was cut mid-episode). By default it is kept as a truncated episode; with
  `drop_partial=True` it is dropped (D4RL's own `sequence_dataset` drops it).
  Either way the report says so.
* next observations: with `next_observations`, an episode of `T` rows becomes
  `T + 1` RLDS steps; the final step holds `next_observations[last]` and zero
  action/reward (rlds_writer's own layout). Without it, the observation after
  the last row is not stored (`observations[i + 1]` is the next episode's
  reset observation), so the episode becomes `T` RLDS steps, one per row, and
  the final step keeps its real action and reward: the layout of TFDS's
  `d4rl_*` RLDS catalog datasets. Inside an episode `observations[i + 1]` is
  the next observation of row `i` in both cases.
* discount is `1 - terminals[i]`.
* `infos/<key>` and other per-row datasets become step metadata
  (`infos/<key>`, `<name>`) of the step of their row; with
  `next_observations` the extra final step gets zeros.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SourceError
from rlds_writer.interop import hdf5_source
from rlds_writer.interop.episodes import ConversionReport, SourceEpisode, write_episodes
from rlds_writer.interop.source_limits import Budget, source_errors
from rlds_writer.store.dataset.json_values import jsonable

_CORE = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
# Metadata arrays larger than this are described (dtype, shape) instead of copied.
_MAX_METADATA_ELEMENTS = 4096
_EXPECTED = "a D4RL-style .hdf5 file"


def episode_bounds(
    terminals: np.ndarray, timeouts: np.ndarray | None, drop_partial: bool = False
) -> list[tuple[int, int, bool]]:
    """Splits rows into episodes.

    Args:
      terminals: bool per row.
      timeouts: bool per row, or None.
      drop_partial: drop the rows after the last flagged row.

    Returns:
      `(start, stop, terminated)` per episode: rows `start..stop-1`.
    """
    terminals = np.asarray(terminals).astype(bool).reshape(-1)
    ends = terminals.copy()
    if timeouts is not None:
        ends |= np.asarray(timeouts).astype(bool).reshape(-1)
    bounds = []
    start = 0
    for stop in np.flatnonzero(ends) + 1:
        bounds.append((start, int(stop), bool(terminals[stop - 1])))
        start = int(stop)
    if start < len(terminals) and not drop_partial:
        bounds.append((start, len(terminals), False))
    return bounds


def _metadata(f: Any, path: str, budget: Budget) -> dict[str, Any]:
    import h5py

    out: dict[str, Any] = {"format": "d4rl-hdf5"}
    for key, value in hdf5_source.attributes(f, path):
        out[key] = jsonable(value)
    group = f.get("metadata")
    if isinstance(group, h5py.Group):
        for key, value in hdf5_source.attributes(group, path):
            out[f"metadata/{key}"] = jsonable(value)
        for key, ds in hdf5_source.walk(group, path).datasets.items():
            key = f"metadata/{key}"
            if (ds.size or 0) <= _MAX_METADATA_ELEMENTS:
                hdf5_source.take(budget, ds, key)
                out[key] = jsonable(hdf5_source.read_all(ds, key, path))
            else:
                shape = list(ds.shape or ())
                out[key] = {"dtype": ds.dtype.name, "shape": shape, "copied": False}
    return out


def _nest(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        parts = key.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _rows(ds: Any) -> int | None:
    shape = ds.shape or ()
    return int(shape[0]) if shape else None


def _check_lengths(columns: dict[str, Any], n: int, path: os.PathLike | str) -> None:
    for key, ds in columns.items():
        if _rows(ds) != n:
            rows = _rows(ds)
            raise SourceError(
                f"{path}: {key} has {'no rows (a scalar)' if rows is None else f'{rows} rows'}, "
                f"rewards has {n}; every dataset of a D4RL file has one row per transition"
            )


def read_episodes(
    path: os.PathLike | str,
    drop_partial: bool = False,
    notes: list[str] | None = None,
    max_inflation: float | None = None,
    select: Sequence[int] | None = None,
) -> Iterator[SourceEpisode]:
    """Yields the episodes of a D4RL-style HDF5 file (see the module doc).

    Args:
      path: the `.hdf5` file.
      drop_partial: drop a trailing partial episode instead of keeping it as truncated.
      notes: if given, remarks about the file are appended to it.
      max_inflation: the datasets read may declare at most this many times the
        file's size (`source_limits`; default 100).
      select: only the episodes of these indices (in file order; a Beam work
        item reads some), default all.

    Raises:
      SourceError: if a required dataset is missing, lengths differ, the file
        links to other files or declares more data than it can hold.
    """
    path = os.fspath(path)
    with hdf5_source.open_file(path, _EXPECTED) as f, source_errors(path):
        core, per_row, skipped, n = _columns(f, path, max_inflation)
        terminals = hdf5_source.read_all(core["terminals"], "terminals", path)
        timeouts = (
            hdf5_source.read_all(core["timeouts"], "timeouts", path) if "timeouts" in core else None
        )
        bounds = episode_bounds(terminals, timeouts, drop_partial)
        if notes is not None:
            notes.extend(
                _notes(terminals, n, timeouts, skipped, drop_partial, "next_observations" in core)
            )
        has_next = "next_observations" in core
        selected = None if select is None else set(select)
        for index, (start, stop, terminated) in enumerate(bounds):
            if selected is not None and index not in selected:
                continue
            rows = slice(start, stop)
            obs = core["observations"][rows]
            if has_next:
                obs = np.concatenate([obs, core["next_observations"][stop - 1 : stop]], axis=0)
            yield SourceEpisode(
                observations=obs,
                actions=core["actions"][rows],
                rewards=core["rewards"][rows],
                terminated=terminated,
                discounts=(1.0 - np.asarray(terminals[rows]).astype(np.float32)).astype(np.float32),
                # One value per row, i.e. per transition: with next_observations
                # the extra final step gets zeros.
                transition_metadata=_nest({k: ds[rows] for k, ds in per_row.items()}),
                episode_metadata={"episode_index": np.int64(index), "first_row": np.int64(start)},
            )


def count_episodes(
    path: os.PathLike | str, drop_partial: bool = False, max_inflation: float | None = None
) -> int:
    """The number of episodes `read_episodes` yields (reads the flag columns only)."""
    path = os.fspath(path)
    with hdf5_source.open_file(path, _EXPECTED) as f, source_errors(path):
        core, _, _, _ = _columns(f, path, max_inflation)
        terminals = hdf5_source.read_all(core["terminals"], "terminals", path)
        timeouts = (
            hdf5_source.read_all(core["timeouts"], "timeouts", path) if "timeouts" in core else None
        )
        return len(episode_bounds(terminals, timeouts, drop_partial))


def _columns(
    f: Any, path: str, max_inflation: float | None
) -> tuple[dict[str, Any], dict[str, Any], list[str], int]:
    """The core and per-row datasets of an open D4RL file, checked against the budget."""
    flat = hdf5_source.walk(f, path).datasets
    missing = [k for k in ("observations", "actions", "rewards", "terminals") if k not in flat]
    if missing:
        raise SourceError(
            f"{path}: not a D4RL file, missing datasets {missing} (found {sorted(flat)[:8]})"
        )
    n = _rows(flat["rewards"])
    if n is None:
        raise SourceError(f"{path}: rewards is a scalar; expected one row per transition")
    per_row = {
        k: ds
        for k, ds in flat.items()
        if not k.startswith("metadata/") and _rows(ds) == n and k not in _CORE
    }
    skipped = sorted(
        k for k in flat if k not in per_row and k not in _CORE and not k.startswith("metadata/")
    )
    core = {k: flat[k] for k in _CORE if k in flat}
    _check_lengths(core, n, path)
    budget = Budget(path, max_inflation)
    for key, ds in {**core, **per_row}.items():
        hdf5_source.take(budget, ds, key)
    return core, per_row, skipped, n


def _notes(
    terminals: np.ndarray,
    n: int,
    timeouts: np.ndarray | None,
    skipped: list[str],
    drop_partial: bool,
    has_next: bool,
) -> list[str]:
    """Remarks about how a file was read, for the report."""
    notes = []
    if timeouts is None:
        notes.append("no 'timeouts' dataset: episodes end at terminals only")
    ends = np.asarray(terminals).astype(bool).reshape(-1)
    if timeouts is not None:
        ends |= np.asarray(timeouts).astype(bool).reshape(-1)
    flagged = np.flatnonzero(ends)
    tail = n - (int(flagged[-1]) + 1 if flagged.size else 0)
    if tail:
        action = "dropped" if drop_partial else "kept as a truncated episode"
        notes.append(f"trailing partial episode of {tail} rows (no terminal/timeout): {action}")
    if not has_next:
        notes.append(
            "no 'next_observations': the observation after an episode's last row is not "
            "stored; the final step holds the last row's observation, action and reward"
        )
    if skipped:
        notes.append(f"skipped datasets that are not one row per transition: {skipped}")
    return notes


def convert(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    name: str | None = None,
    drop_partial: bool = False,
    max_inflation: float | None = None,
    **write_kwargs: Any,
) -> ConversionReport:
    """Converts a D4RL-style HDF5 file into an RLDS dataset.

    The file must hold its data itself: external links, external storage and
    virtual datasets are refused (`hdf5_source`).

    Args:
      src: the `.hdf5` file.
      dest: the dataset directory to write.
      name: the dataset name (default: the file name without suffix).
      drop_partial: drop a trailing partial episode (default: keep as truncated).
      max_inflation: the datasets may declare at most this many times the
        file's size (default 100; raise it for a genuine, very compressible file).
      **write_kwargs: `episodes.write_episodes` options (mode, file_format,
        `image_encoding="png" | "jpeg" | "bytes"` (default png: images become
        `tfds.features.Image`s), `jpeg_quality`, ...).

    Returns:
      The conversion report.

    Raises:
      SourceError: for a file that is not a self-contained D4RL file.
    """
    src = os.fspath(src)
    notes: list[str] = []
    with hdf5_source.open_file(src, _EXPECTED) as f, source_errors(src):
        metadata = _metadata(f, src, Budget(src, max_inflation))
    # Collect the notes once, by opening the first episode.
    first = read_episodes(src, drop_partial=drop_partial, notes=notes, max_inflation=max_inflation)
    next(first, None)
    first.close()
    stem = os.path.splitext(os.path.basename(src))[0]
    report = write_episodes(
        lambda: read_episodes(src, drop_partial=drop_partial, max_inflation=max_inflation),
        dest,
        name=name or _dataset_name(stem),
        source=src,
        metadata=metadata,
        **write_kwargs,
    )
    report.notes.extend(notes)
    return report


def _dataset_name(stem: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in stem.lower()).strip("_")
    return out or "d4rl_dataset"
