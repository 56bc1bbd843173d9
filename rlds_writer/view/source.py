"""The dataset a viewer serves, followed as it grows.

`ViewerSource` opens the dataset (local or object storage), sorts its fields
(`fields.layout`), builds the episode index and keeps recently used episodes.
`refresh()` reads the listing again (at most once a second): a writer's
commits add episodes, which the index scans shard by shard; what a listing
does not hold yet is never read, so the page shows what is committed.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from rlds_writer.read.reader import DatasetReader, open_dataset
from rlds_writer.store.dataset import Dataset
from rlds_writer.view.episode_data import EpisodeCache, EpisodeData
from rlds_writer.view.episode_index import EpisodeIndex, Progress, SplitIndex
from rlds_writer.view.fields import Layout, layout

# How often the listing is read again, at most: a local file is cheap to read, an
# object store costs three requests.
REFRESH_SECONDS = 1.0
REMOTE_REFRESH_SECONDS = 5.0


class ViewerSource:
    """A dataset opened for the viewer.

    Args:
      path: the dataset directory (local or `s3://`, `gs://`, ...), or a `Dataset`.
      progress: called while the index is built, as `(split, done, total)`.
      index_cache: read and write the index cache beside a local dataset.
      cache_bytes: the budget of episodes kept in memory.
    """

    def __init__(
        self,
        path: Dataset | str | os.PathLike,
        *,
        progress: Progress | None = None,
        index_cache: bool = True,
        cache_bytes: int = 256 << 20,
    ):
        self._lock = threading.RLock()
        self.reader = open_dataset(path)
        self.path = self.reader.path
        self.fields: Layout = layout(self.reader.features)
        self.index = EpisodeIndex(self.fields, progress=progress, cache=index_cache)
        self.index.update(self.reader)
        self.index.progress = None  # later scans are small: the page shows their result
        self.episodes = EpisodeCache(self._load, cache_bytes)
        self._checked = time.monotonic()
        # Asked of the lock once per listing read, not per request (a shared `flock`
        # taken for a moment could meet a recorder starting up).
        self.being_written = _being_written(self.reader)

    def refresh(self, force: bool = False) -> None:
        """Follows new commits of a dataset being written (at most once a `REFRESH_SECONDS`)."""
        with self._lock:
            now = time.monotonic()
            every = REFRESH_SECONDS if self.reader.dataset.is_local else REMOTE_REFRESH_SECONDS
            if not force and now - self._checked < every:
                return
            self._checked = now
            try:
                dataset = Dataset.open(self.path)
            except (OSError, ValueError):
                return  # mid-replace or gone for a moment: keep what is shown
            self.being_written = _being_written(self.reader)
            listing = {s: v.shard_lengths for s, v in dataset.splits.items()}
            if listing == {s: v.shard_lengths for s, v in self.reader.dataset.splits.items()}:
                return
            if dataset.features_config != self.reader.dataset.features_config:
                return  # another dataset now: the page keeps showing the one it opened
            reader = open_dataset(dataset)
            self.index.update(reader)
            old, self.reader = self.reader, reader
            old.close()

    def split(self, name: str | None) -> SplitIndex:
        """A split's index (the first split for None); KeyError if there is none."""
        splits = self.index.splits
        if name is None or name == "":
            if not splits:
                raise KeyError("the dataset has no splits")
            return next(iter(splits.values()))
        return splits[name]

    def episode(self, split: str, episode: int) -> EpisodeData:
        """One episode (from the cache, or read and parsed); IndexError if there is none."""
        if not 0 <= episode < len(self.split(split)):
            raise IndexError(f"split {split!r} has no episode {episode}")
        return self.episodes.get(split, episode)

    def _load(self, split: str, episode: int) -> EpisodeData:
        with self._lock:
            reader = self.reader
            ((where, record),) = list(reader.episodes(split)[episode : episode + 1].records())
        return EpisodeData(record, where, reader.features, self.fields)

    def describe(self) -> dict[str, Any]:
        """The dataset for the page: name, splits, what it shows of the fields."""
        reader = self.reader
        return {
            "path": os.fspath(self.path),
            "name": reader.name,
            "version": str(reader.version),
            "file_format": reader.file_format,
            "splits": {name: len(index) for name, index in self.index.splits.items()},
            "being_written": self.being_written,
            "fields": self.fields.describe(),
        }

    def close(self) -> None:
        self.reader.close()


def _being_written(reader: DatasetReader) -> bool:
    try:
        return bool(reader.dataset.is_being_written())
    except OSError:
        return False
