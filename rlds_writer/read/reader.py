"""Reads RLDS datasets into numpy without TensorFlow.

`open_dataset(path)` opens a dataset directory written by `rlds_writer` or by
TFDS's `SequentialWriter` (tfrecord or array_record shards). It reads
`dataset_info.json` and `features.json` itself, decodes each episode's
`tf.train.Example` with a small numpy wire decoder (`rlds_writer.store.features.wire`), and
gives each episode as a nested dict of numpy arrays, `steps` holding one array
per field with a leading time axis::

    ds = open_dataset("/data/catch")
    episodes = ds["train[:10%]"]        # TFDS split syntax
    episodes[3]["steps"]["observation"]  # float32[T, 10, 5]
    for step in episodes.steps(): ...    # one dict per step
    for w in episodes.windows(8): ...    # 8-step windows inside episodes

Values and dtypes match what `tfds.as_numpy(builder.as_dataset(...))` gives:
float64 features hold float32 precision, uint64 is bitcast from int64, bool is
bool, text is `bytes` (an object array of `bytes` across steps).

Neither this module nor anything it imports loads TensorFlow or TFDS.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
from collections.abc import Container, Iterator, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import CorruptRecordError, DecodeError, MissingShardError, counted
from rlds_writer.read.decode import Decoder, drop_final_step
from rlds_writer.read.nest import flatten, map_tree, rows
from rlds_writer.read.splits import split_ranges
from rlds_writer.read.transitions import (
    episode_end,
    iter_transitions,
    qlearning_dataset,
    transition_batches,
)
from rlds_writer.store.dataset import Dataset, open_handle
from rlds_writer.store.features import end_reasons

_log = logging.getLogger(__name__)

__all__ = [
    "CorruptRecordError",
    "DatasetReader",
    "DecodeError",
    "Episodes",
    "open_dataset",
]

_INDEX_DIR = ".rlds_reader_index"
_ON_CORRUPT = ("raise", "skip")
_INDEX_CACHES = ("memory", "disk")
_FINAL_STEPS = ("keep", "drop")


def open_dataset(
    path: Dataset | str | os.PathLike,
    *,
    verify_checksums: bool = True,
    on_corrupt: str = "raise",
    index_cache: str = "memory",
    final_step: str = "keep",
    fields: Sequence[str] | None = None,
) -> DatasetReader:
    """Opens an RLDS dataset directory for reading, without TensorFlow.

    Args:
      path: the dataset directory (holding `dataset_info.json`): a local path,
        an object-storage URL (`s3://bucket/data`, `gs://...`, any fsspec
        protocol; read with range requests, never downloaded whole), or a
        `Dataset` already opened.
      verify_checksums: check every tfrecord record's data CRC before decoding
        (array_record always checks its own chunk hashes).
      on_corrupt: `"raise"` (default) raises `CorruptRecordError` naming the
        file and offset of a torn or corrupt record; `"skip"` logs a warning and
        skips it while iterating. Random access (`episodes[i]`) always raises.
      index_cache: `"memory"` keeps tfrecord offset indexes in memory;
        `"disk"` also saves them (with step counts) under
        `<path>/.rlds_reader_index/` and reuses them while the shard is unchanged.
      final_step: `"keep"` (default) gives episodes as stored; `"drop"` leaves
        out each episode's final RLDS step (`is_last`), which holds only the
        last observation and a zero action: for training on action targets
        (behaviour cloning, windows of steps). Episodes, steps, windows and
        the torch datasets all see the shorter episodes; transitions always
        use the final step, as the last `next_observation`.
      fields: decode only these fields (`"steps/observation"`,
        `"episode_metadata"`: a key selects the leaves below it); the others
        are left out of the episodes and never decoded. None: every field.

    Returns:
      A `DatasetReader`.

    Raises:
      NotADatasetError: `path` is not a dataset (a `FileNotFoundError`; the message
        says what is there instead, and lists the datasets below a directory of them).
      NotImplementedError: for features or file formats the reader cannot decode.
    """
    return DatasetReader(
        path,
        verify_checksums=verify_checksums,
        on_corrupt=on_corrupt,
        index_cache=index_cache,
        final_step=final_step,
        fields=fields,
    )


class DatasetReader:
    """An RLDS dataset directory, opened for reading.

    Select episodes with a TFDS split spec: `reader["train[:10%]"]` or
    `reader.episodes("train")` return an `Episodes` view. See `open_dataset`
    for the arguments.

    Attributes:
      dataset: the `store.dataset.Dataset` handle it reads.
      path: the directory.
      info: the parsed `dataset_info.json`.
      features: the parsed `features.json` (`store.features.features.Features`).
      metadata: the parsed `metadata.json`, or None.
      name: the dataset name.
      version: the dataset version.
      file_format: `"tfrecord"` or `"array_record"`.
    """

    def __init__(
        self,
        path: Dataset | str | os.PathLike,
        *,
        verify_checksums: bool = True,
        on_corrupt: str = "raise",
        index_cache: str = "memory",
        final_step: str = "keep",
        fields: Sequence[str] | None = None,
    ):
        if on_corrupt not in _ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {_ON_CORRUPT}, got {on_corrupt!r}")
        if index_cache not in _INDEX_CACHES:
            raise ValueError(f"index_cache must be one of {_INDEX_CACHES}, got {index_cache!r}")
        if final_step not in _FINAL_STEPS:
            raise ValueError(
                f"final_step must be one of {_FINAL_STEPS}, got {final_step!r}: 'drop' leaves "
                "out each episode's observation-only last step"
            )
        self.final_step = final_step
        self.dataset = open_handle(path)
        self.path = self.dataset.path
        self.info = self.dataset.info
        self.features = self.dataset.features
        self.metadata = self.dataset.metadata
        self.name = self.dataset.name
        self.version = self.dataset.version
        self.file_format = self.dataset.file_format
        self.verify_checksums = verify_checksums
        self.on_corrupt = on_corrupt
        # An index cache is a file beside the shards: local datasets only.
        self.index_cache = index_cache if self.dataset.is_local else "memory"
        self._decoder = Decoder(self.features, fields)
        self._split_lengths: dict[str, list[int]] = {
            split: list(listing.shard_lengths) for split, listing in self.dataset.splits.items()
        }
        self._shards: dict[tuple[str, int], Any] = {}

    def __repr__(self) -> str:
        splits = ", ".join(f"{k}={sum(v)}" for k, v in self._split_lengths.items())
        return f"DatasetReader({self.path!r}, {self.file_format}, episodes: {splits})"

    @property
    def splits(self) -> dict[str, int]:
        """Split name -> number of episodes (from `dataset_info.json`, no I/O)."""
        return {k: sum(v) for k, v in self._split_lengths.items()}

    def shard_lengths(self, split: str) -> list[int]:
        """Episodes per shard file of a split."""
        return list(self._split_lengths[split])

    def shard_path(self, split: str, index: int) -> str:
        """The path of shard `index` of `split`."""
        return self.dataset.shard_path(split, index)

    def _shard(self, split: str, index: int) -> Any:
        key = (split, index)
        shard = self._shards.get(key)
        if shard is None:
            path = self.shard_path(split, index)
            if not self.dataset.storage.exists(path):
                raise MissingShardError.listed(path, split, index, self.path)
            cache = None
            if self.index_cache == "disk":
                cache = os.path.join(self.path, _INDEX_DIR, os.path.basename(path) + ".npz")
            fmt = self.dataset.shard_format
            skip = self.on_corrupt == "skip"
            name = self.dataset.splits[split].shard_name(index)
            # Range reads, or, for a reader that opens paths, the local file (a cached
            # copy of a remote shard).
            opener = functools.partial(
                self.dataset.local_file if fmt.opens_paths else self.dataset.open_file, name
            )
            shard = fmt.open_reader(
                path, self._split_lengths[split][index], self.verify_checksums, cache, skip, opener
            )
            self._shards[key] = shard
        return shard

    def close(self) -> None:
        """Closes open files (the reader reopens them when used again)."""
        for shard in self._shards.values():
            shard.close()

    def __enter__(self) -> DatasetReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def episodes(self, split: str = "train") -> Episodes:
        """Returns the episodes selected by a TFDS split spec, e.g. `'train[:10%]'`."""
        if not isinstance(split, str):
            raise TypeError(
                f"a split spec is a str such as 'train' or 'train[:10]', got {split!r}; "
                "index the episodes instead: reader.episodes('train')[i]"
            )
        segments = []
        for name, start, stop in split_ranges(split, self._split_lengths):
            lengths = self._split_lengths[name]
            first = 0
            for shard, n in enumerate(lengths):
                a, b = max(start, first), min(stop, first + n)
                if a < b:
                    segments.append((name, shard, a - first, b - first))
                first += n
        return Episodes(self, segments, split)

    __getitem__ = episodes

    def __iter__(self) -> Iterator[Any]:
        # Without this, Python would iterate by calling __getitem__(0, 1, ...).
        raise TypeError(
            "a DatasetReader holds splits, not episodes: iterate reader.episodes('train') "
            f"(splits here: {sorted(self._split_lengths)})"
        )

    def num_episodes(self, split: str = "train") -> int:
        """Number of episodes in a split spec, from `dataset_info.json` alone."""
        return len(self.episodes(split))

    def num_steps(self, split: str = "train") -> int:
        """Number of steps in a split spec (reads the records, decodes nothing)."""
        return self.episodes(split).num_steps

    def decode(
        self, record: bytes, where: str = "<record>", encoded: Container[str] = ()
    ) -> dict[str, Any]:
        """Decodes one serialized episode with this dataset's features.

        `encoded` names `Image` step fields (`steps/observation/rgb`) to give
        as their stored PNG/JPEG bytes, checked but not decoded.
        """
        return self._decoder.decode(record, where, encoded=encoded)


class Episodes(Sequence):
    """A selection of episodes: random access, iteration, steps and windows.

    Get one with `DatasetReader.episodes(split)`. Indexing decodes one episode
    (`episodes[i]`, negative indices allowed); a slice returns a narrower
    `Episodes`. Iterating reads the shard files in order, which is faster than
    indexing and honours `on_corrupt="skip"`.
    """

    def __init__(self, reader: DatasetReader, segments: list[tuple[str, int, int, int]], spec: str):
        self.reader = reader
        self.segments = segments
        self.spec = spec
        self._cum = np.cumsum([0] + [b - a for _, _, a, b in segments]).tolist()
        self._lengths: np.ndarray | None = None

    def __repr__(self) -> str:
        return (
            f"Episodes({self.spec!r}, {counted(len(self), 'episode')}, "
            f"{counted(len(self.files()), 'file')})"
        )

    def __len__(self) -> int:
        return self._cum[-1]

    def _locate(self, i: int) -> tuple[str, int, int]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"episode index {i} out of range for {counted(n, 'episode')}")
        seg = bisect.bisect_right(self._cum, i) - 1
        split, shard, a, _ = self.segments[seg]
        return split, shard, a + i - self._cum[seg]

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return self._subset(range(len(self))[i])
        split, shard, local = self._locate(int(i))
        src = self.reader._shard(split, shard)
        data = src.read(local)
        return self._view(self.reader._decoder.decode(data, f"{src.path}, record {local}"))

    def _view(self, episode: dict[str, Any]) -> dict[str, Any]:
        """The episode as the reader's `final_step` option shows it."""
        if self.reader.final_step == "keep":
            return episode
        return drop_final_step(episode)

    def _subset(self, r: range) -> Episodes:
        if r.step != 1:
            raise ValueError("episode slices must have step 1")
        segments = []
        for seg, (split, shard, a, _b) in enumerate(self.segments):
            lo, hi = self._cum[seg], self._cum[seg + 1]
            s, e = max(r.start, lo), min(r.stop, hi)
            if s < e:
                segments.append((split, shard, a + s - lo, a + e - lo))
        return Episodes(self.reader, segments, f"{self.spec}[{r.start}:{r.stop}]")

    def files(self) -> list[Episodes]:
        """Splits the selection by shard file: one `Episodes` per file, in order."""
        out: dict[tuple[str, int], list] = {}
        for seg in self.segments:
            out.setdefault(seg[:2], []).append(seg)
        return [
            Episodes(self.reader, segs, f"{self.spec}:{k[0]}#{k[1]}") for k, segs in out.items()
        ]

    def partition(self, index: int, count: int) -> Episodes:
        """Returns part `index` of `count` disjoint parts covering the selection.

        Whole shard files are dealt out round-robin when there are at least
        `count` files; otherwise each file's episodes are cut into contiguous
        ranges so that every part still gets work.
        """
        if not 0 <= index < count:
            raise ValueError(f"part {index} out of range for {count} parts")
        files = self.files()
        if len(files) >= count:
            segments = [seg for f in files[index::count] for seg in f.segments]
            return Episodes(self.reader, segments, f"{self.spec}/part{index}of{count}")
        n = len(self)
        lo, hi = n * index // count, n * (index + 1) // count
        sub = self._subset(range(lo, hi))
        sub.spec = f"{self.spec}/part{index}of{count}"
        return sub

    def records(self) -> Iterator[tuple[str, bytes]]:
        """Yields (where, record bytes) in file order, reading each file sequentially."""
        skip = self.reader.on_corrupt == "skip"
        for split, shard, a, b in self.segments:
            src = self.reader._shard(split, shard)
            for i, data in src.iter(a, b, skip):
                yield f"{src.path}, record {i}", data

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for episode in self._full():
            yield self._view(episode)

    def _full(self) -> Iterator[dict[str, Any]]:
        """Episodes as stored, whatever `final_step` says (for transitions)."""
        decode = self.reader._decoder.decode
        for where, data in self.records():
            yield decode(data, where)

    def without_cut_short(self) -> Iterator[dict[str, Any]]:
        """Yields the episodes the env ended, leaving out those the recorder cut short.

        An episode is cut short when its `end_reason` field reads `cut_short`
        (a reset or close mid-episode, a refused value, interpreter exit).
        Datasets without the field (older ones, or TFDS-written) yield every
        episode: nothing on disk tells them apart.
        """
        for episode in self:
            if episode_end(episode) != end_reasons.CUT_SHORT:
                yield episode

    def episode_lengths(self) -> np.ndarray:
        """Number of steps of each episode (reads records once, decodes no values).

        Cached per shard file (and on disk with `index_cache="disk"`). With
        `on_corrupt="skip"`, a corrupt episode counts 0 steps.
        """
        if self._lengths is not None:
            return self._lengths
        decoder = self.reader._decoder
        skip = self.reader.on_corrupt == "skip"
        parts = []
        for split, shard, a, b in self.segments:
            src = self.reader._shard(split, shard)
            steps = src.cached_steps
            if steps is None or np.any(steps[a:b] < 0):
                steps = np.full(src.num_records, -1, np.int64) if steps is None else steps.copy()
                for i, data in src.iter(a, b, skip):
                    steps[i] = decoder.num_steps(data)
                if skip:  # a skipped episode has no steps to offer (and no windows)
                    lengths = steps[a:b]
                    lengths[lengths < 0] = 0
                src.store_steps(steps)
            parts.append(steps[a:b])
        lengths = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if self.reader.final_step == "drop":
            lengths = np.maximum(lengths - 1, 0)
        self._lengths = lengths
        return self._lengths

    @property
    def num_steps(self) -> int:
        """Total number of steps in the selection."""
        return int(self.episode_lengths().sum())

    def steps(self) -> Iterator[dict[str, Any]]:
        """Yields every step of every episode, as nested dicts of numpy values.

        Episode-level fields are not included; iterate episodes for those.
        """
        for episode in self:
            yield from rows(episode.get("steps", {}))

    def transitions(self, *, cut_short: str = "truncated") -> Iterator[dict[str, Any]]:
        """Yields `(observation, action, reward, next_observation, terminated, truncated, ...)`.

        One dict per transition, never across episodes; see
        `rlds_writer.read.transitions` for the rules and `cut_short` ("truncated"/"drop").
        """
        return iter_transitions(self._full(), cut_short=cut_short)

    def transition_batches(self, *, cut_short: str = "truncated") -> Iterator[dict[str, Any]]:
        """Yields the transitions of each episode as one dict of arrays (see `transitions`)."""
        return transition_batches(self._full(), cut_short=cut_short)

    def qlearning_dataset(self, *, cut_short: str = "truncated", **kwargs: Any) -> dict[str, Any]:
        """All transitions as D4RL-style arrays (`observations`, `actions`, `terminals`, ...)."""
        return qlearning_dataset(self._full(), cut_short=cut_short, **kwargs)

    def windows(self, size: int, stride: int = 1) -> Iterator[dict[str, Any]]:
        """Yields `size`-step windows of `steps` that never cross an episode boundary.

        Args:
          size: steps per window.
          stride: steps between the starts of consecutive windows.

        Yields:
          Nested dicts of arrays with a leading axis of length `size` (views
          into the decoded episode). Episodes shorter than `size` yield none.
        """
        if size < 1 or stride < 1:
            raise ValueError(f"size and stride must be >= 1, got {size}, {stride}")
        for episode in self:
            steps = episode.get("steps", {})
            flat = flatten(steps)
            if not flat:
                continue
            n = len(flat[0][1])
            for start in range(0, n - size + 1, stride):
                yield map_tree(lambda col, s=start: col[s : s + size], steps)

    def window_index(self, size: int, stride: int = 1) -> np.ndarray:
        """Returns an (N, 2) array of (episode, start step) for every window."""
        lengths = self.episode_lengths()
        counts = np.maximum(0, (lengths - size) // stride + 1)
        episode = np.repeat(np.arange(len(lengths)), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        start = (np.arange(counts.sum()) - first) * stride
        return np.stack([episode, start], axis=1).astype(np.int64)
