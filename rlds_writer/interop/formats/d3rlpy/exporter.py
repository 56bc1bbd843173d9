"""RLDS to d3rlpy: its saved-dataset HDF5 file, or an in-memory `MDPDataset`.

`export` writes the file `d3rlpy.dataset.ReplayBuffer.dump` writes (d3rlpy
2.x, dataset format "2.1"), with h5py and without d3rlpy, one episode at a
time; in an environment with d3rlpy,
`ReplayBuffer.load(path, d3rlpy.dataset.InfiniteBuffer())` opens it.
`to_d3rlpy` builds the same episodes as a `d3rlpy.dataset.MDPDataset` in
memory, where d3rlpy and rlds_writer are installed together.

A d3rlpy episode holds `N` rows of observations, actions and rewards and one
`terminated` flag; its transitions are rows `0..N-1` (terminated, the last
one's next observation being zeros) or `0..N-2` (a timeout, row `N-1` only
giving the last next observation). For an RLDS episode of `n` steps
(`T = n - 1` transitions):

* terminated (final step's `is_terminal`): `N = T` rows, steps `0..T-1`,
  `terminated=True`; the final observation is not kept (d3rlpy uses zeros
  after a termination);
* truncated (time limit, and episodes the recorder cut short when kept):
  `N = n` rows, the final step included (its observation is the last next
  observation; its action and reward are RLDS's zeros and belong to no
  transition), `terminated=False`;
* so d3rlpy's transitions are exactly `qlearning_dataset()`'s, terminal and
  timeout flags included;
* scalar actions and rewards become columns of shape `(N, 1)`, as d3rlpy's
  `MDPDataset` stores them; integer actions are discrete ones (d3rlpy infers
  `action_size` as the largest action + 1), float vectors continuous ones;
* dict observations become d3rlpy tuple observations (one array per leaf, in
  the order of the file's `observation_keys` attribute and the report);
* image observations stay `(H, W, C)` unless `channels_first=True` stores
  them `(C, H, W)`, the layout d3rlpy's pixel encoder takes;
* text, varying shapes, dict or multi-discrete actions and vector rewards have
  no d3rlpy form and are refused with the field's name;
* discount, step and episode metadata have no place in d3rlpy's format and
  are left out (the report says which fields);
* episodes of one RLDS step (no transition) are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import MissingDependencyError, SpecError
from rlds_writer.interop.export import (
    ExportReport,
    check_cut_short,
    needs_libraries,
    open_source,
    source_episodes,
    step_metadata,
    value_at,
)

# d3rlpy.dataset.io.DATASET_VERSION and the columns `Episode.serialize` gives.
DATASET_VERSION = "2.1"
COLUMNS = ("observations", "actions", "rewards", "terminated")


@dataclasses.dataclass(frozen=True)
class _Layout:
    """What the features say about the d3rlpy arrays (checked before writing anything)."""

    observation_paths: tuple[tuple[str, ...], ...]  # () for one array
    action: Any
    reward: Any
    # Per observation array: move its channels first (an RLDS image, `channels_first`).
    transpose: tuple[bool, ...] = ()

    @property
    def tuple_observation(self) -> bool:
        return bool(self.observation_paths)


def _check_leaf(leaf: Any, fix: str) -> None:
    if leaf.dtype == np.object_:
        raise SpecError(f"{leaf.key}: {leaf.describe()} has no d3rlpy form (numbers only); {fix}")
    if not leaf.static:
        raise SpecError(
            f"{leaf.key}: {leaf.describe()} varies in shape, d3rlpy needs one shape; {fix}"
        )


def _layout(reader: Any, channels_first: bool = False) -> _Layout:
    leaves = reader.features.step_leaves
    observation = [leaf for leaf in leaves if leaf.path[1] == "observation"]
    if not observation:
        raise SpecError(f"{reader.path}: the dataset has no steps/observation; d3rlpy needs one")
    for leaf in observation:
        _check_leaf(leaf, "leave the field out of the observation or encode it as numbers")
    paths = tuple(leaf.path[2:] for leaf in observation if len(leaf.path) > 2)
    images = tuple(leaf.is_image and len(leaf.shape) == 3 for leaf in observation)
    if channels_first and not any(images):
        raise ValueError(
            f"{reader.path}: channels_first moves image channels first, and steps/observation "
            "has no image field; leave the option out"
        )
    action = [leaf for leaf in leaves if leaf.path[1] == "action"]
    if not action:
        raise SpecError(f"{reader.path}: the dataset has no steps/action; d3rlpy needs actions")
    if len(action) > 1 or len(action[0].path) > 2:
        raise SpecError(
            f"steps/action: a dict of {len(action)} fields ({', '.join(a.key for a in action)}); "
            "d3rlpy takes one action array: flatten the actions into one vector first"
        )
    action = action[0]
    _check_leaf(action, "d3rlpy takes a discrete index or a float vector")
    if action.dtype.kind in "iub" and action.size != 1:
        raise SpecError(
            f"steps/action: {action.describe()} integer vectors (MultiDiscrete) have no d3rlpy "
            "form; d3rlpy takes one discrete index per step or a float vector"
        )
    if len(action.shape) > 1 and action.dtype.kind == "f":
        raise SpecError(
            f"steps/action: {action.describe()}; d3rlpy takes a float vector: reshape the "
            "actions to one dimension first"
        )
    reward = [leaf for leaf in leaves if leaf.path[1] == "reward"]
    if reward and (len(reward) > 1 or len(reward[0].path) > 2 or reward[0].size != 1):
        raise SpecError(
            f"steps/reward: {reward[0].describe() if len(reward) == 1 else 'a dict'}; d3rlpy "
            "takes one scalar reward per step: sum or pick one reward first"
        )
    transpose = images if channels_first else ()
    return _Layout(paths, action, reward[0] if reward else None, transpose)


def _column(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).reshape(len(values), -1)


def episode_arrays(
    episode: Mapping[str, Any], end: str, layout: _Layout
) -> tuple[Any, np.ndarray, np.ndarray, bool]:
    """One RLDS episode as d3rlpy's episode arrays (see the module doc).

    Returns:
      `(observations, actions, rewards, terminated)`: observations an array (a
      list of arrays for a dict observation), actions `(N, k)`, rewards
      `(N, 1)` float32, and the terminated flag.
    """
    steps = episode["steps"]
    n = len(steps["is_last"])
    terminated = end == "terminated"
    rows = n - 1 if terminated else n
    if layout.tuple_observation:
        observations: Any = [
            np.asarray(value_at(steps["observation"], p))[:rows] for p in layout.observation_paths
        ]
    else:
        observations = np.asarray(steps["observation"])[:rows]
    if any(layout.transpose):
        # (N, H, W, C) -> (N, C, H, W): d3rlpy's pixel encoder takes channels first.
        arrays = observations if layout.tuple_observation else [observations]
        arrays = [
            np.ascontiguousarray(np.moveaxis(a, -1, 1)) if move else a
            for a, move in zip(arrays, layout.transpose)
        ]
        observations = arrays if layout.tuple_observation else arrays[0]
    actions = _column(steps["action"][:rows])
    if layout.action.dtype == np.bool_:
        actions = actions.astype(np.int64)
    reward = steps.get("reward")
    rewards = np.zeros((rows, 1), np.float32) if reward is None else _column(reward[:rows])
    if rewards.dtype.kind != "f":
        rewards = rewards.astype(np.float32)
    return observations, actions, rewards, terminated


def _note_left_out(reader: Any, layout: _Layout, report: ExportReport) -> None:
    leaves = reader.features.leaves
    steps = {leaf.path[1] for leaf in leaves if leaf.in_steps}
    extra = sorted(step_metadata(dict.fromkeys(steps)))
    if extra:
        report.notes.append(f"step fields left out (d3rlpy has no place for them): {extra}")
    if "discount" in steps:
        report.notes.append("discounts left out: d3rlpy applies its own gamma")
    episode_fields = sorted(leaf.path[0] for leaf in leaves if not leaf.in_steps)
    if episode_fields:
        report.notes.append(f"episode fields left out: {sorted(set(episode_fields))}")
    if layout.reward is None:
        report.notes.append("the dataset has no rewards: exported as zeros")
    images = [
        leaf.key
        for leaf in reader.features.step_leaves
        if leaf.path[1] == "observation" and leaf.is_image
    ]
    if images and not any(layout.transpose):
        report.notes.append(
            f"images {images} kept (H, W, C); d3rlpy's pixel encoder takes (C, H, W): pass "
            "channels_first=True (--channels-first) to train on them with its encoders"
        )
    if layout.tuple_observation:
        keys = ["/".join(p) for p in layout.observation_paths]
        report.notes.append(f"dict observations exported as d3rlpy tuple observations: {keys}")


def _count(report: ExportReport, actions: np.ndarray, terminated: bool) -> None:
    report.episodes += 1
    report.transitions += len(actions) if terminated else len(actions) - 1
    if terminated:
        report.terminated += 1
    else:
        report.truncated += 1


@needs_libraries("d3rlpy")
def export(
    src: os.PathLike | str,
    dest: os.PathLike | str,
    *,
    split: str = "train",
    cut_short: str = "truncated",
    compression: str | None = None,
    channels_first: bool = False,
    progress: bool = False,
) -> ExportReport:
    """Exports an RLDS dataset as a d3rlpy dataset file (see the module doc for the mapping).

    Args:
      src: the RLDS dataset directory.
      dest: the HDF5 file to create (e.g. `run1.h5`); it must not exist.
      split: the split to export (TFDS split syntax).
      cut_short: "truncated" (default) exports episodes the recorder cut short
        as timeouts; "drop" leaves them out.
      compression: an h5py compression filter for the arrays ("gzip", "lzf");
        d3rlpy reads either (default: none, as d3rlpy writes).
      channels_first: store image observations `(C, H, W)`, as d3rlpy's pixel
        encoder takes them (default: RLDS's `(H, W, C)`).
      progress: show a tqdm progress bar.

    Returns:
      The `ExportReport`.

    Raises:
      FileExistsError: if `dest` exists.
      SpecError: for a field d3rlpy cannot hold, or when no episode has a
        transition (d3rlpy cannot load an empty dataset).
    """
    import h5py
    from tqdm import tqdm

    check_cut_short(cut_short)
    dest = os.fspath(dest)
    if os.path.lexists(dest):
        raise FileExistsError(f"{dest}: exists; pass a new file name for the d3rlpy dataset")
    reader = open_source(src, split)
    temp = f"{dest}.partial-{os.getpid()}"
    report = ExportReport(source=os.fspath(src), destination=dest, format="d3rlpy")
    try:
        layout = _layout(reader, channels_first)
        with h5py.File(temp, "w") as h5:
            h5.create_dataset("columns", data=list(COLUMNS))
            if layout.tuple_observation:
                # Which dict leaf each tuple element is (d3rlpy ignores attributes).
                h5.attrs["observation_keys"] = json.dumps(
                    ["/".join(p) for p in layout.observation_paths]
                )
            chunks = {"compression": compression} if compression else {}
            episodes = source_episodes(reader, split, report, cut_short=cut_short)
            for episode, end in tqdm(episodes, desc="export", unit="ep", disable=not progress):
                observations, actions, rewards, terminated = episode_arrays(episode, end, layout)
                i = report.episodes
                # d3rlpy's names: `<column>_<episode>`, `observations_<episode>_<j>` for tuples.
                if layout.tuple_observation:
                    for j, column in enumerate(observations):
                        h5.create_dataset(f"observations_{i}_{j}", data=column, **chunks)
                else:
                    h5.create_dataset(f"observations_{i}", data=observations, **chunks)
                h5.create_dataset(f"actions_{i}", data=actions, **chunks)
                h5.create_dataset(f"rewards_{i}", data=rewards, **chunks)
                h5.create_dataset(f"terminated_{i}", data=terminated)
                _count(report, actions, terminated)
            if not report.episodes:
                raise SpecError(
                    f"{src}: no episode with a transition in split {split!r} "
                    f"({report.skipped} skipped); d3rlpy cannot load an empty dataset"
                )
            h5.create_dataset("num_episodes", data=report.episodes)
            h5.create_dataset("version", data=DATASET_VERSION)
        os.replace(temp, dest)
    finally:
        reader.close()
        if os.path.exists(temp):
            os.remove(temp)
    _note_left_out(reader, layout, report)
    report.notes.append(
        f"load it with d3rlpy.dataset.ReplayBuffer.load({dest!r}, d3rlpy.dataset.InfiniteBuffer())"
    )
    return report


def to_d3rlpy(
    src: os.PathLike | str,
    *,
    split: str = "train",
    cut_short: str = "truncated",
    action_size: int | None = None,
    channels_first: bool = False,
) -> Any:
    """An RLDS dataset as an in-memory `d3rlpy.dataset.MDPDataset` (needs d3rlpy installed).

    The episodes are those `export` writes (see the module doc); the whole
    dataset is held in memory.

    Args:
      src: the RLDS dataset directory.
      split: the split to read (TFDS split syntax).
      cut_short: "truncated" (default) or "drop" for episodes the recorder cut short.
      action_size: the number of discrete actions (default: d3rlpy's guess,
        the largest action + 1) or the action dimension.
      channels_first: image observations `(C, H, W)` (see `export`).

    Returns:
      The `MDPDataset` (a `d3rlpy.dataset.ReplayBuffer`).

    Raises:
      MissingDependencyError: if d3rlpy cannot be imported.
      SpecError: for a field d3rlpy cannot hold, or no transition at all.
    """
    try:
        import d3rlpy
    except ImportError as e:
        raise MissingDependencyError(
            f"to_d3rlpy needs d3rlpy ({e}); d3rlpy 2.8.1 pins gymnasium 1.0.0, so use a "
            "separate venv (docs/sharing.md, d3rlpy) or "
            "rlds_writer.interop.export.export_d3rlpy and ReplayBuffer.load there"
        ) from e
    check_cut_short(cut_short)
    reader = open_source(src, split)
    report = ExportReport(source=os.fspath(src), destination="memory", format="d3rlpy")
    parts: list[tuple[Any, np.ndarray, np.ndarray, bool]] = []
    try:
        layout = _layout(reader, channels_first)
        for episode, end in source_episodes(reader, split, report, cut_short=cut_short):
            parts.append(episode_arrays(episode, end, layout))
    finally:
        reader.close()
    if not parts:
        raise SpecError(f"{src}: no episode with a transition in split {split!r}")
    ends = np.cumsum([len(p[1]) for p in parts]) - 1
    terminals = np.zeros(ends[-1] + 1, np.float32)
    timeouts = np.zeros_like(terminals)
    for end, part in zip(ends, parts):
        (terminals if part[3] else timeouts)[end] = 1.0
    if layout.tuple_observation:
        observations: Any = [
            np.concatenate([p[0][j] for p in parts]) for j in range(len(layout.observation_paths))
        ]
    else:
        observations = np.concatenate([p[0] for p in parts])
    discrete = layout.action.dtype.kind in "iub"
    return d3rlpy.dataset.MDPDataset(
        observations=observations,
        actions=np.concatenate([p[1] for p in parts]),
        rewards=np.concatenate([p[2] for p in parts]),
        terminals=terminals,
        timeouts=timeouts,
        action_space=d3rlpy.ActionSpace.DISCRETE if discrete else d3rlpy.ActionSpace.CONTINUOUS,
        action_size=action_size,
    )
