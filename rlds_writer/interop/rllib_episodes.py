"""RLlib offline episode output to RLDS.

What RLlib writes (new API stack, checked against Ray 2.60): with
`config.offline_data(output=DIR)` and the default `output_write_episodes=True`
(which requires `batch_mode="complete_episodes"`), each EnvRunner writes, per
`sample()` call, Parquet files under `DIR/<env name>/run-<worker>-<n>/` with
one column `item`: one row per episode, the bytes of
`msgpack.packb(SingleAgentEpisode.get_state(), default=msgpack_numpy.encode)`.
The state holds the episode's observations (`T + 1`), actions, rewards,
infos (`T + 1`), `extra_model_outputs` (`T` each: action logits, log-probs,
...), `is_terminated`, `is_truncated`, `id_`, `t_started`, the spaces and
`custom_data`.

Episodes are decoded with RLlib's own `SingleAgentEpisode.from_state` and read
one at a time. Mapping:

* observations -> `steps/observation` (final step: the last observation);
  actions, rewards -> `steps/action`, `steps/reward` (zeros on the final step);
* `is_terminated` -> `is_terminal` on the final step and discount 0 on the
  last transition; a truncated or unfinished episode ends `is_terminal=False`;
* infos -> step metadata `steps/info/<key>` (row `t` is the info returned with
  observation `t`; a key missing from a row gets zeros);
* extra model outputs -> `steps/extra_model_outputs/<key>`, aligned with the
  action they belong to (zeros on the final step);
* `id_`, `agent_id`, `module_id`, `t_started`, start/last step times and
  `custom_data` (as JSON text) -> episode metadata;
* the observation and action spaces -> `metadata.json`.

The column format (`output_write_episodes=False`) and multi-agent episodes
are not supported (a clear `NotImplementedError`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import counted
from rlds_writer.interop.episodes import ConversionReport, SourceEpisode, write_episodes
from rlds_writer.store.layout import jsonable


def parquet_files(src: os.PathLike | str) -> list[Path]:
    """Returns the Parquet files of an RLlib output directory (or one file), sorted.

    Raises:
      FileNotFoundError: if there are none.
    """
    path = Path(os.fspath(src))
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{src}: no RLlib output (no .parquet files)")
    return files


def _decode_state(item: bytes) -> dict[str, Any]:
    import msgpack
    import msgpack_numpy

    return msgpack.unpackb(item, object_hook=msgpack_numpy.decode, strict_map_key=False)


def iter_states(src: os.PathLike | str) -> Iterator[dict[str, Any]]:
    """Yields the episode states stored under `src`, one at a time.

    Raises:
      NotImplementedError: for RLlib's column format or multi-agent episodes.
    """
    import pyarrow.parquet as pq

    for file in parquet_files(src):
        parquet = pq.ParquetFile(file)
        names = parquet.schema_arrow.names
        if "item" not in names:
            raise NotImplementedError(
                f"{file}: columns {names[:8]} look like RLlib's column format "
                "(output_write_episodes=False); only episode output "
                "(output_write_episodes=True, RLlib's default) is supported"
            )
        for batch in parquet.iter_batches(columns=["item"], batch_size=16):
            for item in batch.column(0).to_pylist():
                state = _decode_state(item)
                if "agent_episodes" in state or "observations" not in state:
                    raise NotImplementedError(
                        f"{file}: multi-agent episodes are not supported (state keys "
                        f"{sorted(state)[:8]})"
                    )
                yield state


def _stack_rows(rows: list[Any], path: str) -> Any:
    """Stacks per-row values (dicts, numbers, strings, arrays) into a nest of columns."""
    present = [r for r in rows if r is not None]
    if not present:
        return None
    if any(isinstance(r, Mapping) for r in present):
        keys: list[str] = []
        for r in present:
            if isinstance(r, Mapping):
                keys.extend(k for k in r if k not in keys)
        out = {}
        for key in keys:
            column = _stack_rows(
                [r.get(key) if isinstance(r, Mapping) else None for r in rows], f"{path}/{key}"
            )
            if column is not None:
                out[str(key)] = column
        return out or None
    if all(isinstance(r, str | bytes) for r in present):
        return [r if r is not None else "" for r in rows]
    first = np.asarray(present[0])
    zero = np.zeros_like(first)
    try:
        return np.stack([zero if r is None else np.asarray(r, dtype=first.dtype) for r in rows])
    except ValueError as e:
        raise ValueError(f"{path}: values of different shapes across steps ({e})") from None


def _import_episode_class() -> Any:
    # RLlib's try_import_tf() calls tf.compat.v1.disable_v2_behavior() when it
    # is the first to import TensorFlow, which turns off eager execution for the
    # whole process (and breaks tfds.as_numpy afterwards). Importing TensorFlow
    # first keeps TF2 behaviour.
    import tensorflow  # noqa: F401
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return SingleAgentEpisode


def _episode(state: dict[str, Any]) -> SourceEpisode:
    SingleAgentEpisode = _import_episode_class()  # noqa: N806

    episode = SingleAgentEpisode.from_state(state)
    observations = _tree_stack(episode.get_observations())
    actions = _tree_stack(episode.get_actions())
    rewards = np.asarray(episode.get_rewards())
    infos = list(episode.get_infos())
    info = _stack_rows([i if i else None for i in infos], "steps/info")
    extra = {}
    for key in episode.extra_model_outputs:
        extra[str(key)] = _tree_stack(episode.get_extra_model_outputs(key))
    metadata: dict[str, Any] = {
        "episode_id": str(episode.id_),
        "agent_id": "" if episode.agent_id is None else str(episode.agent_id),
        "module_id": "" if episode.module_id is None else str(episode.module_id),
        "t_started": np.int64(episode.t_started),
        "is_truncated": np.bool_(episode.is_truncated),
        "custom_data": json.dumps(_jsonable(state.get("custom_data") or {}), sort_keys=True),
    }
    for key in ("_start_time", "_last_step_time"):
        if state.get(key) is not None:
            metadata[key.strip("_")] = np.float64(state[key])
    return SourceEpisode(
        observations=observations,
        actions=actions,
        rewards=rewards,
        terminated=bool(episode.is_terminated),
        step_metadata={"info": info} if info else {},
        transition_metadata={"extra_model_outputs": extra} if extra else {},
        episode_metadata=metadata,
    )


def _tree_stack(values: Any) -> Any:
    """RLlib returns lists of nests or already batched nests; returns a nest of arrays."""
    if isinstance(values, Mapping):
        return {str(k): _tree_stack(v) for k, v in values.items()}
    if isinstance(values, tuple):
        return {str(i): _tree_stack(v) for i, v in enumerate(values)}
    if isinstance(values, list) and values and isinstance(values[0], Mapping | tuple):
        keys = values[0].keys() if isinstance(values[0], Mapping) else range(len(values[0]))
        return {str(k): _tree_stack([v[k] for v in values]) for k in keys}
    return np.asarray(values)


def _jsonable(value: Any) -> Any:
    return jsonable(value)


def read_episodes(src: os.PathLike | str) -> Iterator[SourceEpisode]:
    """Yields the episodes of an RLlib output directory (see the module doc)."""
    for state in iter_states(src):
        yield _episode(state)


def convert(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    name: str | None = None,
    **write_kwargs: Any,
) -> ConversionReport:
    """Converts RLlib's offline episode output into an RLDS dataset.

    Args:
      src: the directory given to `config.offline_data(output=...)` (searched
        recursively for Parquet files), or one Parquet file.
      dest: the dataset directory to write.
      name: the dataset name (default: from the env's subdirectory name).
      **write_kwargs: `episodes.write_episodes` options (mode, file_format,
        `image_encoding="png" | "jpeg" | "bytes"` (default png: images become
        `tfds.features.Image`s), `jpeg_quality`, ...).

    Returns:
      The conversion report.
    """
    files = parquet_files(src)
    first = next(iter_states(src), None)
    metadata: dict[str, Any] = {"format": "rllib-episodes", "parquet_files": len(files)}
    if first is not None:
        metadata["observation_space"] = _jsonable(first.get("_observation_space"))
        metadata["action_space"] = _jsonable(first.get("_action_space"))
    env_dir = files[0].parent.parent.name if len(files[0].parents) > 1 else "rllib"
    safe = "".join(c if c.isalnum() else "_" for c in env_dir.lower()).strip("_")
    report = write_episodes(
        lambda: read_episodes(src),
        dest,
        name=name or f"rllib_{safe or 'episodes'}",
        source=os.fspath(src),
        metadata=metadata,
        **write_kwargs,
    )
    unfinished = report.truncated
    if unfinished:
        were = "was" if unfinished == 1 else "were"
        report.notes.append(f"{counted(unfinished, 'episode')} {were} truncated or unfinished")
    return report
