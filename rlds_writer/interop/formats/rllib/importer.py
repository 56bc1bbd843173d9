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

Episodes are read one at a time and decoded as data (`state.py`): msgpack
with an object hook that builds only numeric, bool and string arrays (no
pickle: msgpack-numpy unpickles object arrays, and a crafted file would run
code), and the state's buffers read directly, not through
`SingleAgentEpisode.from_state` (which loads the spaces with pickle allowed).
An item holding anything else is refused in one line naming the file, the
column and the row. Mapping:

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
* the observation and action spaces -> `metadata.json`, as their text
  (`str(space)`, as the Gymnasium recorders write them).

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

from rlds_writer.errors import SourceError, counted
from rlds_writer.interop.episodes import ConversionReport, SourceEpisode, write_episodes
from rlds_writer.interop.formats.rllib import state as rllib_state
from rlds_writer.store.dataset.json_values import jsonable


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


def iter_states(src: os.PathLike | str) -> Iterator[dict[str, Any]]:
    """Yields the episode states stored under `src`, one at a time, decoded as data.

    Raises:
      NotImplementedError: for RLlib's column format or multi-agent episodes.
      SourceError: for an item that is not a msgpack episode state of numeric,
        bool and string values (names the file, column and row).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    for file in parquet_files(src):
        try:
            parquet = pq.ParquetFile(file)
        except (pa.ArrowException, OSError) as e:
            raise SourceError(f"{file}: not a readable Parquet file ({e})"[:400]) from None
        names = parquet.schema_arrow.names
        if "item" not in names:
            raise NotImplementedError(
                f"{file}: columns {names[:8]} look like RLlib's column format "
                "(output_write_episodes=False); only episode output "
                "(output_write_episodes=True, RLlib's default) is supported"
            )
        row = 0
        for batch in parquet.iter_batches(columns=["item"], batch_size=16):
            for item in batch.column(0).to_pylist():
                where = f"{file}: column 'item', row {row}"
                try:
                    state = rllib_state.decode_item(item)
                except SourceError as e:
                    raise SourceError(f"{where}: {e}; refused") from None
                if not isinstance(state, dict):
                    raise SourceError(f"{where}: not an episode state ({type(state).__name__})")
                if "agent_episodes" in state or "observations" not in state:
                    raise NotImplementedError(
                        f"{file}: multi-agent episodes are not supported (state keys "
                        f"{sorted(map(str, state))[:8]})"
                    )
                state["_where"] = where
                row += 1
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
    try:
        first = np.asarray(present[0])
        if first.dtype.kind not in "biufcSU":
            raise SourceError(f"{path}: values of type {type(present[0]).__name__} are not data")
        zero = np.zeros_like(first)
        return np.stack([zero if r is None else np.asarray(r, dtype=first.dtype) for r in rows])
    except (ValueError, TypeError, OverflowError) as e:
        if isinstance(e, SourceError):
            raise
        raise SourceError(
            f"{path}: values of different types or shapes across steps ({e})"[:300]
        ) from None


def _episode(state: dict[str, Any]) -> SourceEpisode:
    where = state.get("_where", "episode")
    try:
        return _episode_of(state)
    except SourceError as e:
        raise SourceError(f"{where}: {e}") from None
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        problem = f"{type(e).__name__}: {e}"[:200]
        raise SourceError(f"{where}: not an RLlib episode state ({problem})") from None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _episode_of(state: dict[str, Any]) -> SourceEpisode:
    observations = rllib_state.buffer_values(state["observations"], "observations")
    actions = rllib_state.buffer_values(state["actions"], "actions")
    rewards = np.asarray(rllib_state.buffer_values(state["rewards"], "rewards"))
    infos = rllib_state.buffer_values(state["infos"], "infos", rows=True)
    t = rllib_state.length(actions)
    if rllib_state.length(observations) != t + 1 or len(rewards) != t or len(infos) != t + 1:
        raise SourceError(
            f"{rllib_state.length(observations)} observations, {t} actions, {len(rewards)} "
            f"rewards and {len(infos)} infos (an episode has one observation and info more)"
        )
    if rewards.dtype.kind not in "biuf":
        raise SourceError(f"rewards of dtype {rewards.dtype}")
    info = _stack_rows([i if i else None for i in infos], "steps/info")
    extra = {}
    outputs = state.get("extra_model_outputs") or {}
    if not isinstance(outputs, Mapping):
        raise SourceError("extra_model_outputs is not a dict")
    for key, buffer in outputs.items():
        extra[str(key)] = rllib_state.buffer_values(buffer, f"extra_model_outputs/{key}")
    t_started = state.get("t_started") or 0
    metadata: dict[str, Any] = {
        "episode_id": _text(state.get("id_")),
        "agent_id": _text(state.get("agent_id")),
        "module_id": _text(state.get("module_id")),
        "t_started": np.int64(t_started if isinstance(t_started, int | np.integer) else 0),
        "is_truncated": np.bool_(bool(state.get("is_truncated"))),
        "custom_data": json.dumps(_jsonable(state.get("custom_data") or {}), sort_keys=True),
    }
    for key in ("_start_time", "_last_step_time"):
        if isinstance(state.get(key), int | float | np.number):
            metadata[key.strip("_")] = np.float64(state[key])
    return SourceEpisode(
        observations=observations,
        actions=actions,
        rewards=rewards,
        terminated=bool(state.get("is_terminated")),
        step_metadata={"info": info} if info else {},
        transition_metadata={"extra_model_outputs": extra} if extra else {},
        episode_metadata=metadata,
    )


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
        for name in ("observation_space", "action_space"):
            try:
                text = rllib_state.space_text(first.get(f"_{name}"))
            except SourceError as e:
                raise SourceError(f"{first['_where']}, _{name}: {e}; refused") from None
            if text is not None:
                metadata[name] = text
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
