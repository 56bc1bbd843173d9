"""The shards a `DatasetWriter` writes, per split, and the listing it commits.

Each split has closed shards (listed in `dataset_info.json`) and at most one
open shard, which takes each encoded episode and hands it to the OS at once.
A shard rotates when it holds `max_episodes_per_file` episodes; a commit
closes every open shard that holds a record and replaces `dataset_info.json`
atomically, so a listed shard never grows and a reader (TFDS checks each
shard's count) loads exactly what is listed. array_record has no other way
anyway: its writer cannot flush an open file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer.errors import UploadFailedError
from rlds_writer.store.dataset import json_values, layout
from rlds_writer.store.formats import shards
from rlds_writer.store.formats.shard_format import ShardWriter
from rlds_writer.store.storage import file_io
from rlds_writer.store.writing import batch_records
from rlds_writer.store.writing.dataset_setup import Listing, Prepared

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)


def open_shard(
    path: epath.Path, file_format: str, fsync: bool, max_records: int | None = None
) -> ShardWriter:
    """Opens a new shard file. A seam for fault-injection tests."""
    return shards.open_writer(path, file_format, fsync, max_records)


def open_adopted(path: epath.Path, fd: int, max_records: int) -> ShardWriter:
    """The open TFRecord shard at `path` that `_shard_files.c` created (O_EXCL) and
    started: its writer takes over `fd`."""
    from rlds_writer.store.formats.tfrecord.tfrecord_shards import TFRecordShardWriter

    return TFRecordShardWriter(path, False, max_records, fd=fd)


@dataclasses.dataclass(frozen=True)
class UnsavedShard:
    """A shard the object store did not take; its bytes are kept on the local disk.

    Attributes:
      split: its split.
      path: the object it was bound for.
      kept: the local file holding it (`store.unsaved_shards`).
      episodes: the numbers of its episodes in this writer's run, 1-based.
    """

    split: str
    path: str
    kept: str
    episodes: tuple[int, ...]


class _SplitState:
    """Shards of one split: the closed ones and the open one."""

    def __init__(self, name: str, lengths: list[int], num_bytes: int):
        self.name = name
        self.lengths = list(lengths)
        self.num_bytes = num_bytes
        self.shard: ShardWriter | None = None
        # The run's numbers of the open shard's episodes, as consecutive runs
        # (a batch's dozens of episodes are one `range`, not dozens of ints).
        self.episodes: list[range] = []
        self.failed = 0  # shards whose upload failed: their names are not reused

    def committed(self) -> tuple[list[int], int]:
        """The closed shards: the only ones ever listed (a listed shard never grows)."""
        return list(self.lengths), self.num_bytes


class SplitShards:
    """The shards of every split of one dataset directory, as one writer writes them.

    Args:
      path: the dataset directory.
      name: the dataset name (in shard names).
      file_format: the shard format.
      fsync: `fsync` shards at each episode and dataset_info.json at each commit.
      max_episodes_per_file: episodes per shard before it rotates.
      prepared: the directory as `dataset_setup.prepare_directory` left it; what
        it left to write (the first listing, `metadata.json`) is written here.
    """

    def __init__(
        self,
        path: epath.Path,
        name: str,
        file_format: str,
        fsync: bool,
        max_episodes_per_file: int,
        prepared: Prepared,
    ):
        self.path = path
        self.name = name
        self.file_format = file_format
        self.fsync = fsync
        self.max_episodes_per_file = max_episodes_per_file
        self.remote = not file_io.is_local(path)
        self.appended = 0  # episodes appended in this run
        self.unsaved: list[UnsavedShard] = []  # shards whose upload failed
        self._info_json = prepared.info_json
        self._templates = prepared.templates
        self._splits = {
            split: _SplitState(split, lengths, nbytes)
            for split, (lengths, nbytes) in prepared.splits.items()
        }
        if prepared.first_commit is not None:
            self.commit_listing(prepared.first_commit)
        if prepared.write_metadata:
            self.write_metadata(prepared.metadata)

    def append(self, split: str, parts: Any, length: int) -> None:
        """Writes one encoded episode to `split`'s open shard (opening one) and hands
        it to the OS; `rotate_if_full` next."""
        state = self._open(split)
        state.shard.write(parts, length)
        state.shard.flush()
        self.appended += 1
        state.episodes.append(range(self.appended, self.appended + 1))

    def room(self, split: str) -> int:
        """How many more episodes `split`'s open shard takes before it rotates."""
        state = self._splits.get(split)
        held = state.shard.num_records if state is not None and state.shard is not None else 0
        return max(1, self.max_episodes_per_file - held)

    def append_records(self, split: str, buffer: Any, starts: Any, lengths: Any) -> None:
        """Writes encoded episodes given framed as TFRecord in `buffer` (`batch_records`):
        record `j`'s frame at `starts[j]`, its data `lengths[j]` bytes; at most `room`."""
        state = self._open(split)
        shard = state.shard
        count = len(starts)
        first = int(starts[0])
        end = int(starts[-1]) + 16 + int(lengths[-1])
        write_framed = getattr(shard, "write_framed", None)
        if write_framed is not None:  # TFRecord: the frames are the file's bytes
            # Records end to end: the data is all but 16 framing bytes each.
            write_framed(memoryview(buffer)[first:end], count, end - first - 16 * count)
        else:
            view = memoryview(buffer)
            for start, n in zip(starts.tolist(), lengths.tolist()):
                shard.write(view[start + 12 : start + 12 + n].tobytes(), n)
        shard.flush()
        state.episodes.append(range(self.appended + 1, self.appended + count + 1))
        self.appended += count

    def write_run(self, split: str, buffer: Any, starts: Any, lengths: Any) -> int:
        """Writes every record framed in `buffer` (as for `append_records`) into `split`'s
        shards in one call without the GIL (`_shard_files.c` `write_shards`): the rest of
        the open shard (closed if they fill it), the whole shards they fill, and the next
        shard, left open with the rest. Locally, in TFRecord, without fsync only, and only
        where nothing writes zeros ahead in the open shard. Returns how many records it
        wrote: all, or 0 where it does not apply (`append_records` then).

        Raises:
          OSError: a shard could not be written, naming it (those before it are kept:
            closed shards, listed at the next commit).
        """
        native = batch_records.native
        if self.remote or self.fsync or self.file_format != "tfrecord" or native is None:
            return 0
        state = self._splits.get(split)
        if state is None:
            state = self._splits[split] = _SplitState(split, [], 0)
        head = state.shard
        head_fd = -1 if head is None else getattr(head, "plain_fd", lambda: None)()
        if head_fd is None:
            return 0
        count, per = len(starts), self.max_episodes_per_file
        # Records per file: the open shard's room first, then whole shards, the rest last.
        take = [] if head is None else [min(count, per - head.num_records)]
        take += [per] * ((count - sum(take)) // per)
        rest = count - sum(take)
        if rest:
            take.append(rest)
        if head is None:
            take.insert(0, 0)  # no head: its bounds unused
        bounds, paths, first = [], [], 0
        template, index = self._template(split), len(state.lengths) + state.failed
        for k, n in enumerate(take):
            if n == 0:
                bounds += [0, 0]
                continue
            last = first + n - 1
            bounds += [int(starts[first]), int(starts[last]) + 16 + int(lengths[last])]
            first += n
            if k:
                name = template.filename(index + len(paths) + (head is not None), 0)
                paths.append(os.fsencode(self.path / name))
        close_head = head is not None and head.num_records + take[0] >= per
        keep_last = bool(rest) and (head is None or close_head)
        head_end = head.end if head is not None else 0
        done, files, error, tail_fd = native.write_shards(
            head_fd, head_end, close_head, tuple(paths), buffer,
            np.array(bounds, np.int64), keep_last,
        )  # fmt: skip
        if done >= 1:  # the open shard took its records (and is closed if full)
            n, size = take[0], bounds[1] - bounds[0]
            head.appended(n, size - 16 * n, size, closed=close_head)
            state.episodes.append(range(self.appended + 1, self.appended + n + 1))
            self.appended += n
            if close_head:
                state.shard, state.episodes = None, []
                if done == 1:
                    state.lengths.append(head.num_records)
                    state.num_bytes += head.num_bytes
                index += 1
        if error and done in (0, 2):  # the open shard's write, or its close, failed
            raise OSError(error, os.strerror(error), os.fspath(head.path))
        for k in range(files):
            n, size = take[1 + k], bounds[2 * k + 3] - bounds[2 * k + 2]
            if keep_last and k == len(paths) - 1:  # the next open shard
                path = self.path / template.filename(index + k, 0)
                state.shard = open_adopted(path, tail_fd, per)
                state.shard.appended(n, size - 16 * n, size)
                state.episodes = [range(self.appended + 1, self.appended + n + 1)]
            else:
                state.lengths.append(n)
                state.num_bytes += size - 16 * n
            self.appended += n
        if error:
            raise OSError(error, os.strerror(error), os.fsdecode(paths[files]))
        return count

    def _open(self, split: str) -> _SplitState:
        state = self._splits.get(split)
        if state is None:
            state = self._splits[split] = _SplitState(split, [], 0)
        if state.shard is None:
            index = len(state.lengths) + state.failed
            path = self.path / self._template(split).filename(index, 0)
            state.shard = open_shard(path, self.file_format, self.fsync, self.max_episodes_per_file)
        return state

    def room_inline(self, split: str) -> bool:
        """Whether the next episode of `split` can be appended without touching an
        object store: always locally; remotely, into an open shard it does not fill
        (opening a shard asks the store, a full one is uploaded)."""
        if not self.remote:
            return True
        state = self._splits.get(split)
        return (
            state is not None
            and state.shard is not None
            and state.shard.num_records + 1 < self.max_episodes_per_file
        )

    def rotate_if_full(self, split: str) -> None:
        """Closes `split`'s open shard if it holds `max_episodes_per_file` episodes."""
        state = self._splits[split]
        if state.shard is not None and state.shard.num_records >= self.max_episodes_per_file:
            self._rotate(state)

    def listing(self) -> Listing:
        """Split name -> (shard lengths, bytes) of the closed shards."""
        return {name: state.committed() for name, state in self._splits.items()}

    def commit(self) -> None:
        """Closes the open shards that hold a record and lists every closed shard."""
        for state in self._splits.values():
            if state.shard is not None and state.shard.num_records:
                self._rotate(state)
        self.commit_listing(self.listing())

    def finish(self) -> None:
        """Closes every open shard and commits."""
        for state in self._splits.values():
            if state.shard is not None:
                self._rotate(state)
        self.commit_listing(self.listing())

    def commit_listing(self, splits: Mapping[str, tuple[list[int], int]]) -> None:
        """Replaces dataset_info.json (atomically) with `splits` listed."""
        info = layout.with_splits(self._info_json, splits, self._templates)
        file_io.atomic_write_text(
            self.path / layout.DATASET_INFO, json_values.dumps_info(info), fsync=self.fsync
        )

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replaces metadata.json (atomically)."""
        file_io.atomic_write_text(
            self.path / layout.METADATA, json.dumps(metadata, indent=2), fsync=self.fsync
        )

    def close_after_failure(self) -> None:
        """Closes the open shards, best effort, so that their complete records reach
        the OS; `dataset_info.json` is left to `recover`."""
        for state in self._splits.values():
            shard, state.shard = state.shard, None
            episodes, state.episodes = state.episodes, []
            if shard is not None:
                try:
                    self._close_shard(state, shard, episodes)
                except Exception as e:  # noqa: BLE001 - the first error is the one raised
                    _log.error("closing %s after the failure failed too: %r", shard.path, e)

    def _template(self, split: str) -> layout.ShardTemplate:
        """How `split`'s shards are named: the dataset's template, or ours for a new split."""
        template = self._templates.get(split)
        if template is None:
            template = self._templates[split] = layout.ShardTemplate(
                layout.FILEPATH_TEMPLATE, self.name, split, self.file_format
            )
        return template

    def _rotate(self, state: _SplitState) -> None:
        shard = state.shard
        state.shard = None
        episodes, state.episodes = state.episodes, []
        self._close_shard(state, shard, episodes)
        state.lengths.append(shard.num_records)
        state.num_bytes += shard.num_bytes

    def _close_shard(self, state: _SplitState, shard: ShardWriter, episodes: list[range]) -> None:
        try:
            shard.close()
        except UploadFailedError as e:
            state.failed += 1
            numbers = tuple(i for run in episodes for i in run)
            self.unsaved.append(UnsavedShard(state.name, e.path, e.kept, numbers))
            raise
