"""A PyTorch dataset of transitions (see `rlds_writer.read.transitions` for the rules).

`TransitionDataset(path)` holds a split's transitions in memory, as D4RL's
`qlearning_dataset` does, and gives one dict of tensors per index
(`observation`, `action`, `reward`, `next_observation`, `terminated`,
`truncated`, `discount`); batch it with a plain `DataLoader`.

`torch` is an optional dependency (the `torch` extra: `pip install -e ".[torch]"`
in a checkout).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import optional_dependencies

with optional_dependencies("rlds_writer.read.torch_transitions (PyTorch datasets)"):
    import torch
    from torch.utils import data as torch_data

from rlds_writer.read.reader import DatasetReader, Episodes, open_dataset

__all__ = ["TransitionDataset"]

# qlearning_dataset names -> the per-transition names of an item
_ITEM_NAMES = {
    "observations": "observation",
    "actions": "action",
    "rewards": "reward",
    "next_observations": "next_observation",
    "terminals": "terminated",
    "timeouts": "truncated",
    "discounts": "discount",
    "episode_ids": "episode_id",
}


def _tensor(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _tensor(v) for k, v in tree.items()}
    return torch.from_numpy(np.ascontiguousarray(tree))


def _index(tree: Any, i: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _index(v, i) for k, v in tree.items()}
    return tree[i]


class TransitionDataset(torch_data.Dataset):
    """Map-style dataset: item `i` is transition `i` of the split, as tensors.

    Args:
      source: a dataset path, a `DatasetReader` or an `Episodes` selection.
      split: the split (TFDS syntax, e.g. `"train[:90%]"`) when `source` is not `Episodes`.
      cut_short: "truncated" (keep episodes the recorder cut short) or "drop".
    """

    def __init__(
        self,
        source: str | os.PathLike | DatasetReader | Episodes,
        split: str = "train",
        *,
        cut_short: str = "truncated",
    ):
        if isinstance(source, Episodes):
            episodes = source
        elif isinstance(source, DatasetReader):
            episodes = source.episodes(split)
        else:
            episodes = open_dataset(source).episodes(split)
        # Through Episodes: transitions need each episode's final step, whatever
        # the reader's final_step option says.
        arrays = episodes.qlearning_dataset(cut_short=cut_short)
        self.arrays = {_ITEM_NAMES[k]: _tensor(v) for k, v in arrays.items() if k in _ITEM_NAMES}
        self._length = len(arrays["terminals"])

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _index(self.arrays, i)
