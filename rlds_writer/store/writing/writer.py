"""`DatasetWriter`: finished episodes in, TFDS shards and dataset_info.json out.

The recorder hands finished `Episode`s to `write`. Short episodes are written
by the calling thread when the writer thread is idle; others go through a
queue bounded in count and bytes to one background thread. Each record is
encoded, appended to the open shard of its split and handed to the OS at once
(per-episode durability). Every `commit_interval` seconds (and at `flush` and
`close`) the open shards are closed and `dataset_info.json` lists them
(`split_shards.py`); commits follow the clock, not rotations, so their cost
per episode stays flat however many shards there are. The env loop
only waits when the queue is full. A batch recorder's ring-held batches take
the batch lane instead (`write_deferred`, `batch_lane.py`): no wake-up per
hand-over, the writer thread taking them all on its own clock. An error in
the thread is raised to the caller at the next call and at `close()`; it is
never swallowed.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import ForkedRecorderError, WriterClosedError, WriterFailedError
from rlds_writer.store.dataset import json_values, layout
from rlds_writer.store.dataset.locking import DirectoryLock
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.episodes.episode_data import Episode
from rlds_writer.store.features import field_specs
from rlds_writer.store.formats import shards
from rlds_writer.store.storage.object_path import as_path
from rlds_writer.store.writing import batch_lane, dataset_setup, encoding, exit_close
from rlds_writer.store.writing.batch_lane import LANE, WAKE, BatchLane, LaneWriting
from rlds_writer.store.writing.batch_records import BatchRecordEncoder, EpisodeBatch, supports
from rlds_writer.store.writing.exit_close import process_id
from rlds_writer.store.writing.failure_text import failure_text
from rlds_writer.store.writing.queue_items import CLOSE, FLUSH, STOP, in_runs, take_unheld
from rlds_writer.store.writing.split_shards import SplitShards

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)

# The default shard format is loaded with the writer's module, as envlogger's
# Riegeli is with `import envlogger`: a first recording does not pay the import.
shards.adapter(layout.DEFAULT_FILE_FORMAT)

# Seconds the writer thread waits for more episodes after draining its queue.
_BATCH_DELAY = 0.005
# Only after episodes smaller than this: large ones keep the writer busy anyway.
_BATCH_BELOW = 1 << 20
# Episodes smaller than this are written by the caller when the writer is idle.
_INLINE_BELOW = 256 << 10


class DatasetWriter(LaneWriting):
    """Writes finished episodes into an RLDS dataset in TFDS format.

    Args:
      data_directory: the dataset directory (local, or an fsspec URL such as `s3://...`).
        Created if missing.
      ds_config: a `tfds.rlds.rlds_base.DatasetConfig` describing the features
        (or `record.config.RecordingConfig`: the same fields, without TFDS).
      name: dataset name used in shard file names; defaults to `ds_config.name`.
      version: dataset version, `MAJOR.MINOR.PATCH`.
      split: the default split for `write`.
      max_episodes_per_file: episodes per shard before rotating to a new file.
      file_format: `tfrecord` or `array_record`.
      mode: what to do if the directory already holds a dataset: `error`
        (default), `append` (recover, then continue the shard sequence) or
        `overwrite` (delete its files first).
      metadata: dataset-level metadata for `metadata.json` (made JSON-safe).
        None writes no `metadata.json`.
      fsync: `fsync` shard files at each episode and `dataset_info.json` at each
        commit, for power-loss durability (costs one disk sync per episode).
      queue_size: finished episodes that may wait for the writer thread before
        `write` blocks (backpressure).
      max_queue_bytes: the same bound in bytes of episode data; `write`
        blocks while more than this waits (one episode always fits).
      commit_interval: seconds between commits while episodes arrive: readers
        see episodes at most this old; each commit closes the open shards, so
        a shard also holds at most this many seconds of recording.
      image_workers: processes that encode PNG/JPEG frames in parallel
        (threads where processes cannot run); 0 encodes on the writer thread.

    Raises:
      SpecError: `version` is not MAJOR.MINOR.PATCH, or a feature cannot be written.
      DatasetExistsError: the directory holds a dataset and mode is `error`.
      IncompatibleDatasetError: mode is `append` and the existing dataset has
        other features, another name or another file format.
      LockedError: another live writer holds the directory.
    """

    def __init__(
        self,
        data_directory: epath.PathLike,
        ds_config: Any,
        *,
        name: str | None = None,
        version: str = "0.0.1",
        split: str = "train",
        max_episodes_per_file: int = 1000,
        file_format: str = layout.DEFAULT_FILE_FORMAT,
        mode: str = "error",
        metadata: Mapping[str, Any] | None = None,
        fsync: bool = False,
        queue_size: int = 64,
        max_queue_bytes: int = 64 << 20,
        commit_interval: float = 10.0,
        image_workers: int = 2,
    ):
        # Loaded now, not at the first episode: a format that cannot load fails here,
        # and the first episode's end does not pay the import.
        shards.adapter(file_format)
        if max_episodes_per_file < 1:
            raise ValueError(f"max_episodes_per_file must be >= 1, got {max_episodes_per_file}")
        self.path = as_path(data_directory)
        self.name = name or getattr(ds_config, "name", None) or "rlds_dataset"
        self.version = version
        self.default_split = split
        self.file_format = file_format
        self.max_episodes_per_file = max_episodes_per_file
        self.fsync = fsync
        self.commit_interval = commit_interval
        self._metadata = json_values.jsonable(dict(metadata)) if metadata is not None else None

        self.info = dataset_setup.describe_dataset(
            ds_config, self.name, version, self.path, self._metadata, file_format
        )
        self.features = self.info.features
        self.image_workers = image_workers
        self.encoder = encoding.EpisodeEncoder(self.features, image_workers=image_workers)
        # Many episodes encoded together (`write(EpisodeBatch)`), where every field allows.
        self.batch_encoder = (
            BatchRecordEncoder(self.encoder.fields) if supports(self.encoder.fields) else None
        )
        field_specs.warn_float64(self.encoder.fields)
        self.queue_size = max(1, queue_size)
        self.max_queue_bytes = max_queue_bytes

        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = DirectoryLock(self.path)
        self._lock.acquire()
        try:
            prepared = dataset_setup.prepare_directory(
                self.path,
                self.info,
                mode=mode,
                name=self.name,
                file_format=file_format,
                split=split,
                metadata=self._metadata,
            )
            self._metadata = prepared.metadata
            self._shards = SplitShards(
                self.path, self.name, file_format, fsync, max_episodes_per_file, prepared
            )
        except BaseException:
            self._lock.release()
            self.encoder.close()
            raise

        self._pid = process_id()  # a forked child never writes through our files (`_check`)
        self.episodes_written = 0
        self.steps_written = 0
        self.bytes_written = 0
        self._error: BaseException | None = None
        self._dropped = 0  # episodes handed over after a failure, never written
        self._closed = False
        # Unbounded queue; episodes are admitted against a count and byte budget
        # so that small episodes never make the env thread wait on the writer.
        self._queue: queue.Queue = queue.Queue()
        self._budget = threading.Condition()
        self._queued_count = 0
        self._queued_bytes = 0
        self._waiting: Episode | None = None  # an episode `write` is holding until admitted
        # Ring-held batches of a batch recorder (`write_deferred`).
        self.lane = BatchLane(self._queue, wake_bytes=max(1, max_queue_bytes // 4))
        self._lane_waits = False  # `write_deferred` waits for the lane's bytes to drop
        # Held by whichever thread touches the shards (the writer thread, or the
        # caller writing a small episode inline); fsync'ing writers never write
        # inline, so the env loop never waits on the disk.
        self._io_lock = threading.Lock()
        self._inline = not fsync
        self._last_commit = time.monotonic()
        self._dirty = False
        self._thread = threading.Thread(
            target=self._run, name=f"rlds_writer[{self.path.name}]", daemon=True
        )
        self._thread.start()
        exit_close.close_writer_at_exit(self)

    # ---------------------------------------------------------------- public

    @interrupts.held
    def write(self, episode: Episode, split: str | None = None) -> None:
        """Queues a finished episode; blocks only while the queue is full.

        Raises:
          WriterFailedError: if the writer thread failed earlier.
          WriterClosedError: if the writer is closed.
        """
        if self._error is not None or self._closed or self._pid != process_id():
            self._check()
        split = split or self.default_split
        size = episode.nbytes
        # `not queue.queue` reads the deque without the queue's lock (`empty()`
        # takes it); under the GIL the read is whole, and it is repeated below.
        if (
            self._inline
            and size < _INLINE_BELOW
            # A batch of episodes goes to the writer thread: one hand-over per
            # vector step, and its encoding then overlaps the env's next steps.
            and type(episode) is not EpisodeBatch
            and not self._queue.queue
            and self.lane.idle
            and self._shards.room_inline(split)
            and self._io_lock.acquire(blocking=False)
        ):
            # The writer thread is idle and the episode is small: writing it
            # here costs less than handing it over (the two threads would trade
            # the GIL for every short episode). Order is kept: nothing is queued.
            # Never a request to an object store here (`room_inline`): a shard
            # that fills is uploaded by the writer thread.
            try:
                if not self._queue.queue and self.lane.idle and self._shards.room_inline(split):
                    self._write_inline(split, episode)
                    return
            finally:
                self._io_lock.release()
        self.lane.move_to()  # batches handed over before it go first
        with self._budget:
            # Seen by the writer thread, which starts on its frames early.
            self._waiting = episode
            try:
                while self._queued_count and (
                    self._queued_count >= self.queue_size
                    or self._queued_bytes + size > self.max_queue_bytes
                ):
                    self._budget.wait(0.2)
                    self._check()
                self._queued_count += 1
                self._queued_bytes += size
                self._queue.put((split, episode))
            finally:
                self._waiting = None

    def _write_inline(self, split: str, episode: Episode) -> None:
        try:
            self._write_episode(split, episode, commit=False)
        except BaseException as e:
            _log.error("rlds_writer failed writing %s: %r", self.path, e)
            self._error = e
            self._check()

    def _admitted_done(self, episodes: list[Any]) -> None:
        with self._budget:
            self._queued_count -= len(episodes)
            self._queued_bytes -= sum(episode.nbytes for episode in episodes)
            self._budget.notify_all()

    @interrupts.held
    def flush(self) -> None:
        """Blocks until every queued episode is written and handed to the OS,
        and `dataset_info.json` lists it.

        Raises:
          WriterFailedError: if the writer thread failed.
        """
        self._check()
        done = threading.Event()
        self.lane.move_to()  # (the writer thread is woken at once: not on the lane's clock)
        self._queue.put((FLUSH, done))
        while not done.wait(0.2):
            if not self._thread.is_alive():
                break
        self._check()

    def close(self) -> None:
        """Writes everything queued, closes the shards, commits and unlocks.

        Idempotent. Raises the writer thread's error if it failed.
        """
        if self._closed:
            return
        with interrupts.deferred(f"closing {self.path}"):
            self._close()

    def _close(self) -> None:
        self._closed = True
        exit_close.closed(self)
        if self._pid != process_id():
            return  # a forked child's copy: the files, lock and processes are the parent's
        if self._thread.is_alive():
            with self._io_lock, self.lane.lock:  # in that order (`BatchLane.lock`)
                with self._budget, self._queue.mutex:  # (a `write` waiting holds one too)
                    held = self._queued_count + (self._waiting is not None)
                    taken = take_unheld(self._queue.queue, held, self.lane)
                if taken is not None:  # written here while the thread ends
                    self._queue.put((STOP, None))
                    for item in in_runs(taken):
                        self._process(item)
                    self._end()
            if taken is None:
                self.lane.move_to()
                self._queue.put((CLOSE, None))  # the join below waits for it
            self._thread.join()
        self.encoder.close()
        self._lock.release()  # never raises: the error below is the one that matters
        if self._error is not None:
            raise WriterFailedError(self._failure()) from self._error

    def _failure(self) -> str:
        """What `close()` says after a failure: what is saved, what is not, and where."""
        return failure_text(self.path, self._error, self._dropped, self._shards)

    @property
    def metadata(self) -> dict[str, Any]:
        """The dataset-level metadata (`metadata.json`), with earlier runs' keys on append."""
        return dict(self._metadata or {})

    def set_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replaces `metadata.json` (atomically) with JSON-safe `metadata`."""
        if self._pid != process_id():
            self._check()
        self._metadata = json_values.jsonable(dict(metadata))
        self._shards.write_metadata(self._metadata)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def splits(self) -> dict[str, tuple[list[int], int]]:
        """Split name -> (shard lengths, bytes) as last committed or in progress."""
        return self._shards.listing()

    # ---------------------------------------------------------------- thread

    def _check(self) -> None:
        if self._pid != process_id():
            raise ForkedRecorderError(exit_close.forked_message(self.path, self._pid))
        if self._error is not None:
            raise WriterFailedError(
                f"the writer thread of {self.path} failed: {self._error!r}"
            ) from self._error
        if self._closed:
            raise WriterClosedError(f"the writer of {self.path} is closed")

    def _run(self) -> None:
        lane, clock = self.lane, False  # clock: the lane's batches came since the last wake-up
        while True:
            timeout = batch_lane.INTERVAL
            if not clock:
                lane.sleeping = True  # a batch handed over from now on wakes this thread
                since = time.monotonic() - self._last_commit
                timeout = 0 if lane.pending else max(0.05, self.commit_interval - since)
            try:
                item = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
            except queue.Empty:
                item = None
            lane.sleeping = False
            if item is None or item[0] is WAKE:
                # The lane's batches, all at once (one wake-up for many vector steps).
                with self._io_lock:
                    taken = lane.take()
                    clock = bool(taken)
                    if taken:
                        self._write_lane(taken)
                    elif item is None and self._dirty:
                        self._guarded(self._commit)
                continue
            if item[0] is STOP:
                return
            size = item[1].nbytes if type(item[0]) is str else 0
            with self._io_lock:
                if type(item[1]) is EpisodeBatch:
                    item = (item[0], self._batches(*item))
                done = self._process(item)
            if done:
                return
            if self._queue.empty() and 0 < size < _BATCH_BELOW:
                # Let the next short episodes gather: one wake-up per batch
                # instead of one per episode keeps the env thread and this one
                # from trading the GIL back and forth.
                time.sleep(_BATCH_DELAY)

    def _process(self, item: tuple[str, Any]) -> bool:
        """Handles one queued item (holding the I/O lock); True ends the thread."""
        kind, payload = item
        if kind is LANE:
            self._write_lane(payload)
            return False
        if kind == CLOSE:
            self._end()
            return True
        if kind == FLUSH:
            self._guarded(self._commit)
            payload.set()
            return False
        if self._error is None:
            self._guarded(functools.partial(self._write_episode, kind, payload))
        else:
            self._keep_episode(kind, payload)
        self._admitted_done(payload if type(payload) is list else [payload])
        return False

    def _guarded(self, fn: Any) -> None:
        if self._error is not None:
            return
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            _log.error("rlds_writer thread for %s failed: %r", self.path, e)
            self._error = e

    def _upcoming_columns(self) -> dict[str, Any] | None:
        """The columns of the episode that will be written next, if it is already finished."""
        with self._queue.mutex:
            queued = (p for kind, p in self._queue.queue if type(kind) is str)
            upcoming = next(queued, self._waiting)
        # A batch has no frames to start on (its columns would only be cut early).
        return None if upcoming is None or type(upcoming) is EpisodeBatch else upcoming.columns

    def _write_episode(self, split: str, episode: Any, commit: bool = True) -> None:
        if type(episode) is list:  # of `EpisodeBatch`es
            self._write_batches(split, episode, commit)
            return
        parts, length = self.encoder.encode_parts(
            episode.columns,
            episode.episode_values,
            upcoming=self._upcoming_columns,
        )
        self._shards.append(split, parts, length)
        del parts
        episode.release()
        self.episodes_written += 1
        self.steps_written += episode.num_steps
        self.bytes_written += length
        self._dirty = True
        self._shards.rotate_if_full(split)
        # Commits follow the clock, not rotations: their cost (O(shards) of JSON)
        # stays flat per episode however small the shards are. An episode written
        # inline leaves the commit to the writer thread, which wakes for it on
        # the same clock: the env thread never writes dataset_info.json.
        if commit and time.monotonic() - self._last_commit >= self.commit_interval:
            self._commit()

    def _keep_episode(self, split: str, episode: Episode | list[EpisodeBatch]) -> None:
        """An episode (or batches of them) handed over before a failure and queued:
        written to the open shard of an object store's dataset (a local file, kept
        with the others at close), never rotated nor committed; dropped elsewhere
        (counted)."""
        batch = type(episode) is list
        count = sum(b.count for b in episode) if batch else 1
        if not self._shards.remote:
            self._dropped += count
            return
        try:
            if batch:
                batch_lane.keep_batches(self.batch_encoder, self._shards, split, episode)
            else:
                parts, length = self.encoder.encode_parts(episode.columns, episode.episode_values)
                self._shards.append(split, parts, length)
                episode.release()
            self.episodes_written += count
        except Exception as e:  # noqa: BLE001 - the first error is the one raised
            what = "episodes" if batch else "an episode"
            _log.error("could not keep %s of %s after the failure: %r", what, self.path, e)
            self._dropped += count

    def _end(self) -> None:
        """Closes the shards and makes the last commit (holding the I/O lock)."""
        if self._error is not None:
            self._shards.close_after_failure()
        self._guarded(self._finish)

    def _finish(self) -> None:
        self._shards.finish()
        self._committed()

    def _commit(self) -> None:
        self._shards.commit()
        self._committed()

    def _committed(self) -> None:
        self._last_commit = time.monotonic()
        self._dirty = False
