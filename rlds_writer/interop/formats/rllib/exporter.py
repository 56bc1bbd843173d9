"""RLDS to RLlib's offline input (new API stack, `config.offline_data(input_=DEST)`).

Two Parquet layouts, both as RLlib's own `OfflineSingleAgentEnvRunner`
writes them (checked against Ray 2.60):

* `layout="episodes"` (default; read with `input_read_episodes=True`): one
  column `item`, one row per episode holding
  `msgpack.packb(SingleAgentEpisode.get_state(), default=msgpack_numpy.encode)`,
  what RLlib writes with `output_write_episodes=True`. Whole episodes, with
  infos and extra model outputs: `rlds-writer convert --from rllib-episodes`
  reads them back.
* `layout="columns"` (RLlib's default input, `input_read_episodes=False`):
  one row per transition with `eps_id`, `obs`, `actions`, `rewards`,
  `new_obs`, `terminateds`, `truncateds` and one column per extra model
  output. Array observations and actions only.

Mapping of an RLDS episode of `n` steps (`T = n - 1` transitions):

* observations: all `n` (the final step's is the last one); actions and
  rewards of steps `0..T-1`;
* rewards: one number per step; a one-element reward (RWRL's `(1,)`) is that
  number, a larger one is refused by name;
* `is_terminated` is the final step's `is_terminal`; otherwise the episode is
  `is_truncated` (time limits, and episodes the recorder cut short when kept:
  RLlib's episode input requires finished episodes);
* infos (`n` dicts, episodes layout): the keys of `steps/info` and every
  other step field except `extra_model_outputs`; `steps/extra_model_outputs/*`
  (as `rlds-writer convert --from rllib-episodes` and `RLDSRecorder` store
  them) become the episode's extra model outputs;
* episode id: the `episode_id` field if the dataset has one, else
  `<dataset name>-<index>`, the index being the episode's position in the
  exported split of the source (skipped episodes counted, so it names the
  same episode as `qlearning_dataset`'s `episode_ids` and the `hf` export);
  `agent_id`, `module_id`, `t_started` likewise;
  every other episode field goes to `custom_data["rlds"]` (episodes layout);
* spaces: given ones, else the ones the dataset recorded (as text), else
  built from the features, as for Minari (`export_spaces`); no env is made.

Files are written to `DEST/` as `episodes-00000.parquet`, ... (at most
`episodes_per_file` episodes each), flushed every few MB, so memory stays
bounded by about one episode plus one row group.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError
from rlds_writer.interop.export import (
    ExportReport,
    check_cut_short,
    check_one_reward,
    episode_metadata,
    info_columns,
    needs_libraries,
    new_output_directory,
    num_steps,
    numbered_episodes,
    open_source,
    step_rewards,
    text,
)
from rlds_writer.interop.export_spaces import export_spaces
from rlds_writer.read.nest import map_tree, rows
from rlds_writer.store.dataset.json_values import jsonable

LAYOUTS = ("episodes", "columns")
_FLUSH_BYTES = 8 << 20
_RLLIB_FIELDS = ("episode_id", "agent_id", "module_id", "t_started")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout must be one of {LAYOUTS}, got {layout!r}: 'episodes' for "
            "input_read_episodes=True, 'columns' for RLlib's default column input"
        )


def _head(tree: Any, t: int) -> Any:
    return map_tree(lambda a: a[:t], tree) if isinstance(tree, Mapping) else tree[:t]


def _per_step(tree: Any, n: int) -> list[Any]:
    """A column (or dict of columns) as a list of `n` per-step values."""
    if isinstance(tree, Mapping):
        return rows(tree) if tree else [{} for _ in range(n)]
    return list(tree)


def _plain(value: Any) -> Any:
    """Text as str, dicts recursively; numpy values stay numpy (msgpack-numpy packs them)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return text(value)


def _episode(
    episode: Mapping[str, Any],
    end: str,
    index: int,
    name: str,
    observation_space: Any,
    action_space: Any,
) -> Any:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    steps = dict(episode["steps"])
    if "action" not in steps:
        raise SpecError("steps/action: the dataset has no actions; RLlib needs them")
    n = num_steps(episode)
    t = n - 1
    extra = steps.pop("extra_model_outputs", None)
    if extra is not None and not isinstance(extra, Mapping):
        steps["extra_model_outputs"] = extra  # not RLlib's dict: keep it as an info
        extra = None
    terminated = end == "terminated"
    infos = _per_step(info_columns(steps, n, terminated), n)
    reward = steps.get("reward")
    metadata = {k: _plain(v) for k, v in episode_metadata(episode).items()}
    episode_id = metadata.pop("episode_id", None) or f"{name}-{index}"
    agent_id = metadata.pop("agent_id", None) or None
    module_id = metadata.pop("module_id", None) or None
    t_started = int(np.asarray(metadata.pop("t_started", 0)))
    result = SingleAgentEpisode(
        id_=str(episode_id),
        observations=_per_step(steps["observation"], n),
        observation_space=observation_space,
        infos=[_plain(i) for i in infos],
        actions=_per_step(_head(steps["action"], t), t),
        action_space=action_space,
        rewards=[float(r) for r in step_rewards(reward, t)],
        terminated=terminated,
        truncated=not terminated,
        extra_model_outputs={str(k): list(_head(v, t)) for k, v in (extra or {}).items()},
        t_started=t_started,
        len_lookback_buffer=0,
        agent_id=agent_id,
        module_id=module_id,
    )
    if metadata:
        result.custom_data["rlds"] = jsonable(metadata)
    return result


def _column_rows(episode: Any) -> list[dict[str, Any]]:
    """RLlib's column layout: one row per transition (as `_map_episodes_to_data`)."""
    out = []
    observations = episode.get_observations()
    last = len(episode) - 1
    for i in range(len(episode)):
        row = {
            "eps_id": episode.id_,
            "obs": observations[i],
            "actions": episode.get_actions(i),
            "rewards": episode.get_rewards(i),
            "new_obs": observations[i + 1],
            "terminateds": episode.is_terminated if i == last else False,
            "truncateds": episode.is_truncated if i == last else False,
        }
        for key in episode.extra_model_outputs:
            row[key] = episode.get_extra_model_outputs(key, i)
        out.append(row)
    return out


class _ParquetFiles:
    """Writes rows to `episodes-<k>.parquet` files, a row group every few MB."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files: list[Path] = []
        self._writer: Any = None
        self._rows_in_file = 0
        self._pending: list[dict[str, Any]] = []
        self._pending_bytes = 0

    def add(self, rows_: list[dict[str, Any]], size: int) -> None:
        self._pending.extend(rows_)
        self._pending_bytes += size
        if self._pending_bytes >= _FLUSH_BYTES:
            self.flush()

    def new_file(self) -> None:
        """Starts a new file with the next rows."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_pylist(self._pending)
        if self._writer is None:
            path = self.directory / f"episodes-{len(self.files):05d}.parquet"
            self.files.append(path)
            self._writer = pq.ParquetWriter(path, table.schema)
        self._writer.write_table(table)
        self._pending, self._pending_bytes = [], 0

    def close(self) -> None:
        self.new_file()

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _column_value(value: Any, where: str) -> Any:
    if isinstance(value, Mapping | tuple | list):
        raise SpecError(
            f"{where}: a dict observation or action cannot go in RLlib's column layout; "
            "use layout='episodes' (--layout episodes)"
        )
    arr = np.asarray(value)
    return arr.tolist() if arr.ndim else arr.item()


@needs_libraries("rllib-episodes")
def export(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    split: str = "train",
    cut_short: str = "truncated",
    layout: str = "episodes",
    observation_space: Any = None,
    action_space: Any = None,
    episodes_per_file: int = 1000,
    env_id: str | None = None,
    progress: bool = False,
) -> ExportReport:
    """Exports an RLDS dataset as RLlib offline input (see the module doc).

    Args:
      src: the RLDS dataset directory.
      dest: the directory to write (created; must not hold files).
      split: the split to export (TFDS split syntax).
      cut_short: "truncated" (default) exports episodes the recorder cut short
        as truncated; "drop" leaves them out.
      layout: "episodes" (read with `input_read_episodes=True`) or "columns".
      observation_space: the observation space (a `Space` or its text, e.g.
        `"Box(0, 255, (64, 64, 3), uint8)"`; default: the dataset's).
      action_space: the action space (e.g. `"Discrete(4)"`; default: the dataset's).
      episodes_per_file: episodes per Parquet file.
      env_id: deprecated and unused: the spaces come from the dataset (an env is
        never made to export it); pass `observation_space`/`action_space`.
      progress: show a tqdm progress bar.

    Returns:
      The `ExportReport`.

    Raises:
      FileExistsError: if `dest` holds files.
      ValueError: for an unknown split or layout, or spaces that do not fit the
        stored values.
    """
    from tqdm import tqdm

    if env_id is not None:
        warnings.warn(
            "export_rllib(env_id=...) is unused: the spaces come from the dataset; pass "
            "observation_space=/action_space= to choose them",
            DeprecationWarning,
            stacklevel=2,
        )
    check_cut_short(cut_short)
    _check_layout(layout)
    directory = new_output_directory(dest, episodes_per_file)
    reader = open_source(src, split)
    observation_space, action_space, notes = export_spaces(reader, observation_space, action_space)
    check_one_reward(reader, "RLlib")
    # RLlib's try_import_tf() disables TF2 behaviour when it is the first to import
    # TensorFlow; importing it first keeps eager execution for the caller.
    import tensorflow  # noqa: F401

    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    report = ExportReport(
        source=os.fspath(src), destination=os.fspath(dest), format="rllib-episodes"
    )
    report.notes.extend(notes)
    files = _ParquetFiles(directory)
    try:
        episodes = numbered_episodes(reader, split, report, cut_short=cut_short)
        for index, episode, end in tqdm(episodes, desc="export", unit="ep", disable=not progress):
            if report.episodes and report.episodes % episodes_per_file == 0:
                files.new_file()
            rllib_episode = _episode(
                episode, end, index, reader.name, observation_space, action_space
            )
            if layout == "episodes":
                import msgpack
                import msgpack_numpy

                item = msgpack.packb(rllib_episode.get_state(), default=msgpack_numpy.encode)
                files.add([{"item": item}], len(item))
            else:
                rows_ = _column_rows(rllib_episode)
                for row in rows_:
                    for key in ("obs", "new_obs", "actions"):
                        row[key] = _column_value(row[key], f"steps/{key}")
                files.add(rows_, sum(np.asarray(r["obs"]).nbytes * 2 for r in rows_))
            report.episodes += 1
            report.transitions += len(rllib_episode)
            if end == "terminated":
                report.terminated += 1
            else:
                report.truncated += 1
        files.close()
    except BaseException:
        # No half-written input for a training run to pick up.
        files.abort()
        for path in files.files:
            path.unlink(missing_ok=True)
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        reader.close()
    read = "input_read_episodes=True" if layout == "episodes" else "input_read_episodes=False"
    report.notes.append(
        f"{len(files.files)} Parquet files; train with "
        f"config.offline_data(input_=[{os.fspath(dest)!r}], {read})"
    )
    return report
