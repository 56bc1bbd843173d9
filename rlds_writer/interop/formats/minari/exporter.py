"""RLDS to a Minari dataset (`minari.load_dataset` opens the result).

Written through Minari's own `MinariStorage` (its HDF5 or Arrow layout), one
episode at a time. For an RLDS episode of `n` steps (`T = n - 1` transitions):

* `steps/observation` (all `n` rows, the final step included) ->
  `observations` (`T + 1` rows); dicts stay dicts (a `Dict` space);
* `steps/action`, `steps/reward` of steps `0..T-1` -> `actions`, `rewards`;
* `terminations[-1]` is the final step's `is_terminal`; `truncations[-1]` is
  set otherwise (time limits, and episodes the recorder cut short when kept);
* step metadata -> `infos` (`T + 1` rows, row `t` recorded with observation
  `t`): the keys of a `steps/info` dict, and every other step field under its
  own name; text becomes `str`;
* `discount` is not a Minari field: when it differs from rlds_writer's
  convention (1, and 0 after a termination) it goes to `infos["discount"]`;
* episode metadata -> episode attributes (`seed` and `options` as Minari's
  own, the rest, `end_reason` included, as extra attributes; nested dicts
  flattened with `/` as Minari does for `options`); a `minari_id` field (from
  `rlds-writer convert --from minari`) is replaced by the episode's index;
* the spaces (`export_spaces`): given ones, else those the dataset recorded
  (`metadata.json`'s `observation_space`/`action_space` text, checked against
  the features), else from the features (`Box`es and `Dict`s; an integer
  scalar action with no recorded space is a `Box`: pass
  `action_space="Discrete(N)"`);
* the env spec (so `recover_environment()` works): the spec registered in
  this process under the dataset's env id (`metadata.json`'s `env_id`, or the
  id of a Minari env spec); nothing the dataset names is imported or made.

Episodes of one RLDS step (no transition) cannot be stored by Minari and are
skipped (the report says how many).
"""

from __future__ import annotations

import os
import shutil
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
    num_steps,
    open_source,
    source_episodes,
    text,
)
from rlds_writer.interop.export_spaces import env_spec, export_spaces
from rlds_writer.interop.formats.minari.staging import minari_namespace
from rlds_writer.read.nest import map_tree
from rlds_writer.store.dataset.json_values import jsonable

_MINARI_METADATA = (
    "algorithm_name",
    "author",
    "author_email",
    "code_permalink",
    "description",
    "requirements",
    "ref_min_score",
    "ref_max_score",
    "num_episodes_average_score",
)


def _flatten(tree: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(_flatten(value, name))
        else:
            out[name] = _attribute(value)
    return out


def _attribute(value: Any) -> Any:
    value = text(value)
    if isinstance(value, np.generic):
        return value.item() if value.dtype.kind in "b" else value
    return value


def _rewards(reward: Any, t: int) -> np.ndarray:
    """Minari's `rewards`: `(t,)`, as its collector stores a Gymnasium reward; a
    one-element reward (RL Unplugged RWRL's `(1,)`) is that number, a vector stays."""
    if reward is None:
        return np.zeros(t, np.float32)
    reward = np.asarray(reward)[:t]
    return reward.reshape(t) if reward.ndim > 1 and reward[0].size == 1 else reward


def _buffer(
    episode: Mapping[str, Any], end: str, index: int, arrow: bool = False
) -> tuple[Any, dict[str, Any]]:
    from minari.data_collector import EpisodeBuffer

    steps = episode["steps"]
    n = num_steps(episode)
    t = n - 1
    terminated = end == "terminated"
    terminations = np.zeros(t, dtype=np.bool_)
    truncations = np.zeros(t, dtype=np.bool_)
    (terminations if terminated else truncations)[-1] = True

    def head(tree: Any) -> Any:
        return map_tree(lambda a: a[:t], tree) if isinstance(tree, Mapping) else tree[:t]

    if "action" not in steps:
        raise SpecError("steps/action: the dataset has no actions; Minari needs them")
    reward = steps.get("reward")
    metadata = episode_metadata(episode)
    seed = metadata.pop("seed", None)
    options = metadata.pop("options", None)
    metadata.pop("minari_id", None)
    metadata.pop("id", None)
    infos = info_columns(steps, n, terminated)
    if arrow:
        # Minari's Arrow storage records an empty shape for 1-D numpy info columns
        # and then fails to read them back; lists of scalars take its other path.
        infos = map_tree(lambda v: list(v) if np.ndim(v) == 1 else v, infos)
    buffer = EpisodeBuffer(
        id=index,
        seed=None if seed is None else int(np.asarray(seed)),
        options=map_tree(_attribute, options) if isinstance(options, Mapping) else None,
        observations=steps["observation"],
        actions=head(steps["action"]),
        rewards=_rewards(reward, t),
        terminations=terminations,
        truncations=truncations,
        infos=infos or None,
    )
    extra = _flatten(metadata, "")
    # The Arrow storage keeps episode attributes in JSON files.
    return buffer, {k: jsonable(v) for k, v in extra.items()} if arrow else extra


def _dataset_metadata(reader: Any, dataset_id: str, given: Mapping[str, Any]) -> dict[str, Any]:
    import minari

    source = (reader.metadata or {}).get("minari") or {}
    metadata: dict[str, Any] = {k: source[k] for k in _MINARI_METADATA if source.get(k) is not None}
    if "description" not in metadata and reader.info.get("description"):
        metadata["description"] = str(reader.info["description"])
    metadata.update({k: v for k, v in given.items() if v is not None})
    for key in ("author", "author_email"):
        if key in metadata:
            value = metadata[key]
            metadata[key] = {value} if isinstance(value, str) else set(value)
    metadata["dataset_id"] = dataset_id
    metadata["minari_version"] = minari.__version__
    return metadata


def _dataset_path(dataset_id: str) -> Path:
    from minari.storage import get_dataset_path

    minari_namespace(dataset_id)  # refuses an id Minari cannot parse
    path = Path(get_dataset_path(dataset_id))
    if path.exists():
        raise FileExistsError(
            f"{path}: Minari dataset {dataset_id!r} already exists; delete it "
            f"(`minari delete {dataset_id}`) or pick another id or version"
        )
    return path


@needs_libraries("minari")
def export(
    src: os.PathLike | str,
    dest: str,
    *,
    split: str = "train",
    cut_short: str = "truncated",
    env_id: str | None = None,
    observation_space: Any = None,
    action_space: Any = None,
    data_format: str = "hdf5",
    jpeg_encoding: bool = False,
    algorithm_name: str | None = None,
    author: str | None = None,
    author_email: str | None = None,
    code_permalink: str | None = None,
    description: str | None = None,
    progress: bool = False,
) -> ExportReport:
    """Exports an RLDS dataset as a Minari dataset (see the module doc for the mapping).

    Args:
      src: the RLDS dataset directory.
      dest: the Minari dataset id to create (e.g. `cartpole/random-v0`), in the
        local Minari root (`MINARI_DATASETS_PATH`, default `~/.minari/datasets`).
      split: the split to export (TFDS split syntax).
      cut_short: "truncated" (default) exports episodes the recorder cut short
        as truncated; "drop" leaves them out.
      env_id: the Gymnasium env id whose registered spec `recover_environment()`
        makes (default: the dataset's, if this process registered it);
        `module:Env-v0` imports `module` first.
      observation_space: the observation space (a `Space` or its text, e.g.
        `"Box(0, 255, (64, 64, 3), uint8)"`; default: the dataset's).
      action_space: the action space (e.g. `"Discrete(4)"`; default: the dataset's).
      data_format: Minari's storage, "hdf5" (default) or "arrow".
      jpeg_encoding: let Minari JPEG-encode image observations (lossy; the
        default keeps raw arrays).
      algorithm_name: Minari metadata (default: from a dataset converted from Minari).
      author: Minari metadata.
      author_email: Minari metadata.
      code_permalink: Minari metadata.
      description: Minari metadata (default: the dataset's description).
      progress: show a tqdm progress bar.

    Returns:
      The `ExportReport`.

    Raises:
      FileExistsError: if the Minari dataset exists.
      ValueError: for a malformed id, an unknown split or env id, or spaces that do
        not fit the stored values.
    """
    import minari
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.namespace import create_namespace, list_local_namespaces
    from minari.storage import get_dataset_path

    dest = os.fspath(dest)
    check_cut_short(cut_short)
    reader = open_source(src, split)
    path = _dataset_path(dest)
    spec, spec_notes = env_spec(reader, env_id)
    observation_space, action_space, space_notes = export_spaces(
        reader, observation_space, action_space
    )
    check_one_reward(reader, "Minari", scalar=False)
    metadata = _dataset_metadata(
        reader,
        dest,
        {
            "algorithm_name": algorithm_name,
            "author": author,
            "author_email": author_email,
            "code_permalink": code_permalink,
            "description": description,
        },
    )
    report = ExportReport(source=os.fspath(src), destination=dest, format="minari")
    report.notes.extend(spec_notes + space_notes)
    namespace = parse_dataset_id(dest)[0]
    if namespace is not None and namespace not in list_local_namespaces():
        create_namespace(namespace)
    (path / "data").mkdir(parents=True)
    try:
        _write(
            reader,
            split,
            cut_short,
            path,
            spec,
            observation_space,
            action_space,
            metadata,
            report,
            data_format=data_format,
            jpeg_encoding=jpeg_encoding,
            progress=progress,
        )
    except BaseException:
        # Leave no half-written dataset behind for minari.load_dataset to trip on.
        shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        reader.close()
    if not report.episodes:
        report.notes.append("no episode was exported")
    # Fail here, not in the user's code, if Minari cannot open what was written.
    minari.load_dataset(dest)
    report.notes.append(
        f"load it with minari.load_dataset({dest!r}) (Minari root {get_dataset_path()})"
    )
    return report


def _write(
    reader: Any,
    split: str,
    cut_short: str,
    path: Path,
    spec: Any,
    observation_space: Any,
    action_space: Any,
    metadata: dict[str, Any],
    report: ExportReport,
    *,
    data_format: str,
    jpeg_encoding: bool,
    progress: bool,
) -> None:
    from minari.dataset.minari_storage import MinariStorage
    from tqdm import tqdm

    storage = MinariStorage.new(
        path / "data",
        observation_space=observation_space,
        action_space=action_space,
        env_spec=spec,
        data_format=data_format,
        jpeg_encoding=jpeg_encoding,
    )
    storage.update_metadata(metadata)
    episodes = source_episodes(reader, split, report, cut_short=cut_short)
    for episode, end in tqdm(episodes, desc="export", unit="ep", disable=not progress):
        buffer, extra = _buffer(episode, end, report.episodes, data_format == "arrow")
        storage.update_episodes([buffer])
        if extra:
            storage.update_episode_metadata([extra], [report.episodes])
        report.episodes += 1
        report.transitions += len(buffer.rewards)
        if end == "terminated":
            report.terminated += 1
        else:
            report.truncated += 1
