"""RLDS datasets as Ray Data datasets, read on the cluster's workers.

`read_rlds(path, split)` returns a `ray.data.Dataset` over a dataset directory
(local, `s3://`, `gs://`, any fsspec protocol), with no copy of the data::

    ds = read_rlds("s3://bucket/catch", "train[:90%]", rows="transitions",
                   columns=["observation", "action", "reward"])
    for batch in ds.iter_batches(batch_size=256): ...

The driver reads only the dataset's JSON files (`store.dataset.Dataset`): the
selection is cut into read tasks of whole episodes, each a run of one shard
file or several small runs, sized by bytes on disk (`bytes_per_task`), and
the tasks run on Ray's workers, which fetch their byte ranges and decode them
(images included) where they run. Rows are

* `rows="episodes"`: one row per episode; columns are the episode's fields by
  path (`steps/observation`, `steps/action`, ..., `episode_metadata/seed`),
  each step field an array with a leading time axis, plus `episode_index`;
* `rows="transitions"`: one row per transition `(o, a, r, o')`, as
  `rlds_writer.read.transitions` defines them: `observation`, `action`,
  `reward`, `discount`, `next_observation`, `terminated`, `truncated`,
  `step_metadata/<field>`, `next_step_metadata/<field>`, plus `episode_index`
  and `step`; a dict observation gives `observation/<key>` columns;
* a function `(episode, episode_index) -> dict of columns` (picklable: it runs
  on the workers), for other layouts (`interop/formats/rllib/offline.py`
  makes RLlib's episodes with one).

`episode_index` is the episode's position in the selection, so a consumer can
count what it read. `columns` (or Ray's `select_columns`, pushed down into the
read) decodes only the fields those columns need.

`ray` is an optional dependency (the `rllib` extra): this module imports it,
`import rlds_writer` does not.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rlds_writer.errors import optional_dependencies

with optional_dependencies("rlds_writer.read.ray_data (reading RLDS with Ray Data)"):
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

from rlds_writer.read.decode import wanted_by
from rlds_writer.read.ray_blocks import Segment, TaskRead
from rlds_writer.read.reader import DatasetReader
from rlds_writer.read.transitions import CUT_SHORT_MODES, END_FIELDS
from rlds_writer.store.dataset import Dataset, open_handle

__all__ = ["ROWS", "RLDSDatasource", "read_rlds"]

ROWS = ("episodes", "transitions")
# Read tasks hold whole episodes: at least this many bytes each, unless the
# caller asks for smaller ones (many small tasks cost more to schedule than to read).
_MIN_TASK_BYTES = 1 << 20
# Blocks stream to the consumer while the task reads on; a consumer that
# iterates small batches from many blocks pays per block (`block_bytes`).
_BLOCK_BYTES = 8 << 20
_TRANSITION_COLUMNS = ("observation", "action", "reward", "discount", "next_observation")
_ALWAYS = ("steps/is_last", "steps/is_terminal")


class RLDSDatasource(Datasource):
    """A Ray Data datasource over one selection of an RLDS dataset (see the module doc).

    Use `read_rlds`, or `ray.data.read_datasource(RLDSDatasource(...))`.

    Args:
      source: the dataset directory (local or `scheme://`) or a `Dataset`.
      split: a TFDS split spec (`"train"`, `"train[:10%]"`, `"train+test"`).
      rows: `"episodes"`, `"transitions"` or a function `(episode, index) -> columns`.
      columns: the columns to give (and the only fields decoded), or None for all.
      cut_short: for transitions: `"truncated"` keeps episodes the recorder cut
        short, as truncated; `"drop"` leaves them out.
      bytes_per_task: the most bytes on disk one read task reads (whole
        episodes: a larger episode makes a task of its own).
      verify_checksums: check each record's CRC before decoding it.
      on_corrupt: `"raise"` or `"skip"` (as `open_dataset`).
      fields: with a `rows` function, the fields it needs decoded (None: all).
      names: columns renamed as the blocks are made, `{ours: theirs}` (for a
        consumer's schema, e.g. RLlib's `obs`; no extra pass over the data).
      block_bytes: a read task yields a block each time its rows reach this
        many bytes in memory (and at its end): smaller blocks reach the
        consumer sooner, larger ones cost it less per row.
    """

    def __init__(
        self,
        source: Dataset | str | os.PathLike,
        split: str = "train",
        *,
        rows: str | Callable[[dict[str, Any], int], Mapping[str, Any]] = "episodes",
        columns: Sequence[str] | None = None,
        cut_short: str = "truncated",
        bytes_per_task: int = 128 << 20,
        verify_checksums: bool = True,
        on_corrupt: str = "raise",
        fields: Sequence[str] | None = None,
        names: Mapping[str, str] | None = None,
        block_bytes: int = _BLOCK_BYTES,
    ):
        super().__init__()
        if not callable(rows) and rows not in ROWS:
            raise ValueError(
                f"rows must be one of {ROWS} or a function (episode, index) -> columns, got "
                f"{rows!r}"
            )
        if cut_short not in CUT_SHORT_MODES:
            raise ValueError(f"cut_short must be one of {CUT_SHORT_MODES}, got {cut_short!r}")
        if bytes_per_task < 1:
            raise ValueError(f"bytes_per_task must be >= 1, got {bytes_per_task}")
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        self.dataset = open_handle(source)
        # Checks the split spec and the options on the driver, before any task runs
        # (from the JSON files alone: no shard is opened).
        reader = DatasetReader(
            self.dataset, verify_checksums=verify_checksums, on_corrupt=on_corrupt
        )
        self.segments: list[Segment] = list(reader.episodes(split).segments)
        self.split = split
        self.rows = rows
        self.columns = None if columns is None else list(columns)
        self.cut_short = cut_short
        self.bytes_per_task = bytes_per_task
        self.block_bytes = block_bytes
        self.verify_checksums = verify_checksums
        self.on_corrupt = on_corrupt
        self.fields = None if fields is None else list(fields)
        self.names = dict(names or {})
        self._projection_map: dict[str, str] | None = None
        self._segment_bytes = [self._bytes(seg) for seg in self.segments]
        if self.columns is not None:
            self._fields_for(self.columns)  # an unknown column fails here, not on a worker

    def get_name(self) -> str:
        return "RLDS"

    def supports_projection_pushdown(self) -> bool:
        return True

    def _wanted_columns(self) -> list[str] | None:
        ours = {theirs: mine for mine, theirs in self.names.items()}
        projected = None
        if self._projection_map is not None:
            projected = [ours.get(name, name) for name in self._projection_map]
        if self.columns is None:
            return projected
        if projected is None:
            return self.columns
        return [c for c in self.columns if c in projected]

    def _bytes(self, segment: Segment) -> int:
        """The bytes on disk of a run of episodes (their share of the shard's size)."""
        split, shard, a, b = segment
        listing = self.dataset.splits[split]
        total = listing.num_episodes or 1
        if listing.num_bytes > 0:
            per_episode = listing.num_bytes / total
        else:  # an old listing without sizes: the shard's own size
            size = self.dataset.size(listing.shard_name(shard))
            per_episode = size / max(1, listing.shard_lengths[shard])
        return max(1, int(per_episode * (b - a)))

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self._segment_bytes)

    def _fields_for(self, columns: Sequence[str] | None) -> list[str] | None:
        """The features to decode for `columns` (None: every one)."""
        if callable(self.rows):
            return self.fields
        if columns is None:
            return None
        leaves = self.dataset.features.step_leaves + self.dataset.features.episode_leaves
        keys = [leaf.key for leaf in leaves]
        out: set[str] = set()
        for column in columns:
            if column in ("episode_index", "step"):
                continue
            if self.rows == "episodes":
                field = column
            else:
                head, _, rest = column.partition("/")
                if head in ("observation", "next_observation"):
                    field = "steps/observation" + (f"/{rest}" if rest else "")
                elif head in ("action", "reward", "discount") and not rest:
                    field = f"steps/{head}"
                elif head in ("terminated", "truncated") and not rest:
                    continue
                elif head in ("step_metadata", "next_step_metadata"):
                    field = f"steps/{rest}" if rest else "steps"
                else:
                    raise ValueError(
                        f"column {column!r}: transitions have observation, action, reward, "
                        "discount, next_observation, terminated, truncated, step_metadata/..., "
                        "next_step_metadata/..., episode_index and step"
                    )
            if not any(wanted_by(key, field) for key in keys):
                if _optional_column(column):
                    continue  # reward or discount: transitions fill them in
                raise ValueError(
                    f"column {column!r}: the dataset has no field {field!r} (it has "
                    f"{', '.join(keys)})"
                )
            out.add(field)
        if self.rows == "transitions":
            out.update(k for k in _ALWAYS if k in keys)
            out.update(
                leaf.key
                for leaf in self.dataset.features.episode_leaves
                if leaf.path[-1] in END_FIELDS
            )
        return sorted(out)

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        columns = self._wanted_columns()
        fields = self._fields_for(columns)
        tasks = []
        for segments, first, nbytes in self._plan(parallelism):
            episodes = sum(b - a for _, _, a, b in segments)
            files = sorted({self.dataset.shard_path(s, i) for s, i, _, _ in segments})
            metadata = BlockMetadata(
                num_rows=episodes if self.rows == "episodes" else None,
                size_bytes=nbytes,
                exec_stats=None,
                input_files=files,
            )
            read = TaskRead(self, segments, first, columns, fields)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks

    def num_tasks(self) -> int:
        """The read tasks of at most `bytes_per_task` bytes the selection makes (no I/O)."""
        return len(self._plan(0))

    def _plan(self, parallelism: int) -> list[tuple[list[Segment], int, int]]:
        """The read tasks' episodes: about `parallelism` tasks, cut at shard files if enough.

        A task that starts inside a shard file first finds its first record by
        walking the record headers before it: in object storage one range
        request per record or two (a split 2.7 MB shard of 50 episodes cost ~20
        requests per task on moto, 5x the whole read's time). So tasks hold
        whole files whenever that still gives every CPU of the cluster one;
        files are cut only for the CPUs (or a file over `bytes_per_task`).
        """
        total = sum(self._segment_bytes)
        target = self.bytes_per_task
        if parallelism and parallelism > 0 and total:
            # Enough tasks for the parallelism Ray asks for, but not tiny ones.
            even = math.ceil(total / parallelism)
            target = min(target, max(even, min(_MIN_TASK_BYTES, target)))
        whole = list(self._groups(target, whole_files=True))
        wanted = min(math.ceil(total / target) if total else 1, _cluster_cpus())
        if len(whole) >= wanted:
            return whole
        return list(self._groups(target))

    def _groups(
        self, target: int, whole_files: bool = False
    ) -> Iterator[tuple[list[Segment], int, int]]:
        """Runs of episodes of about `target` bytes: (segments, first episode index, bytes).

        `whole_files`: a group ends at a shard file's end, at the boundary
        nearest `target` bytes; a file is cut only where it alone exceeds
        `bytes_per_task`.
        """
        group: list[Segment] = []
        group_bytes = 0
        first = index = 0
        cap = self.bytes_per_task if whole_files else target
        for segment, nbytes in zip(self.segments, self._segment_bytes):
            split, shard, a, b = segment
            if (
                whole_files
                and group
                and (group_bytes + nbytes / 2 > target or group_bytes + nbytes > cap)
            ):
                yield group, first, int(group_bytes)
                group, group_bytes, first = [], 0, index
            per_episode = nbytes / max(1, b - a)
            start = a
            while start < b:
                # Episodes of under a byte only in a listing that lies (declared counts
                # far over the bytes): they go in the group as they are, never one
                # group per `target` of them (10**14 declared episodes were 10**8 groups).
                room = max(1, int((cap - group_bytes) // per_episode)) if per_episode else b
                if group and group_bytes + per_episode > cap:
                    yield group, first, int(group_bytes)
                    group, group_bytes, first = [], 0, index
                    continue
                stop = min(b, start + room)
                group.append((split, shard, start, stop))
                group_bytes += per_episode * (stop - start)
                index += stop - start
                start = stop
        if group:
            yield group, first, int(group_bytes)


def _cluster_cpus() -> int:
    """The CPUs of the Ray cluster this process is connected to (1 if none)."""
    if not ray.is_initialized():
        return 1
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _optional_column(column: str) -> bool:
    return column in ("reward", "discount")


def read_rlds(
    path: Dataset | str | os.PathLike,
    split: str = "train",
    *,
    rows: str | Callable[[dict[str, Any], int], Mapping[str, Any]] = "episodes",
    columns: Sequence[str] | None = None,
    cut_short: str = "truncated",
    bytes_per_task: int = 128 << 20,
    verify_checksums: bool = True,
    on_corrupt: str = "raise",
    names: Mapping[str, str] | None = None,
    block_bytes: int = _BLOCK_BYTES,
    **read_args: Any,
) -> ray.data.Dataset:
    """Reads an RLDS dataset into a `ray.data.Dataset` (see the module doc).

    Args:
      path: the dataset directory (local, `s3://...`, `gs://...`) or a `Dataset`.
      split: a TFDS split spec, e.g. `"train[:90%]"`.
      rows: `"episodes"` (one row per episode), `"transitions"` (one per
        `(o, a, r, o')`) or a function `(episode, index) -> dict of columns`.
      columns: the columns to give; only the fields they need are decoded.
      cut_short: `"truncated"` or `"drop"`, for episodes the recorder cut short
        (transitions).
      bytes_per_task: the most bytes on disk a read task reads.
      verify_checksums: check each record's CRC.
      on_corrupt: `"raise"` or `"skip"`.
      names: output columns renamed, `{ours: theirs}`.
      block_bytes: the bytes in memory at which a read task yields a block.
      **read_args: passed to `ray.data.read_datasource` (`concurrency`,
        `num_cpus`, `override_num_blocks`, `ray_remote_args`, ...).

    Returns:
      A lazy `ray.data.Dataset`: nothing is read until it is consumed.
    """
    source = RLDSDatasource(
        path,
        split,
        rows=rows,
        columns=columns,
        cut_short=cut_short,
        bytes_per_task=bytes_per_task,
        verify_checksums=verify_checksums,
        on_corrupt=on_corrupt,
        names=names,
        block_bytes=block_bytes,
    )
    return ray.data.read_datasource(source, **read_args)
