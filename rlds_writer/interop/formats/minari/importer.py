"""Minari datasets to RLDS.

Minari (the Farama Foundation's offline-RL dataset format) stores a dataset as
a directory `<dataset id>/data/` with `metadata.json` and, in its HDF5 layout,
`main_data.hdf5` holding one group `episode_<i>` per episode with
`observations` (`T + 1` rows: the reset observation and one per step),
`actions`, `rewards`, `terminations`, `truncations` (`T` rows each), an
`infos` group (`T + 1` rows: the reset info and one per step), dict and tuple
spaces as nested groups (`_index_<i>` for tuples), image spaces optionally
JPEG-encoded, and episode attributes (`id`, `seed`, `options/...`,
`total_steps`).

The episodes are read with Minari's own `MinariDataset` (so its JPEG decoding
and both of its storage formats, `hdf5` and `arrow`, work), one at a time.

Mapping:

* observations -> `steps/observation` (dicts stay dicts; tuple elements become
  keys `"0"`, `"1"`, ...); the final step holds the last observation;
* actions, rewards -> `steps/action`, `steps/reward` (zeros on the final step);
* `terminations[-1]` -> `is_terminal` on the final step and discount 0 on the
  last transition; an episode whose last step is truncated (or neither, for a
  dataset cut mid-episode) ends with `is_terminal=False`;
* infos -> step metadata `steps/info/<key>` (row `t` is the info that came
  with observation `t`);
* episode attributes -> episode metadata (`minari_id`, `seed`, `options`, and
  whatever Minari's episode metadata callback stored, e.g. `rewards_sum`);
* the dataset's Minari metadata (env spec, algorithm, author, ...) ->
  `metadata.json` under `minari`. The env spec is kept as the JSON text Minari
  stored: data, shown and never made (`rlds-writer export` takes only its id,
  and makes nothing).

A dataset whose `metadata.json` lacks its spaces is refused: Minari would
learn them by making the env its env spec names, which runs code the dataset
chooses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import SourceError
from rlds_writer.interop.episodes import ConversionReport, SourceEpisode, write_episodes
from rlds_writer.store.dataset.json_values import jsonable


def resolve_data_path(src: os.PathLike | str) -> Path:
    """Finds a Minari dataset's `data` directory.

    Args:
      src: the `data` directory, the dataset directory above it, the
        `main_data.hdf5` file, or a dataset id in the local Minari root
        (`MINARI_DATASETS_PATH`, default `~/.minari/datasets`).

    Raises:
      FileNotFoundError: if no Minari dataset is found there.
    """
    path = Path(os.fspath(src))
    candidates = [path, path / "data", path.parent]
    if not path.exists():
        from minari.storage import get_dataset_path

        candidates.insert(0, Path(get_dataset_path(os.fspath(src))) / "data")
    for candidate in candidates:
        if candidate.is_dir() and (candidate / "metadata.json").exists():
            return candidate
    raise FileNotFoundError(
        f"{src}: no Minari dataset (a 'data' directory with metadata.json) found"
    )


def _open(data_path: Path) -> Any:
    """Minari's `MinariDataset`, once `metadata.json` is known to hold the spaces.

    Without them Minari calls `gym.make` on the env spec the file names (an
    entry point such as `os:system` would run): such a dataset is refused.
    """
    import json

    import minari

    path = data_path / "metadata.json"
    try:
        metadata = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: not a readable Minari metadata file ({e})") from None
    if not isinstance(metadata, dict):
        raise SourceError(f"{path}: expected a JSON object, got {type(metadata).__name__}")
    missing = [
        f"{name}_space"
        for name in ("observation", "action")
        if not isinstance(metadata.get(f"{name}_space"), str)
    ]
    if missing:
        raise SourceError(
            f"{path}: no {' and no '.join(missing)}; Minari would make the env its env_spec "
            "names to learn them, which runs code the dataset chooses: add the spaces "
            "(minari.serialization.serialize_space) to metadata.json"
        )
    return minari.MinariDataset(data_path)


def _tuples_to_dicts(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _tuples_to_dicts(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {str(i): _tuples_to_dicts(v) for i, v in enumerate(value)}
    if isinstance(value, list):
        return list(value)
    return np.asarray(value)


def _attribute(value: Any) -> Any:
    """An episode attribute as a nest of arrays (dicts such as `options` stay dicts)."""
    if isinstance(value, Mapping):
        return {str(k): _attribute(v) for k, v in value.items()}
    value = jsonable(value)
    return value if isinstance(value, str) else np.asarray(value)


def episode_indices(src: os.PathLike | str) -> list[int]:
    """The episode ids of a Minari dataset, in the order `read_episodes` reads them."""
    return [int(i) for i in _open(resolve_data_path(src)).episode_indices]


def read_episodes(
    src: os.PathLike | str, indices: Sequence[int] | None = None
) -> Iterator[SourceEpisode]:
    """Yields the episodes of a Minari dataset (see the module doc).

    Args:
      src: anything `resolve_data_path` accepts.
      indices: only these episode ids (from `episode_indices`), in this order;
        default all (a Beam work item reads a range of them).
    """
    dataset = _open(resolve_data_path(src))
    if indices is None:
        indices = [int(i) for i in dataset.episode_indices]
    indices = [int(i) for i in indices]
    # Both are generators that read one episode at a time.
    episodes = dataset.storage.get_episodes(indices)
    metadatas = dataset.storage.get_episode_metadata(indices)
    for index, episode, metadata in zip(indices, episodes, metadatas):
        # Every episode attribute is kept (seed, options, Minari's reward statistics, ...).
        episode_metadata: dict[str, Any] = {"minari_id": np.int64(index)}
        for key, value in metadata.items():
            if key != "id" and value is not None:
                episode_metadata[str(key)] = _attribute(value)
        terminations = np.asarray(episode["terminations"]).astype(bool)
        infos = episode.get("infos") or {}
        yield SourceEpisode(
            observations=_tuples_to_dicts(episode["observations"]),
            actions=_tuples_to_dicts(episode["actions"]),
            rewards=np.asarray(episode["rewards"]),
            terminated=bool(terminations[-1]) if terminations.size else False,
            step_metadata={"info": _tuples_to_dicts(infos)} if infos else {},
            episode_metadata=episode_metadata,
        )


def convert(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    name: str | None = None,
    **write_kwargs: Any,
) -> ConversionReport:
    """Converts a Minari dataset into an RLDS dataset.

    Args:
      src: the Minari dataset (path or local id, see `resolve_data_path`).
      dest: the dataset directory to write.
      name: the dataset name (default: from the Minari dataset id).
      **write_kwargs: `episodes.write_episodes` options (mode, file_format,
        `image_encoding="png" | "jpeg" | "bytes"` (default png: images become
        `tfds.features.Image`s), `jpeg_quality`, ...).

    Returns:
      The conversion report.
    """
    data_path = resolve_data_path(src)
    dataset = _open(data_path)
    minari_metadata = jsonable(dict(dataset.storage.metadata))
    dataset_id = str(minari_metadata.get("dataset_id") or data_path.parent.name)
    safe = "".join(c if c.isalnum() else "_" for c in dataset_id.lower()).strip("_")
    config_kwargs = {}
    if minari_metadata.get("description"):
        config_kwargs["overall_description"] = str(minari_metadata["description"])
    if minari_metadata.get("code_permalink"):
        config_kwargs["homepage"] = str(minari_metadata["code_permalink"])
    return write_episodes(
        lambda: read_episodes(data_path),
        dest,
        name=name or safe or "minari_dataset",
        source=os.fspath(src),
        metadata={"format": "minari", "minari": minari_metadata},
        config_kwargs={**config_kwargs, **write_kwargs.pop("config_kwargs", {})},
        **write_kwargs,
    )
