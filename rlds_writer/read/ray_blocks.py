"""Rows of RLDS episodes as Ray Data blocks, made where a read task runs.

`read.ray_data.RLDSDatasource` plans the read tasks on the driver; each runs a
`TaskRead` on a worker, which decodes its episodes (`read.reader`) and turns
them into Arrow blocks of episode rows, transition rows (`read.transitions`)
or a caller's own columns, streamed as they reach `block_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import optional_dependencies

with optional_dependencies("rlds_writer.read.ray_data (reading RLDS with Ray Data)"):
    from ray.data.block import BlockAccessor

from rlds_writer.read.reader import DatasetReader, Episodes
from rlds_writer.read.transitions import episode_transitions

__all__ = ["Segment", "TaskRead"]

Segment = tuple[str, int, int, int]  # split, shard, first episode, end

# Ray Data's column of nulls that carries the row count of a block with no columns.
_STUB_COLUMN = "__bsp_stub"


def _flat_columns(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flat_columns(value, name + "/")
        elif value is not None:
            yield name, value


class TaskRead:
    """One read task: decodes its episodes on the worker and yields blocks of rows.

    Args:
      source: the `RLDSDatasource` it reads for (its dataset, split, rows and
        reading options).
      segments: the task's runs of episodes (split, shard, first, end).
      first: the selection's index of its first episode.
      columns: the columns to make (None: all).
      fields: the fields to decode (None: all).
    """

    def __init__(
        self,
        source: Any,
        segments: list[Segment],
        first: int,
        columns: list[str] | None,
        fields: list[str] | None,
    ):
        self.dataset = source.dataset
        self.split = source.split
        self.rows = source.rows
        self.cut_short = source.cut_short
        self.verify_checksums = source.verify_checksums
        self.on_corrupt = source.on_corrupt
        self.segments = segments
        self.first = first
        # An empty projection (Ray's `count()`) still needs the rows counted: the
        # episode index is made, then given as Ray's stub column of nulls.
        self.count_only = columns is not None and not columns
        self.columns = ["episode_index"] if self.count_only else columns
        self.fields = fields
        self.names = source.names
        self.block_bytes = source.block_bytes

    def __call__(self) -> Iterator[Any]:
        reader = DatasetReader(
            self.dataset,
            verify_checksums=self.verify_checksums,
            on_corrupt=self.on_corrupt,
            fields=self.fields,
        )
        episodes = Episodes(reader, self.segments, self.split)
        pending: dict[str, list[Any]] = {}
        size = 0
        try:
            for offset, episode in enumerate(episodes._full()):
                index = self.first + offset
                for name, chunk in self._columns(episode, index):
                    pending.setdefault(name, []).append(chunk)
                    size += _nbytes(chunk)
                if size >= self.block_bytes:
                    yield self._block(pending)
                    pending, size = {}, 0
            if pending:
                yield self._block(pending)
        finally:
            reader.close()

    def _block(self, pending: dict[str, list[Any]]) -> Any:
        if not self.count_only:
            return _block(pending, self.names)
        import pyarrow as pa

        rows = sum(len(chunk) for chunk in pending.get("episode_index", []))
        return pa.table({_STUB_COLUMN: pa.nulls(rows)})

    def _columns(self, episode: dict[str, Any], index: int) -> Iterator[tuple[str, Any]]:
        """(column, chunk) pairs: a chunk is a list of row values or an array of rows."""
        if callable(self.rows):
            out = self.rows(episode, index)
            return ((k, v if isinstance(v, np.ndarray) else list(v)) for k, v in out.items())
        if self.rows == "episodes":
            return self._episode_row(episode, index)
        return self._transition_rows(episode, index)

    def _keep(self, name: str) -> bool:
        return self.columns is None or name in self.columns

    def _episode_row(self, episode: dict[str, Any], index: int) -> Iterator[tuple[str, list[Any]]]:
        if self._keep("episode_index"):
            yield "episode_index", [np.int64(index)]
        for name, value in _flat_columns(episode):
            if self._keep(name):
                yield name, [value]

    def _transition_rows(
        self, episode: dict[str, Any], index: int
    ) -> Iterator[tuple[str, list[Any]]]:
        steps = episode.get("steps") or {}
        if "observation" not in steps:  # not asked for: is_last counts the steps
            steps = {**steps, "observation": steps["is_last"]}
            episode = {**episode, "steps": steps}
        batch = episode_transitions(episode, cut_short=self.cut_short)
        if batch is None:
            return
        n = len(batch["terminated"])
        if not n:
            return
        if self._keep("episode_index"):
            yield "episode_index", np.full(n, index, np.int64)
        if self._keep("step"):
            yield "step", np.arange(n, dtype=np.int64)
        for name, column in _flat_columns(batch):
            if self._keep(name):
                yield name, column if isinstance(column, np.ndarray) else list(column)


def _nbytes(chunk: Any) -> int:
    if isinstance(chunk, np.ndarray) and chunk.dtype != object:
        return chunk.nbytes
    return sum(getattr(v, "nbytes", 8) for v in chunk)


def _block(columns: dict[str, list[Any]], names: Mapping[str, str]) -> Any:
    """A Ray Data block (an Arrow table) from each column's chunks, renamed by `names`."""
    batch = {}
    for ours, chunks in columns.items():
        name = names.get(ours, ours)
        if all(isinstance(c, np.ndarray) and c.dtype != object for c in chunks) and (
            len({(c.shape[1:], c.dtype) for c in chunks}) == 1
        ):
            batch[name] = np.concatenate(chunks)  # arrays of rows, alike
            continue
        values = [v for chunk in chunks for v in chunk]
        first = values[0] if values else None
        if (
            isinstance(first, np.ndarray | np.generic)
            and first.dtype != object
            and all(
                isinstance(v, np.ndarray | np.generic)
                and v.shape == first.shape
                and v.dtype == first.dtype
                for v in values
            )
        ):
            batch[name] = np.stack(values)
        else:
            batch[name] = values  # episodes of different lengths, bytes, text
    return BlockAccessor.batch_to_block(batch)
