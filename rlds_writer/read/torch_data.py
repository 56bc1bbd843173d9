"""PyTorch datasets over RLDS episodes, read without TensorFlow.

- `EpisodeDataset`: map-style, one item per episode.
- `WindowDataset`: map-style, one item per `size`-step window inside an episode
  (the sampling unit of most offline RL algorithms).
- `RLDSIterableDataset`: streams episodes, steps, step batches or windows, and
  splits the work across `DataLoader` workers and `torch.distributed` ranks by
  shard file, so that every worker reads its own files sequentially (from
  local disk or object storage, by ranges) and together they read every
  episode once per epoch, in an order shuffled by seed and epoch if asked.
- `collate`: batches nested dicts of numpy values into nested dicts of tensors.

`torch` is an optional dependency (the `torch` extra: `pip install -e ".[torch]"`
in a checkout): this module imports it, `import rlds_writer` does not.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import optional_dependencies

with optional_dependencies("rlds_writer.read.torch_data (PyTorch datasets)"):
    import torch
    from torch.utils import data as torch_data

from rlds_writer.read.nest import flatten, map_tree
from rlds_writer.read.reader import DatasetReader, Episodes, open_dataset
from rlds_writer.store.dataset import Dataset

__all__ = ["EpisodeDataset", "RLDSIterableDataset", "WindowDataset", "collate", "to_tensors"]

_UNITS = ("episodes", "steps", "windows")


def _episodes(source: Any, split: str, open_kwargs: Mapping[str, Any]) -> Episodes:
    if isinstance(source, Episodes):
        return source
    if isinstance(source, DatasetReader):
        return source.episodes(split)
    if isinstance(source, str | os.PathLike | Dataset):
        return open_dataset(source, **open_kwargs).episodes(split)
    raise TypeError(
        f"expected a dataset path, Dataset, DatasetReader or Episodes, got {type(source)}"
    )


def _is_numeric(value: Any) -> bool:
    return isinstance(value, np.ndarray | np.generic) and np.asarray(value).dtype != object


def to_tensors(tree: Any) -> Any:
    """Converts a nested dict of numpy values to tensors; bytes and text stay as they are.

    Args:
      tree: a nested dict (or list) of numpy arrays, numpy scalars and bytes.

    Returns:
      The same structure with numeric arrays and scalars as `torch.Tensor`s.
    """
    if isinstance(tree, Mapping):
        return {k: to_tensors(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_tensors(v) for v in tree]
    if _is_numeric(tree):
        arr = np.asarray(tree)
        if not arr.flags.writeable:
            arr = arr.copy()
        return torch.from_numpy(arr)
    return tree


def collate(batch: Sequence[Any]) -> Any:
    """Batches a list of nested dicts of numpy values (a `DataLoader` `collate_fn`).

    Numeric leaves are stacked into one tensor with a leading batch axis;
    leaves whose shapes differ (episodes of different lengths) become a list
    of tensors; bytes, text and object arrays become lists.

    Args:
      batch: items from one of this module's datasets.

    Returns:
      The batch as a nested dict.
    """
    first = batch[0]
    if isinstance(first, Mapping):
        return {k: collate([item[k] for item in batch]) for k in first}
    if _is_numeric(first):
        shape = np.shape(first)
        if all(np.shape(x) == shape for x in batch):
            return torch.from_numpy(np.stack(batch))
        return [torch.from_numpy(np.array(x)) for x in batch]
    if isinstance(first, torch.Tensor):
        if all(x.shape == first.shape for x in batch):
            return torch.stack(list(batch))
        return list(batch)
    if isinstance(first, np.ndarray):  # object arrays: text across steps
        return [x.tolist() for x in batch]
    return list(batch)


class EpisodeDataset(torch_data.Dataset):
    """Map-style dataset: item `i` is episode `i` of the selection, as nested numpy.

    Args:
      source: a dataset directory, a `DatasetReader` or an `Episodes` view.
      split: a TFDS split spec such as `'train[:90%]'` (ignored for `Episodes`).
      transform: applied to each episode (e.g. `to_tensors`).
      **open_kwargs: passed to `open_dataset` when `source` is a path.
    """

    def __init__(
        self,
        source: Any,
        split: str = "train",
        transform: Callable[[Any], Any] | None = None,
        **open_kwargs: Any,
    ):
        self.episodes = _episodes(source, split, open_kwargs)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, i: int) -> Any:
        episode = self.episodes[i]
        return self.transform(episode) if self.transform else episode


class WindowDataset(torch_data.Dataset):
    """Map-style dataset over `size`-step windows that never cross an episode boundary.

    Item `i` is a nested dict of the `steps` fields, each with a leading axis
    of length `size`. Windows start every `stride` steps; episodes shorter than
    `size` contribute none. The window index is built from the episodes' step
    counts (one pass over the records, no values decoded).

    Args:
      source: a dataset directory, a `DatasetReader` or an `Episodes` view.
      size: steps per window.
      split: a TFDS split spec (ignored for `Episodes`).
      stride: steps between the starts of consecutive windows of an episode.
      transform: applied to each window.
      **open_kwargs: passed to `open_dataset` when `source` is a path.
    """

    def __init__(
        self,
        source: Any,
        size: int,
        split: str = "train",
        stride: int = 1,
        transform: Callable[[Any], Any] | None = None,
        **open_kwargs: Any,
    ):
        if size < 1 or stride < 1:
            raise ValueError(f"size and stride must be >= 1, got {size}, {stride}")
        self.episodes = _episodes(source, split, open_kwargs)
        self.size = size
        self.stride = stride
        self.transform = transform
        self.index = self.episodes.window_index(size, stride)
        self._cached: tuple[int, Any] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> Any:
        episode_index, start = (int(x) for x in self.index[i])
        if self._cached is None or self._cached[0] != episode_index:
            self._cached = (episode_index, self.episodes[episode_index]["steps"])
        steps = self._cached[1]
        window = map_tree(lambda col: col[start : start + self.size], steps)
        return self.transform(window) if self.transform else window


class RLDSIterableDataset(torch_data.IterableDataset):
    """Streams a selection of episodes, split across workers by shard file.

    Each `DataLoader` worker of each distributed rank reads a disjoint part of
    the selection: whole shard files dealt out round-robin when there are at
    least as many files as readers (ranks x workers), otherwise contiguous
    episode ranges. Together they read every selected episode exactly once per
    epoch. The rank and world size are `torch.distributed`'s when a process
    group is initialised (or those given). Shuffling is deterministic: the same
    `seed` and epoch (`set_epoch(e)` before iterating the `DataLoader` for
    epoch `e`) give the same order on every rank, so the parts stay disjoint.
    The epoch lives in shared memory made with the dataset, which `DataLoader`
    workers inherit (fork) or receive (spawn, forkserver): workers read it each
    time an epoch starts, so `persistent_workers=True` workers follow
    `set_epoch` too. Parts may differ
    by a file's worth of episodes; a DDP loop that needs equal step counts per
    rank stops at the shortest (e.g. `torch.distributed.algorithms.Join`).

    Args:
      source: a dataset directory, a `DatasetReader` or an `Episodes` view.
      split: a TFDS split spec (ignored for `Episodes`).
      unit: what one item is: `"episodes"`, `"steps"` or `"windows"`.
      batch_size: with `unit="steps"`, yield batches of this many steps as
        dicts of arrays (cheaper than batching single steps in the
        `DataLoader`; use `DataLoader(..., batch_size=None)`). The last batch
        of each worker may be smaller.
      window: window length, for `unit="windows"`.
      stride: steps between window starts, for `unit="windows"`.
      shuffle_files: shuffle the order of shard files each epoch (seeded by
        `seed` and `set_epoch`).
      shuffle_episodes: also shuffle the order of the episodes within each
        reader's part, each epoch (each episode is then one read: a range
        request in object storage).
      seed: seed for the shuffles.
      rank: this process's rank (default: `torch.distributed`'s, else 0).
      world_size: number of ranks (default: `torch.distributed`'s, else 1).
      transform: applied to each item.
      **open_kwargs: passed to `open_dataset` when `source` is a path (e.g.
        `on_corrupt="skip"`).
    """

    def __init__(
        self,
        source: Any,
        split: str = "train",
        unit: str = "episodes",
        batch_size: int | None = None,
        window: int | None = None,
        stride: int = 1,
        shuffle_files: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        shuffle_episodes: bool = False,
        **open_kwargs: Any,
    ):
        if unit not in _UNITS:
            raise ValueError(f"unit must be one of {_UNITS}, got {unit!r}")
        if unit == "windows" and not window:
            raise ValueError("unit='windows' needs window=<steps per window>")
        if batch_size is not None and unit != "steps":
            raise ValueError("batch_size applies to unit='steps' only; batch others in DataLoader")
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if world_size is None:
            world_size = torch.distributed.get_world_size() if distributed else 1
        if rank is None:
            rank = torch.distributed.get_rank() if distributed else 0
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.episodes = _episodes(source, split, open_kwargs)
        self.unit = unit
        self.batch_size = batch_size
        self.window = window
        self.stride = stride
        self.shuffle_files = shuffle_files
        self.shuffle_episodes = shuffle_episodes
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.transform = transform
        # Shared with the DataLoader's workers, persistent ones included: read per epoch.
        self._epoch = multiprocessing.RawValue(ctypes.c_int64, 0)

    @property
    def epoch(self) -> int:
        """The epoch the shuffles are seeded with (see `set_epoch`)."""
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch, which reseeds the shuffles, in this process and its workers.

        Call it before iterating the `DataLoader` for that epoch; workers
        started earlier (`persistent_workers=True`) see it when the epoch starts.
        """
        self._epoch.value = int(epoch)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:
            # Pickled for anything but a worker being started (shared memory
            # only travels to a child): a copy of the value, in memory of its own.
            state["_epoch"] = int(self._epoch.value)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        epoch = state["_epoch"]
        if isinstance(epoch, int):
            state["_epoch"] = multiprocessing.RawValue(ctypes.c_int64, epoch)
        self.__dict__.update(state)

    def _part(self) -> Episodes:
        info = torch_data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        count = self.world_size * workers
        index = self.rank * workers + worker
        episodes = self.episodes
        if self.shuffle_files:
            files = episodes.files()
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(files)
            episodes = Episodes(
                episodes.reader, [s for f in files for s in f.segments], episodes.spec
            )
        part = episodes.partition(index, count)
        if not self.shuffle_episodes:
            return part
        # Seeded by part as well: each reader its own order, the same on every run.
        order = np.random.default_rng([self.seed, self.epoch, index]).permutation(len(part))
        located = (part._locate(int(i)) for i in order)
        segments = [(split, shard, local, local + 1) for split, shard, local in located]
        return Episodes(part.reader, segments, part.spec)

    def __iter__(self) -> Iterator[Any]:
        part = self._part()
        if self.unit == "episodes":
            items: Iterator[Any] = iter(part)
        elif self.unit == "windows":
            items = part.windows(self.window, self.stride)
        elif self.batch_size:
            items = _step_batches(part, self.batch_size)
        else:
            items = part.steps()
        if self.transform is None:
            yield from items
        else:
            for item in items:
                yield self.transform(item)


def _step_batches(episodes: Episodes, batch_size: int) -> Iterator[dict[str, Any]]:
    """Yields dicts of step columns, `batch_size` steps each, across episodes."""
    pending: list[list[tuple[tuple, np.ndarray]]] = []
    have = 0
    for episode in episodes:
        flat = flatten(episode.get("steps", {}))
        if not flat:
            continue
        pending.append(flat)
        have += len(flat[0][1])
        while have >= batch_size:
            batch, pending, have = _take(pending, batch_size, have)
            yield batch
    if have:
        batch, pending, have = _take(pending, have, have)
        yield batch


def _take(pending: list, n: int, have: int) -> tuple[dict[str, Any], list, int]:
    """Takes the first `n` steps out of the pending episodes' columns."""
    parts, rest, need = [], [], n
    for flat in pending:
        length = len(flat[0][1])
        if need >= length:
            parts.append(flat)
            need -= length
        elif need > 0:
            parts.append([(p, col[:need]) for p, col in flat])
            rest.append([(p, col[need:]) for p, col in flat])
            need = 0
        else:
            rest.append(flat)
    out: dict[str, Any] = {}
    for i, (path, _) in enumerate(parts[0]):
        column = np.concatenate([flat[i][1] for flat in parts])
        node = out
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = column
    return out, rest, have - n
