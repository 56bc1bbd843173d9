"""Episodes stored as arrays, one episode per file or group, to RLDS.

Two layouts people have on disk:

* `npz-dir`: a directory whose `*.npz` files (or subdirectories of `*.npy`
  files, one per key) each hold one episode, read in name order;
* `hdf5-episodes`: an HDF5 file with one group per episode under a parent
  group (default `data`, as robomimic writes: `data/demo_0/obs/agentview_image`,
  `data/demo_0/actions`, ...), read in natural name order (`demo_2` before
  `demo_10`).

A mapping says which key (a path inside the episode, `/` for HDF5 groups)
holds which RLDS field; `--map FIELD=KEY` on the command line, `mapping=` in
Python. Fields:

* `observation` (the whole observation), or `observation/<name>` for one
  entry of a dict observation (several such entries make the dict);
* `action`, `reward`, `discount`;
* `terminated`, `truncated`: a flag per row or one scalar; the episode is
  terminated when the last value is true;
* `step/<name>`: step metadata with a row per observation;
* `episode/<name>`: episode metadata (a scalar or a small array).

Without a mapping, the usual names are looked up: observation from
`observations`, `observation`, `obs`; action from `actions`, `action`;
reward from `rewards`, `reward`; terminated from `terminals`, `terminated`,
`dones`; truncated from `timeouts`, `truncated`. Row rules are RLDS's:
observations have one row more than actions (the final observation) or as
many (then the last action and reward are kept, as TFDS's D4RL catalog does).
Every mapped key must exist in every episode; a missing one is an error
naming the episode and the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import SourceError
from rlds_writer.interop import hdf5_source
from rlds_writer.interop.episodes import ConversionReport, SourceEpisode, write_episodes
from rlds_writer.interop.npy_source import NpzFile, load_npy
from rlds_writer.interop.source_limits import Budget, check_max_inflation, source_errors

DEFAULT_KEYS = {
    "observation": ("observations", "observation", "obs"),
    "action": ("actions", "action"),
    "reward": ("rewards", "reward"),
    "terminated": ("terminals", "terminated", "dones"),
    "truncated": ("timeouts", "truncated"),
}
_FIELDS = ("observation", "action", "reward", "discount", "terminated", "truncated")
Getter = Callable[[str], Any]  # key path -> array, or None if absent
_HDF5_EXPECTED = "an HDF5 file with one group per episode"


def parse_mapping(items: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """`["observation/image=obs/pixels", ...]` (or a dict) -> `{field: key}`, checked."""
    if items is None:
        return {}
    pairs = items.items() if isinstance(items, Mapping) else [_split(i) for i in items]
    out = {}
    for field, key in pairs:
        top = field.split("/", 1)[0]
        nested_ok = top in ("observation", "step", "episode")
        if field not in _FIELDS and not (nested_ok and "/" in field):
            raise ValueError(
                f"--map {field}={key}: unknown field {field!r}; use one of {list(_FIELDS)}, "
                "observation/<name>, step/<name> or episode/<name>"
            )
        out[field] = key
    return out


def _split(item: str) -> tuple[str, str]:
    field, sep, key = item.partition("=")
    if not sep or not field or not key:
        raise ValueError(f"--map {item!r}: expected FIELD=KEY, e.g. observation=obs/pixels")
    return field.strip(), key.strip()


def _pick(get: Getter, mapping: dict[str, str], field: str, where: str) -> Any:
    if field in mapping:
        value = get(mapping[field])
        if value is None:
            raise SourceError(f"{where}: no key {mapping[field]!r} (mapped to {field})")
        return np.asarray(value)
    for key in DEFAULT_KEYS.get(field, ()):
        value = get(key)
        if value is not None:
            return np.asarray(value)
    return None


def source_episode(get: Getter, mapping: dict[str, str], where: str) -> SourceEpisode:
    """One episode from its arrays, by the mapping (see the module doc)."""
    parts = {
        f[len("observation/") :]: k for f, k in mapping.items() if f.startswith("observation/")
    }
    if parts:
        observations: Any = {}
        for name, key in parts.items():
            value = get(key)
            if value is None:
                raise SourceError(f"{where}: no key {key!r} (mapped to observation/{name})")
            observations[name] = np.asarray(value)
    else:
        observations = _pick(get, mapping, "observation", where)
        if observations is None:
            raise SourceError(
                f"{where}: no observations; name them with --map observation=KEY "
                f"(looked for {list(DEFAULT_KEYS['observation'])})"
            )
    actions = _pick(get, mapping, "action", where)
    rewards = _pick(get, mapping, "reward", where)
    if actions is None or rewards is None:
        missing = "action" if actions is None else "reward"
        raise SourceError(
            f"{where}: no {missing}s; name them with --map {missing}=KEY "
            f"(looked for {list(DEFAULT_KEYS[missing])})"
        )
    flags = {f: _pick(get, mapping, f, where) for f in ("terminated", "truncated")}
    terminated = flags["terminated"] is not None and bool(np.ravel(flags["terminated"])[-1:].any())
    discounts = _pick(get, mapping, "discount", where)
    step_metadata = {}
    episode_metadata = {}
    for field, key in mapping.items():
        top, _, name = field.partition("/")
        if top in ("step", "episode"):
            value = get(key)
            if value is None:
                raise SourceError(f"{where}: no key {key!r} (mapped to {field})")
            (step_metadata if top == "step" else episode_metadata)[name] = np.asarray(value)
    return SourceEpisode(
        observations=observations,
        actions=actions,
        rewards=rewards.astype(np.float32) if rewards.dtype == np.float64 else rewards,
        terminated=terminated,
        discounts=discounts,
        step_metadata=step_metadata,
        episode_metadata=episode_metadata,
    )


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def npz_entries(src: str) -> list[str]:
    """The episode entries of an `npz-dir` source: `.npz` files and `.npy` directories, in order."""
    names = sorted(os.listdir(src), key=_natural)
    entries = [n for n in names if n.endswith(".npz") or os.path.isdir(os.path.join(src, n))]
    if not entries:
        raise SourceError(f"{src}: no .npz files or episode subdirectories of .npy files")
    return entries


def read_npz_entry(
    src: str, name: str, mapping: dict[str, str], max_inflation: float | None
) -> SourceEpisode:
    """One episode of an `npz-dir` source: the entry `name` (from `npz_entries`)."""
    path = os.path.join(src, name)
    if os.path.islink(path):
        raise SourceError(f"{path}: a symbolic link; episodes must be files in {src}")
    if name.endswith(".npz"):
        # Members are read when the mapping asks for them, headers checked first.
        with NpzFile(path, max_inflation) as data:
            return source_episode(data.get, mapping, path)
    arrays = {}
    for f in sorted(os.listdir(path)):
        file = os.path.join(path, f)
        if f.endswith(".npy"):
            if os.path.islink(file) or not os.path.isfile(file):
                raise SourceError(f"{file}: not a regular file; episodes must be files")
            arrays[f[: -len(".npy")]] = load_npy(file)
    return source_episode(arrays.get, mapping, path)


def _npz_episodes(
    src: str, mapping: dict[str, str], max_inflation: float | None
) -> Iterator[SourceEpisode]:
    for name in npz_entries(src):
        yield read_npz_entry(src, name, mapping, max_inflation)


def hdf5_episode_names(src: str, group: str = "data") -> list[str]:
    """The episode groups of an `hdf5-episodes` source, in the order they are read."""
    import h5py

    with hdf5_source.open_file(src, _HDF5_EXPECTED) as f, source_errors(src):
        return _group_names(f, src, group, h5py)


def _group_names(f: Any, src: str, group: str, h5py: Any) -> list[str]:
    parent = f.get(group)
    if not isinstance(parent, h5py.Group):
        raise SourceError(f"{src}: no group {group!r}; pass --episodes-group with the parent")
    names = sorted((n for n in parent if isinstance(parent.get(n), h5py.Group)), key=_natural)
    if not names:
        raise SourceError(f"{src}: group {group!r} holds no episode groups")
    return names


def _hdf5_episodes(
    src: str, mapping: dict[str, str], group: str, max_inflation: float | None
) -> Iterator[SourceEpisode]:
    return read_hdf5_episodes(src, mapping, group, max_inflation)


def read_hdf5_episodes(
    src: str,
    mapping: dict[str, str],
    group: str = "data",
    max_inflation: float | None = None,
    names: Sequence[str] | None = None,
) -> Iterator[SourceEpisode]:
    """The episodes of an `hdf5-episodes` source; only the groups `names` if given.

    The arrays read may declare at most `max_inflation` times the file's size
    per call (a Beam work item reading some groups has a budget of its own).
    """
    import h5py

    with hdf5_source.open_file(src, _HDF5_EXPECTED) as f, source_errors(src):
        if names is None:
            names = _group_names(f, src, group, h5py)
        parent = f[group]
        budget = Budget(src, max_inflation)
        for name in names:
            episode = parent[name]
            where = f"{src}:{group}/{name}"
            cache: dict[str, Any] = {}

            def get(key: str, episode: Any = episode, cache: dict = cache, name: str = name) -> Any:
                if key not in cache:
                    ds = hdf5_source.dataset(episode, key, src)
                    if ds is None:
                        cache[key] = None
                    else:
                        field = f"{group}/{name}/{key}"
                        hdf5_source.take(budget, ds, field)
                        cache[key] = hdf5_source.read_all(ds, field, src)
                return cache[key]

            yield source_episode(get, mapping, where)


def convert(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    layout: str = "npz-dir",
    mapping: Sequence[str] | Mapping[str, str] | None = None,
    episodes_group: str = "data",
    name: str | None = None,
    max_inflation: float | None = None,
    **write_kwargs: Any,
) -> ConversionReport:
    """Converts episodes stored as arrays into an RLDS dataset.

    Args:
      src: a directory (`npz-dir`) or an HDF5 file (`hdf5-episodes`).
      dest: the dataset directory to write.
      layout: `npz-dir` or `hdf5-episodes`.
      mapping: `FIELD=KEY` strings or a `{field: key}` dict (module doc).
      episodes_group: `hdf5-episodes`: the group whose child groups are episodes.
      name: the dataset name (default: from the source's name).
      max_inflation: the arrays read from one file may declare at most this
        many times its size (default 100; `source_limits`): forged `.npy`
        headers, deflate bombs and unallocated HDF5 datasets are refused.
      **write_kwargs: `episodes.write_episodes` options (mode, file_format, ...).

    Returns:
      The conversion report.
    """
    src = os.fspath(src)
    fields = parse_mapping(mapping)
    check_max_inflation(max_inflation)
    if layout == "npz-dir":
        if not os.path.isdir(src):
            raise SourceError(f"{src}: expected a directory of .npz episodes")

        def make() -> Iterator[SourceEpisode]:
            return _npz_episodes(src, fields, max_inflation)

    elif layout == "hdf5-episodes":
        if not os.path.isfile(src):
            raise SourceError(f"{src}: expected {_HDF5_EXPECTED}")

        def make() -> Iterator[SourceEpisode]:
            return read_hdf5_episodes(src, fields, episodes_group, max_inflation)

    else:
        raise ValueError(f"layout must be 'npz-dir' or 'hdf5-episodes', got {layout!r}")
    stem = os.path.splitext(os.path.basename(src.rstrip("/")))[0]
    default = "".join(c if c.isalnum() else "_" for c in stem.lower()).strip("_") or "episodes"
    return write_episodes(
        make,
        dest,
        name=name or default,
        source=src,
        metadata={"source_layout": layout, "mapping": fields},
        **write_kwargs,
    )


def convert_npz(src: os.PathLike | str, dest: os.PathLike | str, **options: Any) -> Any:
    """`convert(..., layout="npz-dir")` (the `npz-dir` entry of `rlds-writer convert`)."""
    return convert(src, dest, layout="npz-dir", **options)


def convert_hdf5(src: os.PathLike | str, dest: os.PathLike | str, **options: Any) -> Any:
    """`convert(..., layout="hdf5-episodes")` (the `hdf5-episodes` entry)."""
    return convert(src, dest, layout="hdf5-episodes", **options)
