"""Reads RLDS datasets into numpy without TensorFlow.

`open_dataset(path)` opens a dataset directory written by `rlds_writer` or by
TFDS's `SequentialWriter` (tfrecord or array_record shards). It reads
`dataset_info.json` and `features.json` itself, decodes each episode's
`tf.train.Example` with a small numpy wire decoder (`rlds_writer.wire`), and
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
import io
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import google_crc32c
import numpy as np

from rlds_writer import features_json, wire
from rlds_writer.features_json import IMAGE, NUMERIC, RAW, STRING, ZLIB, Features, Leaf
from rlds_writer.tfrecord import FOOTER_SIZE, HEADER_SIZE, CorruptRecordError

_log = logging.getLogger(__name__)

__all__ = [
    "CorruptRecordError",
    "DatasetReader",
    "DecodeError",
    "Episodes",
    "open_dataset",
]

_DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_INDEX_DIR = ".rlds_reader_index"
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_ON_CORRUPT = ("raise", "skip")
_INDEX_CACHES = ("memory", "disk")


class DecodeError(ValueError):
    """A record is not a valid episode for the dataset's features.

    The message names the file, the record and the field.
    """


class CorruptArrayRecordError(CorruptRecordError):
    """An array_record record could not be read (bad chunk hash or torn file)."""

    def __init__(self, path: str, index: int, reason: str):
        IOError.__init__(self, f"{path}: corrupt array_record record {index}: {reason}")
        self.path = path
        self.offset = index
        self.reason = reason


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# --------------------------------------------------------------------------
# Shard files.


class _PerProcess:
    """Pickles without its open handle and lock (DataLoader workers reopen)."""

    _HANDLE = ""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state[self._HANDLE] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class _TFRecordShard(_PerProcess):
    """One tfrecord shard: sequential reads, and random access via an offset index.

    Args:
      path: the file.
      num_records: records listed for it in dataset_info.json.
      verify: check data CRCs.
      cache_path: where to save the offset index, or None.
      skip: on a broken record header, index the records before it (with a
        warning) instead of raising.
    """

    _HANDLE = "_fd"

    def __init__(
        self,
        path: str,
        num_records: int,
        verify: bool,
        cache_path: str | None,
        skip: bool = False,
    ):
        self.skip = skip
        self.path = path
        self.num_records = num_records
        self.verify = verify
        self.cache_path = cache_path
        self._offsets: np.ndarray | None = None
        self._steps: np.ndarray | None = None
        self._fd: int | None = None
        self._fd_pid = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._fd is not None and self._fd_pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def _descriptor(self) -> int:
        """A file descriptor for positional reads, reopened in a forked child."""
        with self._lock:
            if self._fd is None or self._fd_pid != os.getpid():
                if self._fd is not None:  # the parent's copy, inherited through fork
                    os.close(self._fd)
                self._fd = os.open(self.path, os.O_RDONLY)
                self._fd_pid = os.getpid()
            return self._fd

    def _read_at(self, f: Any, offset: int) -> tuple[bytes | None, int, str | None]:
        """Reads the record at `offset`: (data or None, next offset, problem)."""
        header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            return None, -1, "truncated header" if header else "unexpected end of file"
        (length,) = _LEN.unpack_from(header, 0)
        if _masked_crc(header[:8]) != _CRC.unpack_from(header, 8)[0]:
            return None, -1, "length CRC mismatch"
        data = f.read(length)
        footer = f.read(FOOTER_SIZE)
        if len(data) < length or len(footer) < FOOTER_SIZE:
            return None, -1, "truncated record"
        nxt = offset + HEADER_SIZE + length + FOOTER_SIZE
        if self.verify and _masked_crc(data) != _CRC.unpack(footer)[0]:
            return None, nxt, "data CRC mismatch"
        return data, nxt, None

    def offsets(self) -> np.ndarray:
        """Byte offset of each record, from one pass over the record headers."""
        if self._offsets is None:
            self._load_cache()
        if self._offsets is None:
            self._offsets = self._scan_offsets()
            if self._offsets.size == self.num_records:  # never cache a partial index
                self._save_cache()
        return self._offsets

    def _scan_offsets(self) -> np.ndarray:
        offsets = np.empty(self.num_records, np.int64)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = 0
            for i in range(self.num_records):
                header = f.read(HEADER_SIZE)
                problem = None
                if len(header) < HEADER_SIZE:
                    problem = "truncated header" if header else "unexpected end of file"
                elif _masked_crc(header[:8]) != _CRC.unpack_from(header, 8)[0]:
                    problem = "length CRC mismatch"
                else:
                    (length,) = _LEN.unpack_from(header, 0)
                    if offset + HEADER_SIZE + length + FOOTER_SIZE > size:
                        problem = "truncated record"
                if problem:
                    where = (
                        f"{problem} (record {i} of {self.num_records} listed in dataset_info.json)"
                    )
                    if not self.skip:
                        raise CorruptRecordError(self.path, offset, where)
                    _log.warning(
                        "%s: records from offset %d on are lost: %s", self.path, offset, where
                    )
                    return offsets[:i]
                offsets[i] = offset
                offset += HEADER_SIZE + length + FOOTER_SIZE
                f.seek(offset)
        return offsets

    def _stat_key(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_size, st.st_mtime_ns

    def _load_cache(self) -> None:
        if not self.cache_path or not os.path.exists(self.cache_path):
            return
        try:
            with np.load(self.cache_path) as z:
                if tuple(int(x) for x in z["stat"]) != self._stat_key():
                    return
                if int(z["num_records"]) != self.num_records:
                    return
                if z["offsets"].size != self.num_records:
                    return
                self._offsets = z["offsets"]
                steps = z["steps"]
                if self._steps is None and steps.size == self.num_records:
                    self._steps = steps
        except (OSError, ValueError, KeyError) as e:
            _log.warning("ignoring unreadable index cache %s (%s)", self.cache_path, e)

    def _save_cache(self) -> None:
        if not self.cache_path:
            return
        try:
            os.makedirs(os.path.dirname(self.cache_path), exist_ok=True)
            tmp = f"{self.cache_path}.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                np.savez(
                    f,
                    stat=np.array(self._stat_key(), np.int64),
                    num_records=np.int64(self.num_records),
                    offsets=self._offsets if self._offsets is not None else np.empty(0, np.int64),
                    steps=self._steps if self._steps is not None else np.empty(0, np.int64),
                )
            os.replace(tmp, self.cache_path)
        except OSError as e:  # a read-only dataset directory still reads fine
            _log.warning("could not write index cache %s (%s)", self.cache_path, e)

    def read(self, i: int) -> bytes:
        """Returns record `i`; raises CorruptRecordError if it is damaged."""
        offsets = self.offsets()
        if i >= offsets.size:
            raise CorruptRecordError(
                self.path, int(offsets[-1]) if offsets.size else 0, f"record {i} is lost"
            )
        offset = int(offsets[i])
        # pread does not move a shared file position: safe across threads and forks.
        data, _, problem = self._read_at(_PositionalFile(self._descriptor(), offset), offset)
        if problem:
            raise CorruptRecordError(self.path, offset, f"{problem} (record {i})")
        return data

    def iter(self, start: int, stop: int, skip: bool) -> Iterator[tuple[int, bytes]]:
        """Yields (index, data) for records [start, stop) in file order.

        Args:
          start: first record.
          stop: one past the last record.
          skip: skip damaged records (with a warning) instead of raising.

        Raises:
          CorruptRecordError: on a damaged record, unless `skip`.
        """
        if start >= stop:
            return
        if start:
            offsets = self.offsets()
            if start >= offsets.size:  # lost behind a broken record (skip mode)
                return
            offset = int(offsets[start])
        else:
            offset = 0
        with open(self.path, "rb", buffering=1 << 20) as f:
            f.seek(offset)
            for i in range(start, stop):
                data, nxt, problem = self._read_at(f, offset)
                if problem:
                    where = f"{problem} (record {i} of {self.num_records})"
                    if not skip:
                        raise CorruptRecordError(self.path, offset, where)
                    _log.warning(
                        "%s: skipping corrupt record at offset %d: %s", self.path, offset, where
                    )
                    if nxt < 0:  # the framing is lost: nothing after it can be trusted
                        return
                    offset = nxt
                    continue
                yield i, data
                offset = nxt

    @property
    def cached_steps(self) -> np.ndarray | None:
        return self._steps

    def store_steps(self, steps: np.ndarray) -> None:
        self._steps = steps
        if self.cache_path and self.offsets().size == self.num_records:
            self._save_cache()


class _PositionalFile:
    """The `read(n)` of a file object, by `os.pread` from a given offset."""

    def __init__(self, fd: int, offset: int):
        self.fd = fd
        self.pos = offset

    def read(self, n: int) -> bytes:
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        return data


class _ArrayRecordShard(_PerProcess):
    """One array_record shard: array_record's own reader gives random access."""

    _HANDLE = "_reader"

    def __init__(
        self,
        path: str,
        num_records: int,
        verify: bool,
        cache_path: str | None,
        skip: bool = False,
    ):
        del verify, cache_path, skip  # array_record checks its own chunk hashes
        self.path = path
        self.num_records = num_records
        self._reader: Any = None
        self._reader_pid = 0
        self._steps: np.ndarray | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @staticmethod
    def _open(path: str, options: str) -> Any:
        from array_record.python.array_record_module import ArrayRecordReader

        return ArrayRecordReader(path, options)

    def _check_count(self, reader: Any) -> None:
        n = reader.num_records()
        if n < self.num_records:
            raise CorruptArrayRecordError(
                self.path, n, f"file holds {n} records, dataset_info.json lists {self.num_records}"
            )

    def read(self, i: int) -> bytes:
        with self._lock:
            if self._reader is None or self._reader_pid != os.getpid():
                try:
                    reader = self._open(self.path, "readahead_buffer_size:0,max_parallelism:0")
                except Exception as e:  # noqa: BLE001 - riegeli raises plain RuntimeErrors
                    raise CorruptArrayRecordError(self.path, i, str(e)) from e
                self._check_count(reader)
                self._reader = reader
                self._reader_pid = os.getpid()
            try:
                return self._reader.read([i])[0]
            except Exception as e:  # noqa: BLE001
                raise CorruptArrayRecordError(self.path, i, str(e)) from e

    def iter(self, start: int, stop: int, skip: bool) -> Iterator[tuple[int, bytes]]:
        if start >= stop:
            return
        try:
            reader = self._open(self.path, "")
        except Exception as e:  # noqa: BLE001
            if not skip:
                raise CorruptArrayRecordError(self.path, start, str(e)) from e
            _log.warning("%s: skipping unreadable file: %s", self.path, e)
            return
        try:
            self._check_count(reader)
            chunk = 32
            for a in range(start, stop, chunk):
                b = min(a + chunk, stop)
                try:
                    records = reader.read(a, b)
                except Exception:  # noqa: BLE001 - retry one by one to isolate the bad record
                    records = None
                if records is not None:
                    yield from zip(range(a, b), records)
                    continue
                for i in range(a, b):
                    try:
                        data = reader.read([i])[0]
                    except Exception as e:  # noqa: BLE001
                        if not skip:
                            raise CorruptArrayRecordError(self.path, i, str(e)) from e
                        _log.warning("%s: skipping corrupt record %d: %s", self.path, i, e)
                        continue
                    yield i, data
        finally:
            reader.close()

    @property
    def cached_steps(self) -> np.ndarray | None:
        return self._steps

    def store_steps(self, steps: np.ndarray) -> None:
        self._steps = steps


# --------------------------------------------------------------------------
# Decoding.


_JPEG_WARNED = []


def _decode_jpeg_like_tf(data: bytes, channels: int | None) -> np.ndarray | None:
    """Decodes a JPEG exactly as `tf.image.decode_image` does, or None.

    TensorFlow decodes JPEGs with libjpeg-turbo's fast integer DCT and fancy
    upsampling; `simplejpeg` can do the same, Pillow cannot (it uses the
    accurate DCT, which differs by a few levels per pixel).
    """
    try:
        import simplejpeg
    except ImportError:
        if not _JPEG_WARNED:
            _JPEG_WARNED.append(True)
            _log.warning(
                "simplejpeg is not installed: JPEG images are decoded with Pillow and may "
                "differ from TensorFlow's decoding by a few levels per pixel "
                "(pip install 'rlds_writer[reader]')"
            )
        return None
    if channels is None:
        channels = 1 if simplejpeg.decode_jpeg_header(data)[2] == "Gray" else 3
    if channels not in (1, 3):
        return None
    colorspace = "GRAY" if channels == 1 else "RGB"
    arr = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=True, fastupsample=False)
    return arr.reshape(arr.shape[0], arr.shape[1], channels)


def _decode_image(data: bytes, leaf: Leaf) -> np.ndarray:
    from PIL import Image

    channels = leaf.shape[-1]
    if data[:2] == b"\xff\xd8" and leaf.dtype == np.uint8:
        arr = _decode_jpeg_like_tf(data, channels)
        if arr is not None:
            return _check_image(arr, leaf)
    with Image.open(io.BytesIO(data)) as img:
        if leaf.dtype == np.uint16:
            if channels not in (1, None) or img.mode not in ("I;16", "I;16B", "I", "L"):
                raise NotImplementedError(
                    f"{leaf.key}: uint16 images with {channels} channels need OpenCV"
                )
            arr = np.asarray(img, dtype=np.uint16)
        else:
            want = 4 if leaf.dtype == np.float32 else channels
            mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(want)
            if mode is None and img.mode == "P":
                mode = "RGBA" if "transparency" in img.info else "RGB"
            if mode is not None and img.mode != mode:
                img = img.convert(mode)
            arr = np.asarray(img, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if leaf.dtype == np.float32:  # 4 uint8 channels bitcast to one float32 channel
        arr = np.ascontiguousarray(arr).view(np.float32)
    return _check_image(arr, leaf)


def _check_image(arr: np.ndarray, leaf: Leaf) -> np.ndarray:
    for want, got in zip(leaf.shape, arr.shape):
        if want is not None and want != got:
            raise DecodeError(
                f"{leaf.key}: image decoded to shape {arr.shape}, feature expects {leaf.shape}"
            )
    return np.array(arr, copy=True) if not arr.flags.writeable else arr


def _stack(key: str, items: list[np.ndarray], shape: tuple, dtype: np.dtype) -> Any:
    """Stacks per-step arrays; a list when their shapes differ."""
    if not items:
        return np.zeros((0,) + tuple(0 if d is None else d for d in shape), dtype)
    first = items[0].shape
    if all(x.shape == first for x in items):
        return np.stack(items)
    return items


class _Decoder:
    """Decodes episode records for one dataset's features."""

    def __init__(self, features: Features):
        self.features = features
        self.step_leaves = features.step_leaves
        self.episode_leaves = features.episode_leaves
        self._count_leaf = self._pick_count_leaf()

    def _pick_count_leaf(self) -> Leaf | None:
        def rank(leaf: Leaf) -> int:
            if leaf.kind == NUMERIC:
                return 0 if leaf.wire_type == "float" else 1
            return 2 if leaf.kind == STRING else 3

        def countable(leaf: Leaf) -> bool:
            if leaf.kind in (NUMERIC, STRING):
                return leaf.static and leaf.size > 0
            return not leaf.dynamic  # one bytes entry per step, whatever its shape

        candidates = [leaf for leaf in self.step_leaves if countable(leaf)]
        if not candidates:
            return None
        return min(candidates, key=rank)

    def _per_step(self, leaf: Leaf) -> int:
        return leaf.size if leaf.kind in (NUMERIC, STRING) else 1

    def num_steps(self, buf: bytes, where: str = "") -> int:
        """Counts an episode's steps from one field, without decoding values."""
        leaf = self._count_leaf
        if leaf is None:
            return 0
        located = wire.parse_example(buf).get(leaf.key)
        if located is None:
            return 0
        return wire.count_values(buf, located) // self._per_step(leaf)

    def decode(self, buf: bytes, where: str = "") -> dict[str, Any]:
        """Decodes one serialized episode.

        Args:
          buf: the record bytes.
          where: `file, record i`, for error messages.

        Returns:
          The episode as a nested dict of numpy arrays.

        Raises:
          DecodeError: if the record does not match the features.
        """
        try:
            located = wire.parse_example(buf)
        except wire.WireError as e:
            raise DecodeError(f"{where}: not a tf.train.Example ({e})") from e
        out: dict[str, Any] = {}
        num_steps = None
        for leaf in self.step_leaves:
            try:
                if leaf.dynamic:
                    value = self._decode_dynamic(buf, located, leaf, True)
                else:
                    value = self._decode_steps(buf, located.get(leaf.key), leaf)
            except (wire.WireError, zlib.error, ValueError) as e:
                if isinstance(e, DecodeError):
                    raise DecodeError(f"{where}: {e}") from e
                raise DecodeError(f"{where}: {leaf.key}: {e}") from e
            n = len(value)
            if num_steps is None:
                num_steps = n
            elif n != num_steps and leaf.size != 0:
                raise DecodeError(
                    f"{where}: {leaf.key} has {n} steps, other step fields have {num_steps}"
                )
            _put(out, leaf.path, value)
        if self.features.has_steps and "steps" not in out:
            out["steps"] = {}
        for leaf in self.episode_leaves:
            loc = located.get(leaf.key + "/value" if leaf.dynamic else leaf.key)
            if loc is None:
                raise DecodeError(f"{where}: feature {leaf.key!r} ({leaf.describe()}) is missing")
            try:
                if leaf.dynamic:
                    value = self._decode_dynamic(buf, located, leaf, False)
                else:
                    value = self._decode_value(buf, loc, leaf)
            except (wire.WireError, zlib.error, ValueError) as e:
                if isinstance(e, DecodeError):
                    raise DecodeError(f"{where}: {e}") from e
                raise DecodeError(f"{where}: {leaf.key}: {e}") from e
            _put(out, leaf.path, value)
        return out

    def _numbers(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> np.ndarray:
        """The flat values of a numeric leaf, in its decoded dtype (a fresh array)."""
        if leaf.wire_type == "float":
            if loc is None or loc[0] == 0:
                return np.empty(0, leaf.dtype)
            wire.expect_list(leaf.key, loc, (wire.FLOAT_LIST,))
            flat = wire.float_list(buf, loc[1], loc[2])
            return flat.astype(leaf.dtype)  # astype copies: aligned and writable
        if loc is None or loc[0] == 0:
            return np.empty(0, leaf.dtype)
        wire.expect_list(leaf.key, loc, (wire.INT64_LIST,))
        flat = wire.int64_list(buf, loc[1], loc[2])
        if leaf.dtype == np.uint64:
            return flat.view(np.uint64)
        if leaf.dtype == np.int64:
            return flat
        return flat.astype(leaf.dtype)

    def _strings(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> list[bytes]:
        if loc is None or loc[0] == 0:
            return []
        wire.expect_list(leaf.key, loc, (wire.BYTES_LIST,))
        return wire.bytes_list(buf, loc[1], loc[2])

    def _decode_steps(self, buf: bytes, loc: tuple[int, int, int] | None, leaf: Leaf) -> Any:
        kind = leaf.kind
        if kind == NUMERIC:
            flat = self._numbers(buf, loc, leaf)
            return _reshape_steps(leaf, flat)
        if kind == STRING:
            items = self._strings(buf, loc, leaf)
            arr = np.empty(len(items), object)
            arr[:] = items
            return _reshape_steps(leaf, arr)
        if kind == RAW:
            dtype = leaf.dtype.newbyteorder("<")
            if loc is not None and loc[0] == wire.BYTES_LIST and leaf.static:
                rows = wire.fixed_bytes_list(buf, loc[1], loc[2])
                width = leaf.size * dtype.itemsize
                if rows is not None and (rows.shape[0] == 0 or rows.shape[1] == width):
                    out = rows.copy().view(dtype).reshape((rows.shape[0],) + leaf.shape)
                    return out.astype(leaf.dtype, copy=False)
            items = [self._raw(x, leaf) for x in self._strings(buf, loc, leaf)]
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        if kind == ZLIB:
            items = self._strings(buf, loc, leaf)
            if leaf.static:
                width = leaf.size * leaf.dtype.itemsize
                out = np.empty((len(items), width), np.uint8)
                for i, item in enumerate(items):
                    raw = zlib.decompress(item)
                    if len(raw) != width:
                        raise DecodeError(
                            f"{leaf.key}: step {i} holds {len(raw)} bytes, "
                            f"{leaf.describe()} needs {width}"
                        )
                    out[i] = np.frombuffer(raw, np.uint8)
                return out.view(leaf.dtype.newbyteorder("<")).reshape((len(items),) + leaf.shape)
            return _stack(
                leaf.key,
                [self._raw(zlib.decompress(x), leaf) for x in items],
                leaf.shape,
                leaf.dtype,
            )
        if kind == IMAGE:
            items = [_decode_image(x, leaf) for x in self._strings(buf, loc, leaf)]
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        raise NotImplementedError(f"{leaf.key}: kind {kind}")

    def _decode_dynamic(
        self, buf: bytes, located: Mapping[str, tuple[int, int, int]], leaf: Leaf, in_steps: bool
    ) -> Any:
        """Decodes an encoded tensor stored as `<key>/value` plus `<key>/shape`."""
        values = self._strings(buf, located.get(leaf.key + "/value"), leaf)
        shape_loc = located.get(leaf.key + "/shape")
        rank = len(leaf.shape)
        shapes = np.empty(0, np.int64)
        if shape_loc is not None and shape_loc[0]:
            wire.expect_list(leaf.key + "/shape", shape_loc, (wire.INT64_LIST,))
            shapes = wire.int64_list(buf, shape_loc[1], shape_loc[2])
        if shapes.size != len(values) * rank:
            raise DecodeError(
                f"{leaf.key}: {len(values)} values but {shapes.size} shape entries (rank {rank})"
            )
        dtype = leaf.dtype.newbyteorder("<")
        items = []
        for data, shape in zip(values, shapes.reshape(len(values), rank)):
            raw = zlib.decompress(data) if leaf.kind == ZLIB else data
            arr = np.frombuffer(raw, dtype).copy()
            try:
                items.append(arr.reshape(tuple(int(d) for d in shape)).astype(leaf.dtype))
            except ValueError as e:
                raise DecodeError(
                    f"{leaf.key}: {arr.size} values do not fit the stored shape {tuple(shape)}"
                ) from e
        if in_steps:
            return _stack(leaf.key, items, leaf.shape, leaf.dtype)
        if len(items) != 1:
            raise DecodeError(f"{leaf.key}: expected one encoded value, got {len(items)}")
        return items[0]

    def _raw(self, data: bytes, leaf: Leaf) -> np.ndarray:
        dtype = leaf.dtype.newbyteorder("<")
        if len(data) % dtype.itemsize:
            raise DecodeError(
                f"{leaf.key}: {len(data)} bytes is not a whole number of {leaf.dtype.name} values"
            )
        arr = np.frombuffer(data, dtype).copy()
        try:
            return arr.reshape([-1 if d is None else d for d in leaf.shape])
        except ValueError as e:
            raise DecodeError(
                f"{leaf.key}: expected {leaf.describe()}, got {arr.size} values"
            ) from e

    def _decode_value(self, buf: bytes, loc: tuple[int, int, int], leaf: Leaf) -> Any:
        """Decodes an episode-level (non-step) value."""
        kind = leaf.kind
        target = [-1 if d is None else d for d in leaf.shape]
        if kind == NUMERIC:
            flat = self._numbers(buf, loc, leaf)
            if not leaf.shape:
                if flat.size != 1:
                    raise DecodeError(f"{leaf.key}: expected one value, got {flat.size}")
                return flat[0]
            return _reshape_value(leaf, flat, target)
        if kind == STRING:
            items = self._strings(buf, loc, leaf)
            if not leaf.shape:
                if len(items) != 1:
                    raise DecodeError(f"{leaf.key}: expected one string, got {len(items)}")
                return items[0]
            arr = np.empty(len(items), object)
            arr[:] = items
            return _reshape_value(leaf, arr, target)
        items = self._strings(buf, loc, leaf)
        if len(items) != 1:
            raise DecodeError(f"{leaf.key}: expected one encoded value, got {len(items)}")
        if kind == RAW:
            return self._raw(items[0], leaf)
        if kind == ZLIB:
            return self._raw(zlib.decompress(items[0]), leaf)
        if kind == IMAGE:
            return _decode_image(items[0], leaf)
        raise NotImplementedError(f"{leaf.key}: kind {kind}")


def _reshape_steps(leaf: Leaf, flat: np.ndarray) -> np.ndarray:
    size = leaf.size
    if size == 0:
        return flat.reshape((0,) + leaf.shape)
    if flat.size % size:
        raise DecodeError(
            f"{leaf.key}: {flat.size} values is not a whole number of steps of {leaf.describe()}"
        )
    return flat.reshape((flat.size // size,) + leaf.shape)


def _reshape_value(leaf: Leaf, flat: np.ndarray, target: list[int]) -> np.ndarray:
    try:
        return flat.reshape(target)
    except ValueError as e:
        raise DecodeError(f"{leaf.key}: expected {leaf.describe()}, got {flat.size} values") from e


def _put(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def _flatten(tree: Mapping[str, Any], prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    out = []
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.extend(_flatten(v, prefix + (k,)))
        else:
            out.append((prefix + (k,), v))
    return out


def _map_tree(fn: Any, tree: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _map_tree(fn, v) if isinstance(v, Mapping) else fn(v) for k, v in tree.items()}


def _rows(tree: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Turns a nested dict of step columns into one nested dict per step."""
    keys = list(tree)
    columns = [_rows(v) if isinstance(v, Mapping) else list(v) for v in tree.values()]
    return [dict(zip(keys, values)) for values in zip(*columns)]


# --------------------------------------------------------------------------
# Splits.

_SPEC_RE = re.compile(r"^(?P<name>[\w-]+)(\[(?P<sel>[\d\w%:._-]*)\])?$")
_SLICE_RE = re.compile(r"^((?P<val>-?[\d_.]+)(?P<unit>%|shard)?)?$")


def _split_ranges(spec: str, splits: Mapping[str, list[int]]) -> list[tuple[str, int, int]]:
    """Parses a TFDS split spec into (split, start, stop) episode ranges.

    Follows TFDS: `train`, `train[5:20]`, `train[:10%]` (percent rounded to the
    closest episode), `train[-5:]`, `train[1shard:3shard]`, `train+test`, `all`.
    """
    out = []
    for part in re.split(r"\s*\+\s*", spec.strip()):
        m = _SPEC_RE.match(part)
        if not m:
            raise ValueError(
                f"Unrecognized split {part!r} in {spec!r} (expected e.g. 'train[:10%]')"
            )
        name, sel = m.group("name"), m.group("sel")
        if name == "all" and name not in splits:
            if sel:
                raise ValueError("split 'all' does not support slicing")
            out.extend((s, 0, sum(lengths)) for s, lengths in splits.items())
            continue
        if name not in splits:
            raise ValueError(f"Unknown split {name!r}; the dataset has {sorted(splits)}")
        lengths = splits[name]
        n = sum(lengths)
        if not sel:
            out.append((name, 0, n))
            continue
        parts = sel.split(":")
        matches = [_SLICE_RE.match(p) for p in parts]
        if len(parts) != 2 or not all(matches) or not any(p for p in parts):
            raise ValueError(f"Unrecognized slice {sel!r} in {spec!r} (expected [from:to])")
        units = {mm.group("unit") for mm in matches if mm.group("val")}
        unit = (units - {None}).pop() if units - {None} else "abs"
        if len(units - {None}) > 1:
            raise ValueError(f"{spec!r}: mixed slice units")
        bounds = [mm.group("val") for mm in matches]
        start, stop = (_boundary(b, unit, n, lengths) for b in bounds)
        start = 0 if start is None else start
        stop = n if stop is None else stop
        if abs(start) > n or abs(stop) > n:
            raise ValueError(f"Requested slice [{sel}] incompatible with {n} examples in {name!r}")
        start = start + n if start < 0 else start
        stop = stop + n if stop < 0 else stop
        out.append((name, start, max(start, stop)))
    return out


def _boundary(val: str | None, unit: str, n: int, lengths: list[int]) -> int | None:
    if val is None:
        return None
    if unit == "%":
        return int(round(float(val) * n / 100.0))
    if unit == "shard":
        k = int(val)
        if k < 0:
            k += len(lengths)
        return sum(lengths[:k])
    if "." in val:
        raise ValueError(f"absolute slice boundaries must be integers, got {val!r}")
    return int(val)


def _shard_file(template: str, name: str, split: str, fmt: str, index: int, count: int) -> str:
    return (
        template.replace("{SHARD_X_OF_Y}", f"{index:05d}-of-{count:05d}")
        .replace("{DATASET}", name)
        .replace("{SPLIT}", split)
        .replace("{FILEFORMAT}", fmt)
        .replace("{SHARD_INDEX}", f"{index:05d}")
        .replace("{NUM_SHARDS}", f"{count:05d}")
    )


# --------------------------------------------------------------------------
# Public API.


def open_dataset(
    path: str | os.PathLike,
    *,
    verify_checksums: bool = True,
    on_corrupt: str = "raise",
    index_cache: str = "memory",
) -> DatasetReader:
    """Opens an RLDS dataset directory for reading, without TensorFlow.

    Args:
      path: the dataset directory (holding `dataset_info.json`).
      verify_checksums: check every tfrecord record's data CRC before decoding
        (array_record always checks its own chunk hashes).
      on_corrupt: `"raise"` (default) raises `CorruptRecordError` naming the
        file and offset of a torn or corrupt record; `"skip"` logs a warning and
        skips it while iterating. Random access (`episodes[i]`) always raises.
      index_cache: `"memory"` keeps tfrecord offset indexes in memory;
        `"disk"` also saves them (with step counts) under
        `<path>/.rlds_reader_index/` and reuses them while the shard is unchanged.

    Returns:
      A `DatasetReader`.

    Raises:
      FileNotFoundError: if `dataset_info.json` or `features.json` is missing.
      NotImplementedError: for features or file formats the reader cannot decode.
    """
    return DatasetReader(
        path, verify_checksums=verify_checksums, on_corrupt=on_corrupt, index_cache=index_cache
    )


class DatasetReader:
    """An RLDS dataset directory, opened for reading.

    Select episodes with a TFDS split spec: `reader["train[:10%]"]` or
    `reader.episodes("train")` return an `Episodes` view. See `open_dataset`
    for the arguments.

    Attributes:
      path: the directory.
      info: the parsed `dataset_info.json`.
      features: the parsed `features.json` (`features_json.Features`).
      metadata: the parsed `metadata.json`, or None.
      name: the dataset name.
      version: the dataset version.
      file_format: `"tfrecord"` or `"array_record"`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        verify_checksums: bool = True,
        on_corrupt: str = "raise",
        index_cache: str = "memory",
    ):
        import json

        if on_corrupt not in _ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {_ON_CORRUPT}, got {on_corrupt!r}")
        if index_cache not in _INDEX_CACHES:
            raise ValueError(f"index_cache must be one of {_INDEX_CACHES}, got {index_cache!r}")
        self.path = os.fspath(path)
        if "://" in self.path:
            raise NotImplementedError(
                f"{self.path}: the reader reads local directories only; copy the dataset first"
            )
        info_path = os.path.join(self.path, "dataset_info.json")
        with open(info_path, encoding="utf-8") as f:
            self.info = json.load(f)
        self.features = features_json.load_features(os.path.join(self.path, "features.json"))
        meta_path = os.path.join(self.path, "metadata.json")
        self.metadata = None
        if os.path.exists(meta_path):
            with open(meta_path, encoding="utf-8") as f:
                self.metadata = json.load(f)
        self.name = self.info.get("name", "")
        self.version = self.info.get("version", "")
        self.file_format = self.info.get("fileFormat") or "tfrecord"
        if self.file_format not in ("tfrecord", "array_record"):
            raise NotImplementedError(
                f"{info_path}: file format {self.file_format!r} is not supported "
                "(tfrecord and array_record are)"
            )
        self.verify_checksums = verify_checksums
        self.on_corrupt = on_corrupt
        self.index_cache = index_cache
        self._decoder = _Decoder(self.features)
        self._split_lengths: dict[str, list[int]] = {}
        self._templates: dict[str, str] = {}
        for entry in self.info.get("splits", []):
            lengths = [int(n) for n in entry.get("shardLengths", [])]
            self._split_lengths[entry["name"]] = lengths
            self._templates[entry["name"]] = entry.get("filepathTemplate") or _DEFAULT_TEMPLATE
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
        count = len(self._split_lengths[split])
        name = _shard_file(self._templates[split], self.name, split, self.file_format, index, count)
        return os.path.join(self.path, name)

    def _shard(self, split: str, index: int) -> Any:
        key = (split, index)
        shard = self._shards.get(key)
        if shard is None:
            path = self.shard_path(split, index)
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path}: shard {index} of split {split!r} is listed in dataset_info.json "
                    "but missing"
                )
            cache = None
            if self.index_cache == "disk":
                cache = os.path.join(self.path, _INDEX_DIR, os.path.basename(path) + ".npz")
            cls = _TFRecordShard if self.file_format == "tfrecord" else _ArrayRecordShard
            skip = self.on_corrupt == "skip"
            shard = cls(path, self._split_lengths[split][index], self.verify_checksums, cache, skip)
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
        segments = []
        for name, start, stop in _split_ranges(split, self._split_lengths):
            lengths = self._split_lengths[name]
            first = 0
            for shard, n in enumerate(lengths):
                a, b = max(start, first), min(stop, first + n)
                if a < b:
                    segments.append((name, shard, a - first, b - first))
                first += n
        return Episodes(self, segments, split)

    __getitem__ = episodes

    def num_episodes(self, split: str = "train") -> int:
        """Number of episodes in a split spec, from `dataset_info.json` alone."""
        return len(self.episodes(split))

    def num_steps(self, split: str = "train") -> int:
        """Number of steps in a split spec (reads the records, decodes nothing)."""
        return self.episodes(split).num_steps

    def decode(self, record: bytes, where: str = "<record>") -> dict[str, Any]:
        """Decodes one serialized episode with this dataset's features."""
        return self._decoder.decode(record, where)


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
        return f"Episodes({self.spec!r}, {len(self)} episodes, {len(self.files())} files)"

    def __len__(self) -> int:
        return self._cum[-1]

    def _locate(self, i: int) -> tuple[str, int, int]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"episode index {i} out of range for {n} episodes")
        seg = bisect.bisect_right(self._cum, i) - 1
        split, shard, a, _ = self.segments[seg]
        return split, shard, a + i - self._cum[seg]

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return self._subset(range(len(self))[i])
        split, shard, local = self._locate(int(i))
        src = self.reader._shard(split, shard)
        data = src.read(local)
        return self.reader._decoder.decode(data, f"{src.path}, record {local}")

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
        decode = self.reader._decoder.decode
        for where, data in self.records():
            yield decode(data, where)

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
        self._lengths = np.concatenate(parts) if parts else np.empty(0, np.int64)
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
            yield from _rows(episode.get("steps", {}))

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
            flat = _flatten(steps)
            if not flat:
                continue
            n = len(flat[0][1])
            for start in range(0, n - size + 1, stride):
                yield _map_tree(lambda col, s=start: col[s : s + size], steps)

    def window_index(self, size: int, stride: int = 1) -> np.ndarray:
        """Returns an (N, 2) array of (episode, start step) for every window."""
        lengths = self.episode_lengths()
        counts = np.maximum(0, (lengths - size) // stride + 1)
        episode = np.repeat(np.arange(len(lengths)), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        start = (np.arange(counts.sum()) - first) * stride
        return np.stack([episode, start], axis=1).astype(np.int64)
