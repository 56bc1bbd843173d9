"""Camera frames of a batch encoded as they come: N frames per step, in parallel.

A batched env returns one frame per sub-env per step. Kept raw in the time
ring (`ring.py`) until their episode ends, 64 sub-envs of 84x84 RGB frames
take 1.3 MB per step, and the encoding starts only when an episode is over.
Here each PNG/JPEG observation field's frames are copied out of the batch
once per step (one numpy copy of the rows recorded) and handed, in a few
slices, to the process's encoding threads (`store.images.frame_stream`, the
single-env recorder's own): each thread calls the codec once per frame, with
no other Python per frame. The ring keeps, per sub-env and step, only where
that frame's bytes will be: the slice (an object column) and the frame's
place in it (an int64 column). When an episode ends its frames are an
`EncodedFrames`, which the writer's encoder takes as it takes the single-env
recorder's: the same codecs, so the same bytes.

Raw frames are held only until encoded: the env thread waits when the
frames handed over and not yet encoded pass `PENDING_BYTES`.

Raw-bytes frames (`image_encoding="bytes"`, rows of at least
`ring.LARGE_ROWS` bytes) need no codec: their one copy at the step is into
their sub-env's framed chunk (`frame_chunks.py`, one C call per field per
step), and the ring keeps the chunk and the frame's place in it. When an
episode ends its frames are the chunks' framed runs, which the writer hashes
and writes as they are (no join, no other copy): the single-env recorder's
parts, so the same records.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from rlds_writer.record.batch.frame_chunks import FrameChunks
from rlds_writer.record.batch.ring import LARGE_ROWS, OBSERVATION_LIKE, BatchField
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.features import field_specs
from rlds_writer.store.features.field_specs import jpeg_quality_of
from rlds_writer.store.images import frame_stream
from rlds_writer.store.images.image_codecs import encode_jpeg, encode_png

# The key suffix of a streamed field's second ring column (a frame's place in its slice).
POSITION = "\x00position"
# Raw frames handed to the threads and not yet encoded, at most (then the env waits).
PENDING_BYTES = 16 << 20


class _HandleSpec:
    """What the ring needs of a field spec, for a column of frame handles."""

    __slots__ = ("key", "shape", "dtype", "row_nbytes")

    def __init__(self, key: str, dtype: Any, row_nbytes: int):
        self.key = key
        self.shape = ()
        self.dtype = np.dtype(dtype)
        # The raw frame's size: the ring keeps as many rows as it did for raw
        # frames, so the encoded frames its rows still point to stay bounded.
        self.row_nbytes = row_nbytes


class _Codec:
    """Encodes one frame (a view of a slice's rows) with the single-env encoder's codec."""

    __slots__ = ("encode",)

    def __init__(self, spec: field_specs.FieldSpec):
        if spec.kind == field_specs.JPEG:
            quality = jpeg_quality_of(spec.feature)
            self.encode = lambda frame: encode_jpeg(frame, quality)
        else:
            self.encode = encode_png


def streamable(spec: field_specs.FieldSpec, role: str, threads: int = 1) -> bool:
    """Whether the batch recorder encodes this field's frames as they come: PNG/JPEG
    where there are encoding `threads`, large raw-bytes rows always (no codec)."""
    if role != OBSERVATION_LIKE or None in spec.shape or spec.dtype is None:
        return False
    if spec.kind == field_specs.BYTES:
        return spec.row_nbytes >= LARGE_ROWS
    return threads > 0 and spec.kind in (field_specs.PNG, field_specs.JPEG)


class BatchFrames:
    """The streamed image fields of a batch recorder.

    Args:
      specs: the streamed fields (`streamable`).
      threads: encoding threads (the recording's `image_workers`).
    """

    def __init__(self, specs: list[field_specs.FieldSpec], threads: int, num_envs: int):
        self.specs = {s.key: s for s in specs}
        # Raw-bytes fields (no codec): their frames in each sub-env's framed chunks.
        self.copied = {
            s.key: FrameChunks(s, num_envs) for s in specs if s.kind == field_specs.BYTES
        }
        self.codecs = {s.key: _Codec(s) for s in specs if s.key not in self.copied}
        self.threads = max(1, threads)
        self._pending: collections.deque[tuple[frame_stream._Batch, int]] = collections.deque()
        self._pending_bytes = 0
        # The last whole step added (its batch and handles), and which of its
        # rows `replace` took out of the ring: same-step autoreset's next first
        # observations, which `begin` then takes as they are, not encoded twice.
        self._last: dict[str, tuple[Any, np.ndarray, np.ndarray]] = {}
        self._moved = {s.key: np.zeros(num_envs, np.bool_) for s in specs}

    def ring_fields(self, field: BatchField) -> list[BatchField]:
        """The two ring columns that stand for a streamed field's frames."""
        nbytes = field.spec.row_nbytes
        place = np.int64 if field.key in self.copied else np.int32
        return [
            BatchField(_HandleSpec(field.key, object, nbytes), field.role),  # type: ignore[arg-type]
            BatchField(_HandleSpec(field.key + POSITION, place, 0), field.role),  # type: ignore[arg-type]
        ]

    def encode(
        self,
        values: dict[str, Any],
        rows: np.ndarray | None,
        n: int,
        *,
        added: bool = False,
        begun: bool = False,
        ids: np.ndarray | None = None,
    ) -> None:
        """Replaces each streamed field's batch in `values` by its frames' handles.

        Args:
          values: field key -> checked batch of `n` rows (`StepInputs.values`).
          rows: the rows whose frames are recorded (None: all); the others get
            no handle (their row of the ring is never read).
          n: the batch's rows.
          added: a whole step `add`ed (row `i` is sub-env `i`): kept for `begin`.
          begun: episodes begun by `begin` of a whole batch: rows of the step
            just added that `replace` took out of the ring are taken as they are.
          ids: the sub-env of each batch row (None: row `i` is sub-env `i`).
        """
        for key, spec in self.specs.items():
            batch = values.get(key)
            if batch is None:
                continue
            slices = np.empty(n, object)
            places = np.zeros(n, np.int64 if key in self.copied else np.int32)
            todo = rows
            if begun and rows is not None and key in self._last:
                todo = self._take_moved(key, batch, rows, slices, places)
            if todo is not None and len(todo) == n:
                todo = None  # every row: a slice copies faster than an index
            if key in self.copied:
                if todo is None:
                    envs = np.arange(n) if ids is None else ids
                    slices[:], places[:] = self.copied[key].copy(batch, None, envs)
                elif len(todo):
                    envs = todo if ids is None else ids[todo]
                    slices[todo], places[todo] = self.copied[key].copy(batch, todo, envs)
            # The one copy of the frames (the env may reuse its buffers): an
            # index copies, and a cast of another dtype does.
            elif todo is None:
                frames = np.array(batch, spec.dtype, copy=True, order="C")
                self._submit(key, frames, np.arange(n), slices, places)
            else:
                frames = np.ascontiguousarray(batch[todo], spec.dtype)
                if len(frames):
                    self._submit(key, frames, todo, slices, places)
            values[key] = slices
            values[key + POSITION] = places
            if added:
                self._last[key] = (batch, slices, places)
                self._moved[key][:] = False

    def moved(self, key: str, i: int) -> None:
        """`replace` takes sub-env `i`'s frame of the step just added out of the ring."""
        self._moved[key][i] = True

    def _take_moved(
        self, key: str, batch: Any, rows: np.ndarray, slices: np.ndarray, places: np.ndarray
    ) -> np.ndarray:
        """Gives `rows` the handles of the frames `replace` took out of the ring, where
        `batch` is the very array of the last step added; returns the rows left to encode."""
        last, last_slices, last_places = self._last[key]
        if last is not batch:
            return rows
        moved = self._moved[key]
        if key in self.copied:  # a chunk's places are never 0 (its number is at least 1)
            take = moved[rows] & (last_places[rows] != 0)
        else:
            take = moved[rows] & np.not_equal(last_slices[rows], None)
        if not take.any():
            return rows
        reused = rows[take]
        slices[reused] = last_slices[reused]
        places[reused] = last_places[reused]
        moved[reused] = False  # each frame enters one episode
        return rows[~take]

    def encode_one(self, key: str, frame: np.ndarray, i: int) -> tuple[Any, int]:
        """Hands one frame (sub-env `i`'s final observation) to the threads (a
        raw-bytes frame: copies it into the sub-env's chunk); returns its handle
        and place."""
        if key in self.copied:
            handles, places = self.copied[key].copy(frame[None], None, np.array([i], np.int64))
            return handles[0], int(places[0])
        frames = np.array(frame[None], self.specs[key].dtype, copy=True, order="C")
        slices = np.empty(1, object)
        self._submit(key, frames, np.zeros(1, np.int64), slices, np.zeros(1, np.int32))
        return slices[0], 0

    def _submit(
        self,
        key: str,
        frames: np.ndarray,
        where: np.ndarray,
        slices: np.ndarray,
        places: np.ndarray,
    ) -> None:
        count = len(frames)
        # Two slices per thread: they finish closer together than one each.
        size = max(frame_stream.BATCH_FRAMES, -(-count // (2 * self.threads)))
        codec = self.codecs[key]
        for lo in range(0, count, size):
            hi = min(count, lo + size)
            job = frame_stream.submit_frames(codec, frames[lo:hi], self.threads)
            slices[where[lo:hi]] = job
            places[where[lo:hi]] = np.arange(hi - lo, dtype=np.int32)
            nbytes = frames[lo:hi].nbytes
            self._pending.append((job, nbytes))
            self._pending_bytes += nbytes
        self._bound()

    def _bound(self) -> None:
        """Forgets encoded slices; waits while the raw frames not yet encoded are too many."""
        pending = self._pending
        while pending and (pending[0][0].done.is_set() or self._pending_bytes > PENDING_BYTES):
            job, nbytes = pending.popleft()
            if not job.done.is_set():
                with interrupts.deferred():  # as `FrameStream.put`: keep the event's lock whole
                    job.done.wait()
            self._pending_bytes -= nbytes

    def episode_columns(self, columns: dict[str, Any]) -> None:
        """Turns one episode's gathered frame handles into `EncodedFrames`, in place."""
        for key, spec in self.specs.items():
            if key in self.copied:  # the frames' framed runs: written as they are
                places = columns.pop(key + POSITION)
                columns[key] = self.copied[key].rows(columns[key], places)
                continue
            places = columns.pop(key + POSITION).tolist()
            entries = list(zip(columns[key].tolist(), places))
            columns[key] = _TakenFrames(key, entries, spec.row_nbytes)


class _TakenFrames(frame_stream.EncodedFrames):
    """An episode's frames, let go by their slices once the writer has them.

    A slice holds frames of several sub-envs, whose episodes end at different
    steps: without this, one long episode would keep its slices' other frames
    (and, through stale ring rows, others) in memory. Each frame belongs to
    one episode only, so it is dropped from its slice when taken, and the
    episode keeps its list in case it is asked again.
    """

    __slots__ = ("_taken",)

    def __init__(self, key: str, entries: list[Any], row_nbytes: int):
        super().__init__(key, entries, row_nbytes)
        self._taken: list[bytes] | None = None

    def result(self, encode_other: Any) -> list[bytes]:
        if self._taken is None:
            self._taken = super().result(encode_other)
            for batch, i in self._entries:
                batch.results[i] = None
        return self._taken
