"""Encodes finished episodes into `tf.train.Example` wire bytes.

`EpisodeEncoder` takes an episode's columns field by field (`store.features.field_specs`):
common kinds are written straight to protobuf wire format
(`store.features.field_encoding`), PNG and JPEG frames are encoded in worker processes
(`store.images.image_processes`) or threads, and every other kind goes through
TFDS's own `encode_example` and `ExampleSerializer` (`fallback_encoding`); the parts are joined into
one `Example`. All of it decodes, through TFDS, to the values TFDS's own
encoder would have produced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer import errors
from rlds_writer.store.episodes.episode_data import ChunkedRows
from rlds_writer.store.features.field_encoding import (
    bytes_list_of_entries,
    bytes_list_parts,
    entry_writer,
    map_entry_header,
)
from rlds_writer.store.features.field_specs import (
    FALLBACK,
    JPEG,
    PNG,
    FieldSpec,
    compile_fields,
    empty_dict_paths,
    jpeg_quality_of,
    shape_fits,
)
from rlds_writer.store.features.wire import varint as _varint
from rlds_writer.store.images.frame_stream import EncodedFrames
from rlds_writer.store.images.image_codecs import (
    JpegFrames,
    encode_jpeg,
    encode_png,
    yield_cpu_to_caller,
)
from rlds_writer.store.writing.fallback_encoding import encode_fallback

if TYPE_CHECKING:
    from rlds_writer.store.images import image_processes

_log = logging.getLogger(__name__)

# Seconds of image encoding the writer must have fallen behind by (episodes
# waiting while it encodes, priced at the measured cost per frame) before the
# worker processes start: about what starting them costs. A recording that
# keeps up on the threads, or ends first, never pays for them.
START_WORKERS_BEHIND_SECONDS = 0.5
# ... and the CPU one frame costs here, at least: handing a frame to a process
# costs about 0.2 ms of CPU (shared memory, sockets, the worker's wake-ups),
# so 256x256 JPEG frames (~0.25 ms) stay cheapest on the threads, while PNG
# frames of that size (several ms) pay for it (benchmarks/REPORT.md).
START_WORKERS_FRAME_SECONDS = 1e-3
# Frames encoded in this process go to the encoding threads from this many per
# field and episode, of at least this many bytes each: the codecs release the
# GIL for the pixel work (Pillow's JPEG into a file descriptor, zlib), so two
# threads encode 256x256 camera frames faster than one for the same CPU. Small
# frames (84x84) are mostly GIL-held numpy and Pillow set-up: threads only add
# CPU there (+3-8% measured on PNG 84x84), as do hand-overs of a few frames.
THREADS_MIN_FRAMES = 8
THREADS_MIN_FRAME_BYTES = 64 << 10


class EpisodeEncoder:
    """Turns finished episodes into serialized `tf.train.Example` bytes.

    PNG/JPEG frames are encoded in this process, on the `image_workers`
    encoding threads (the codecs release the GIL for the pixel work; small
    frames and episodes of few frames stay on the calling thread, see
    `THREADS_MIN_FRAMES`), until the writer falls behind by more image work than
    starting worker processes costs (`START_WORKERS_BEHIND_SECONDS`), with
    frames costly enough that handing them over pays
    (`START_WORKERS_FRAME_SECONDS`); then up to
    `image_workers` processes start, in the background, and encode from the
    first episode after they are up.

    Args:
      features: the dataset's `tfds.features.FeaturesDict` (RLDS layout).
      image_workers: PNG/JPEG frames are encoded in this many threads, and
        in this many processes (on Linux) when the threads fall behind on
        costly frames; other TFDS-encoded fields in this many threads; 0
        encodes everything on the calling thread.
      start_workers_behind: seconds of image work the writer must be behind
        before the processes start (default `START_WORKERS_BEHIND_SECONDS`,
        read when the encoder is made); 0 uses them from the first image
        episode on.
    """

    def __init__(
        self, features: Any, image_workers: int = 0, start_workers_behind: float | None = None
    ):
        self.features = features
        self.fields = compile_fields(features)
        self.empty_dicts = empty_dict_paths(features)
        self.step_fields = [f for f in self.fields if f.in_steps]
        self.episode_fields = [f for f in self.fields if not f.in_steps]
        # Each field with the writer of its map entry; None for images and
        # fallback fields, which this class encodes.
        self._plan = [
            (f, None if f.kind in (FALLBACK, PNG, JPEG) else entry_writer(f)) for f in self.fields
        ]
        self._fallback_serializers: dict[str, Any] = {}
        self._pool = None
        self._processes: image_processes.ImageProcessPool | None = None
        # (columns, keys, handle) of the next episode's frames, queued in the workers.
        self._ahead: tuple[Any, list[str], int] | None = None
        if image_workers and any(f.in_steps and f.kind in (PNG, JPEG) for f in self.fields):
            # Imported here: its subprocess, socket and selectors imports are
            # a few ms of a recording that has no images.
            from rlds_writer.store.images import image_processes

            if image_processes.supported():
                # Not started yet: `_start_workers_if_behind` starts it, or takes
                # one an earlier recording of this process left running.
                self._processes = image_processes.ImageProcessPool(image_workers)
        # Set once the processes answer; until then frames are encoded here.
        self._workers_up = threading.Event()
        self._starter: threading.Thread | None = None
        # Guards the hand-over of a pool started in the background against `close`.
        self._start_lock = threading.Lock()
        self._closed = False
        if start_workers_behind is None:
            start_workers_behind = START_WORKERS_BEHIND_SECONDS
        self._start_after = start_workers_behind
        if self._processes is not None and start_workers_behind <= 0:
            from rlds_writer.store.images import image_processes

            self._processes = image_processes.take_started(image_workers) or self._processes
            self._workers_up.set()  # `submit` starts them at the first image episode
        # Measured CPU seconds per frame encoded here (on this thread or the
        # encoding threads), and how far behind the writer is.
        self._frame_seconds = 0.0
        self._image_cpu = 0.0  # CPU seconds of the episode being encoded, its frames
        self._behind_seconds = 0.0
        # JPEG frames large enough for the threads are encoded while their
        # episode runs (`store.images.frame_stream`): never raw in memory for a whole
        # episode, and cheap enough (~0.25 ms for 256x256) that processes never pay.
        self.streamed: dict[str, tuple[JpegFrames, int]] = {}
        if image_workers:
            for f in self.step_fields:
                if (
                    f.kind == JPEG
                    and None not in f.shape
                    and f.row_nbytes >= THREADS_MIN_FRAME_BYTES
                ):
                    self.streamed[f.key] = (
                        JpegFrames(f.shape, jpeg_quality_of(f.feature)),
                        image_workers,
                    )
        if image_workers and any(
            f.in_steps and f.kind in (FALLBACK, PNG, JPEG) for f in self.fields
        ):
            from concurrent.futures import ThreadPoolExecutor

            self._workers = image_workers
            self._pool = ThreadPoolExecutor(
                image_workers,
                thread_name_prefix="rlds_writer_encode",
                initializer=yield_cpu_to_caller,
            )

    def close(self) -> None:
        """Ends the encoding; a started pool is kept for the next recording (`give_back`).

        Never waits for worker processes: a start still under way finishes on
        its own thread, which then leaves the pool for the next recording.
        """
        ahead, self._ahead = self._ahead, None
        with self._start_lock:
            self._closed = True
            starting = self._starter is not None and not self._workers_up.is_set()
            processes, self._processes = self._processes, None
        self._starter = None
        if processes is not None and not starting:
            from rlds_writer.store.images import image_processes

            if ahead is not None:
                processes.discard(ahead[2])
            image_processes.give_back(processes)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def encode(self, columns: Mapping[str, Any], episode_values: Mapping[str, Any]) -> bytes:
        """Encodes one episode.

        Args:
          columns: per-step field key -> column (array with a leading step axis,
            or a list of values for text and fallback fields).
          episode_values: episode-level field key -> value.

        Returns:
          The serialized `tf.train.Example`.
        """
        parts, _ = self.encode_parts(columns, episode_values)
        return b"".join(parts)

    def encode_parts(
        self,
        columns: Mapping[str, Any],
        episode_values: Mapping[str, Any],
        upcoming: Callable[[], Mapping[str, Any] | None] | None = None,
    ) -> tuple[list[Any], int]:
        """Like `encode`, as bytes-like parts (no large copies) and their total length.

        Args:
          columns: as for `encode`.
          episode_values: as for `encode`.
          upcoming: returns the columns of the episode that will be encoded
            next once it is finished, else None; asked while this episode's
            frames are encoded, so the image workers go on with the next
            one's while this one is written. Those columns must stay
            unchanged until that episode is encoded.
        """
        entries: list[Any] = []
        total = 0
        images = None
        if self._processes is not None:
            if self._workers_up.is_set():
                images = self._encode_images_in_processes(columns, upcoming)
        self._image_cpu = 0.0
        field = None
        try:
            for field, write in self._plan:
                values = columns[field.key] if field.in_steps else episode_values[field.key]
                if write is None:
                    total += self._write_other(field, values, images, entries)
                else:
                    total += write(values, entries)
        except errors.EncodingError:
            raise
        except Exception as e:  # noqa: BLE001
            raise errors.EncodingError(f"{field.key}: could not encode ({e})") from e
        if images is None and self._processes is not None:
            frames = self._frames_in(columns)
            if frames:
                per_frame = self._image_cpu / frames
                self._frame_seconds = (
                    per_frame
                    if not self._frame_seconds
                    else (0.8 * self._frame_seconds + 0.2 * per_frame)
                )
            # Asked once this episode is encoded: an episode already waiting
            # then means the env outran this thread while it encoded.
            self._start_workers_if_behind(upcoming)
        head = b"\x0a" + _varint(total)
        return [head, *entries], len(head) + total

    def _frames_in(self, columns: Mapping[str, Any]) -> int:
        """How many PNG/JPEG frames an episode's columns hold."""
        return sum(
            len(columns[f.key])
            for f in self.step_fields
            if f.kind in (PNG, JPEG) and f.key not in self.streamed
        )

    def _start_workers_if_behind(
        self, upcoming: Callable[[], Mapping[str, Any] | None] | None
    ) -> None:
        """Starts the worker processes once the writer has fallen far enough behind.

        Behind means: an episode is already finished and waiting when this
        one has been encoded. Its frames, priced at the measured cost per frame,
        add to how far behind the writer is; an episode with nothing waiting
        starts the count again.
        """
        if self._starter is not None:
            return
        following = upcoming() if upcoming is not None else None
        if following is None:
            self._behind_seconds = 0.0
            return
        if self._frame_seconds < START_WORKERS_FRAME_SECONDS:
            return
        from rlds_writer.store.images import image_processes

        running = image_processes.take_started(self._processes.workers)
        if running is not None:
            # Processes an earlier recording left: nothing to pay for, use them now.
            self._processes = running
            self._workers_up.set()
            return
        self._behind_seconds += self._frames_in(following) * self._frame_seconds
        if self._behind_seconds < self._start_after:
            return
        self._starter = threading.Thread(
            target=self._start_workers,
            args=(self._processes,),
            name="rlds_writer_start_workers",
            daemon=True,
        )
        self._starter.start()

    def _start_workers(self, processes: image_processes.ImageProcessPool) -> None:
        """Starts the processes and waits for their first answer (on its own thread)."""
        from rlds_writer.store.images import image_processes

        try:
            # One tiny frame per task, two tasks per worker: every worker answers.
            warm_up = np.zeros((2 * processes.workers, 2, 2, 3), np.uint8)
            processes.encode([("png", 0, [warm_up])])
        except image_processes.WorkersLost as e:
            _log.warning("%s; encoding images in the recording process", e)
            return
        with self._start_lock:
            if not self._closed:
                self._workers_up.set()
                return
        # The recording closed while they started: they are the next recording's.
        image_processes.give_back(processes)

    def _write_other(
        self,
        field: FieldSpec,
        values: Any,
        images: dict[str, list[bytes]] | None,
        entries: list[Any],
    ) -> int:
        """Appends the map entry of an image or fallback field; returns its length."""
        if field.kind == FALLBACK:
            entry = encode_fallback(field, values, self._pool, self._fallback_serializers)
            entries.append(entry)
            return len(entry)
        if isinstance(values, EncodedFrames):
            encoded = values.result(field.encode_by_tfds)
            feature_parts, feature_len = bytes_list_parts(encoded)
        elif images and field.key in images:
            feature_parts, feature_len = bytes_list_of_entries(images[field.key])
        else:
            feature_parts, feature_len = self._encode_image_field(field, values)
        header = map_entry_header(field.key.encode("utf-8"), feature_len)
        entries.append(header)
        entries.extend(feature_parts)
        return len(header) + feature_len

    def _image_jobs(self, columns: Mapping[str, Any]) -> tuple[list[str], list[tuple]]:
        """The fields whose column is frames of the field's dtype and shape, and their jobs.

        Others, such as paths or encoded bytes, are left to `_encode_image_field`.
        """
        keys, jobs = [], []
        for field in self.step_fields:
            if field.kind not in (PNG, JPEG):
                continue
            values = columns[field.key]
            parts = values.parts() if isinstance(values, ChunkedRows) else [values]
            if sum(map(len, parts)) < 2 or not all(
                isinstance(p, np.ndarray)
                and p.dtype == field.dtype
                and shape_fits(p.shape[1:], field.shape)
                for p in parts
            ):
                continue
            quality = jpeg_quality_of(field.feature) if field.kind == JPEG else 0
            keys.append(field.key)
            jobs.append((field.kind, quality, parts))
        return keys, jobs

    def _submit_images(self, columns: Mapping[str, Any]) -> tuple[Any, list[str], int] | None:
        """Queues an episode's frames in the worker processes: (columns, keys, handle), or None."""
        keys, jobs = self._image_jobs(columns)
        if not jobs:
            return None
        return columns, keys, self._processes.submit(jobs)

    def _encode_images_in_processes(
        self,
        columns: Mapping[str, Any],
        upcoming: Callable[[], Mapping[str, Any] | None] | None,
    ) -> dict[str, list[bytes]]:
        """Encodes the frame columns of every image field at once, in the worker processes.

        Uses the batch queued by the previous call if it was for these
        columns; while waiting, queues the next episode's frames as soon as
        `upcoming` has them.

        Returns:
          Field key -> its frames as `BytesList` entries in pieces, for the
          fields `_image_jobs` takes; {} if the workers are lost.
        """
        from rlds_writer.store.images import image_processes

        ahead, self._ahead = self._ahead, None
        try:
            if ahead is not None and ahead[0] is not columns:
                self._processes.discard(ahead[2])  # not the episode it was queued for
                ahead = None
            mine = ahead or self._submit_images(columns)

            def look_ahead() -> bool:
                following = upcoming()
                if following is None or following is columns:
                    return False
                self._ahead = self._submit_images(following)
                return True

            if mine is None:
                return {}
            _, keys, handle = mine
            try:
                encoded = self._processes.wait(handle, look_ahead if upcoming else None)
            except image_processes.BatchFailed as e:
                raise errors.EncodingError(f"{keys[e.job]}: could not encode ({e})") from e
        except image_processes.WorkersLost as e:
            # The episode is not lost: encode it (and the next ones) here.
            _log.warning("%s; encoding images in the recording process from now on", e)
            self._ahead = None
            self._processes.close()
            self._processes = None
            return {}
        return dict(zip(keys, encoded))

    def _encode_image_field(self, field: FieldSpec, values: Any) -> tuple[list[Any], int]:
        if field.kind == JPEG:
            quality = jpeg_quality_of(field.feature)

            def encode_array(value: np.ndarray) -> bytes:
                return encode_jpeg(value, quality)
        else:
            encode_array = encode_png

        def encode_one(value: Any) -> bytes:
            if isinstance(value, np.ndarray):
                if value.dtype != field.dtype or not shape_fits(value.shape, field.shape):
                    raise ValueError(
                        f"expected an image {field.describe()}, got "
                        f"{value.dtype.name}[{','.join(map(str, value.shape))}]"
                    )
                return encode_array(value)
            return field.encode_by_tfds(value)  # a path, file or encoded bytes

        items = values if field.in_steps else [values]
        if (
            self._pool is not None
            and len(items) >= THREADS_MIN_FRAMES
            and getattr(items[0], "nbytes", 0) >= THREADS_MIN_FRAME_BYTES
        ):
            # Batches, not one task per image: a task's hand-over holds the GIL
            # for about as long as encoding a small image takes without it.
            rows = list(items)
            size = max(1, len(rows) // (4 * self._workers))
            batches = [rows[i : i + size] for i in range(0, len(rows), size)]

            def encode_batch(batch: list[Any]) -> tuple[list[bytes], float]:
                started = time.thread_time()
                return [encode_one(v) for v in batch], time.thread_time() - started

            encoded = []
            for batch_encoded, cpu in self._pool.map(encode_batch, batches):
                encoded += batch_encoded
                self._image_cpu += cpu
        else:
            # Only timed with image work to price (`thread_time` is a system call).
            timed = self._processes is not None
            started = time.thread_time() if timed else 0.0
            encoded = [encode_one(v) for v in items]
            if timed:
                self._image_cpu += time.thread_time() - started
        return bytes_list_parts(encoded)
