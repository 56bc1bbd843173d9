"""Many finished episodes at once: their columns side by side, encoded as records together.

A batched recorder (`record.batch`) ends dozens of episodes on one vector
step; encoding each on its own costs tens of microseconds of Python per
episode, more than the env took for all its steps. An `EpisodeBatch`
holds them as one array per field (episode `j` is rows
`offsets[j] .. offsets[j] + steps[j] - 1`, flags included), and
`BatchRecordEncoder` writes all their `tf.train.Example` records, framed
as TFRecord, into one buffer with a fixed number of numpy calls per field,
whatever the number of episodes: each record is the same bytes
`EpisodeEncoder.encode_parts` gives for that episode alone. Where the
optional extension `_batch_records.c` is built, one C call writes them all
(framed, checksummed, without the GIL) and the ring's gather of ended
episodes (`record.batch.ring`) is C too; numpy does the same otherwise.

Only numeric per-step fields (`FLOAT`, `INT`) of a fixed shape are taken
(`supports`); a dataset with images or bytes fields hands its episodes over
one by one.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import numpy as np

from rlds_writer import _native
from rlds_writer.store.features.features import FLOAT, INT
from rlds_writer.store.features.field_encoding import _packed_head, entry_writer, map_entry_header
from rlds_writer.store.features.field_specs import FieldSpec
from rlds_writer.store.formats.tfrecord import tfrecord

# The optional extension: gather and encode in C, without the GIL. None where
# it is not built, there is no SSE4.2, or it was built from other sources
# (`_native.load` warns once): the same bytes from numpy.
native = _native.load("rlds_writer.store.writing._batch_records")

_FRAME = 12  # a TFRecord header: length, masked CRC of the length
_FOOTER = 4
_LEN = struct.Struct("<Q")
_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_POSITIONS = np.arange(10)


class EpisodeBatch:
    """Finished episodes of one dataset, their columns concatenated.

    Attributes:
      columns: per-step field key -> array `(sum(steps), *shape)`, RLDS-aligned,
        the flags included.
      offsets: int64 `[E]`: each episode's first row.
      steps: int64 `[E]`: each episode's number of steps (at least 1).
      reasons: int64 `[E]`: each episode's index into `episode_values`.
      episode_values: the episode-level values, one dict per kind of end.
      count: the number of episodes `E`.
      num_steps: their steps in all.
      nbytes: the memory the columns hold (for the writer's queue budget).

    A batch made with `cut` (a `ring_records.RingCut`, `columns=None`,
    `nbytes` given) holds its episodes' rows in a batch recorder's ring: the
    writer thread encodes its records from there (`ring_records`), holding
    `lock`; the recorder, about to overwrite the rows, cuts the columns out
    first (`materialize`), as does any thread that asks for `columns`. Its
    caller knows `num_steps` too (`offsets[-1] + steps[-1]`): a numpy sum on
    the env thread at every vector step cost ~3% of a recorded CartPole loop.
    """

    __slots__ = (
        "_columns", "cut", "lock", "offsets", "steps", "reasons", "episode_values", "count",
        "num_steps", "nbytes",
    )  # fmt: skip

    def __init__(
        self,
        columns: dict[str, np.ndarray] | None,
        offsets: np.ndarray,
        steps: np.ndarray,
        reasons: np.ndarray,
        episode_values: list[dict[str, Any]],
        cut: Any = None,
        nbytes: int | None = None,
        num_steps: int | None = None,
    ):
        self._columns = columns
        self.cut = cut
        self.lock = threading.Lock() if cut is not None else None
        self.offsets = offsets
        self.steps = steps
        self.reasons = reasons
        self.episode_values = episode_values
        self.count = len(steps)
        self.num_steps = int(steps.sum()) if num_steps is None else num_steps
        if nbytes is None:
            nbytes = sum(c.nbytes for c in columns.values())
        self.nbytes = nbytes

    @property
    def columns(self) -> dict[str, np.ndarray]:
        if self.cut is not None:
            self.materialize()
        return self._columns

    @property
    def pending(self) -> bool:
        """Whether the episodes are still only rows of the ring (neither cut out nor encoded)."""
        return self.cut is not None

    def materialize(self) -> None:
        """Cuts the columns out of the ring now if it still holds them (any thread, once)."""
        if self.lock is None:
            return
        with self.lock:
            self.cut_out()

    def cut_out(self) -> None:
        """`materialize` for a caller holding `lock`."""
        if self.cut is not None:
            self._columns = self.cut.columns()
            self.cut = None

    def drop(self) -> None:
        """Lets go of the columns and the ring's rows (the records are made; `lock` held)."""
        self._columns, self.cut = {}, None

    def release(self) -> None:
        """Drops the columns once the records are written."""
        if self.lock is None:
            self._columns = {}
            return
        with self.lock:
            self.drop()


def supports(fields: list[FieldSpec]) -> bool:
    """Whether `BatchRecordEncoder` encodes episodes of these fields (else one by one)."""
    return all(
        f.kind in (FLOAT, INT) and None not in f.shape and f.dtype is not None
        for f in fields
        if f.in_steps
    )


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of `values` (as int64) and each one's length in bytes."""
    flat = values.reshape(-1)
    if flat.dtype == np.bool_:
        return flat.view(np.uint8), np.ones(len(flat), np.int64)
    arr = flat.astype(np.int64, copy=False) if flat.dtype != np.uint64 else flat.view(np.int64)
    if not len(arr) or (arr.min() >= 0 and arr.max() < 128):
        return arr.astype(np.uint8), np.ones(len(arr), np.int64)
    u = arr.view(np.uint64)
    groups = (u[:, None] >> _SHIFTS[None, :]) & np.uint64(0x7F)
    nonzero = groups != 0
    length = 10 - np.argmax(nonzero[:, ::-1], axis=1)
    length[~nonzero.any(axis=1)] = 1
    cont = _POSITIONS[None, :] < (length[:, None] - 1)
    out = (groups | (cont.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
    return out[_POSITIONS[None, :] < length[:, None]], length.astype(np.int64)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _native_column(field: FieldSpec, columns: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
    """A column as `native.encode` takes it: its payload kind and the array."""
    column = columns[field.key]
    if field.kind == FLOAT:
        return "f", np.ascontiguousarray(column, "<f4")
    if column.dtype in (np.bool_, np.uint8):
        return "B", np.ascontiguousarray(column).view(np.uint8)
    if column.dtype == np.uint64:  # varints of the bits, as the numpy path
        return "q", np.ascontiguousarray(column).view(np.int64)
    return "q", np.ascontiguousarray(column, np.int64)


class _Table:
    """Small byte strings (entry heads, record heads) kept once, by value, across batches."""

    _MAX = 256 << 10  # then it starts again (lengths seen long ago are let go)

    def __init__(self) -> None:
        self.data = bytearray()
        self._at: dict[bytes, int] = {}
        self.generation = 0

    def put(self, value: bytes) -> int:
        at = self._at.get(value)
        if at is None:
            at = self._at[value] = len(self.data)
            self.data += value
        return at

    def reset_if_full(self) -> None:
        if len(self.data) > self._MAX:
            self.data = bytearray()
            self._at.clear()
            self.generation += 1


class BatchRecordEncoder:
    """Encodes an `EpisodeBatch` into framed TFRecord records, vectorised.

    Args:
      fields: the dataset's fields in the writer's order (`EpisodeEncoder.fields`);
        `supports(fields)` must hold.
    """

    def __init__(self, fields: list[FieldSpec]):
        self.fields = fields
        self._writers = {f.key: entry_writer(f) for f in fields if not f.in_steps}
        self._heads: dict[tuple[str, int], bytes] = {}
        self.elems = {f.key: int(np.prod(f.shape, dtype=np.int64)) for f in fields if f.in_steps}
        self._table = _Table()
        # Per field: payload length -> (the head's place in the table, its length).
        self._lut: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lut_generation = 0
        # Example length -> its record prefix's (place in the table, length).
        self._prefix_lut = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        # Per-step field -> (key, Feature tag) for `native.encode`.
        self.native_heads = {
            f.key: (f.key.encode("utf-8"), 0x12 if f.kind == FLOAT else 0x1A)
            for f in fields
            if f.in_steps
        }

    def _head(self, field: FieldSpec, payload_len: int) -> bytes:
        head = self._heads.get((field.key, payload_len))
        if head is None:
            tag = b"\x12" if field.kind == FLOAT else b"\x1a"
            feature = _packed_head(tag, payload_len) if payload_len else tag + b"\x00"
            key = field.key.encode("utf-8")
            head = map_entry_header(key, len(feature) + payload_len) + feature
            if len(self._heads) >= 4096:
                self._heads.clear()
            self._heads[field.key, payload_len] = head
        return head

    def _heads_of(self, field: FieldSpec, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each payload size's entry head is in the table, and its length."""
        table = self._table
        if self._lut_generation != table.generation:
            self._lut.clear()
            self._prefix_lut = (np.zeros(0, np.int64), np.zeros(0, np.int64))
            self._lut_generation = table.generation
        at, length = self._lut.get(field.key, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        top = int(sizes.max()) + 1
        if top > len(at):
            grow = max(top, 2 * len(at))
            at = np.concatenate([at, np.full(grow - len(at), -1, np.int64)])
            length = np.concatenate([length, np.zeros(grow - len(length), np.int64)])
            self._lut[field.key] = (at, length)
        found = at[sizes]
        if (found < 0).any():
            for size in np.unique(sizes[found < 0]).tolist():
                head = self._head(field, size)
                at[size], length[size] = table.put(head), len(head)
            found = at[sizes]
        return found, length[sizes]

    def _prefixes_of(self, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each record's frame header and Example head: their place in the table, length."""
        at, length = self._prefix_lut
        top = int(totals.max()) + 1
        if top > len(at):
            grow = max(top, 2 * len(at))
            at = np.concatenate([at, np.full(grow - len(at), -1, np.int64)])
            length = np.concatenate([length, np.zeros(grow - len(length), np.int64)])
            self._prefix_lut = (at, length)
        found = at[totals]
        if (found < 0).any():
            for n in np.unique(totals[found < 0]).tolist():
                head = b"\x0a" + _varint(n)
                frame = _LEN.pack(n + len(head))
                prefix = frame + struct.pack("<I", tfrecord.masked_crc32c(frame)) + head
                at[n], length[n] = self._table.put(prefix), len(prefix)
            found = at[totals]
        return found, length[totals]

    def episode_entries(self, values: dict[str, Any]) -> dict[str, bytes]:
        out = {}
        for key, write in self._writers.items():
            parts: list[Any] = []
            write(values[key], parts)
            out[key] = b"".join(bytes(p) for p in parts)
        return out

    def encode(self, batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns `(buffer, starts, lengths)`: the framed records end to end in
        `buffer` (uint8), record `j`'s frame at `starts[j]` and its data length."""
        if native is not None:
            return self._encode_native(batch)
        return self._encode_numpy(batch)

    def _encode_native(self, batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`encode` in one call of the C extension (`_batch_records.c`)."""
        constants = {}
        fields: list[tuple[Any, ...]] = []
        for field in self.fields:
            if not field.in_steps:
                constants[field.key] = len(constants)
                fields.append((constants[field.key],))
                continue
            key, tag = self.native_heads[field.key]
            kind, column = _native_column(field, batch.columns)
            fields.append((key, tag, kind, self.elems[field.key], column))
        rows = tuple(
            tuple(entries[key] for key in constants)
            for entries in map(self.episode_entries, batch.episode_values)
        )
        buffer, starts, lengths = native.encode(
            fields,
            np.ascontiguousarray(batch.offsets, np.int64),
            np.ascontiguousarray(batch.steps, np.int64),
            np.ascontiguousarray(batch.reasons, np.int64),
            rows,
        )
        return (
            np.frombuffer(buffer, np.uint8),
            np.frombuffer(starts, np.int64),
            np.frombuffer(lengths, np.int64),
        )

    def _encode_numpy(self, batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        count = batch.count
        table = self._table
        table.reset_if_full()
        sources: list[np.ndarray] = []  # payload buffers, after the table
        segments: list[tuple[int, np.ndarray, np.ndarray]] = []  # (source, start, length)
        rows = batch.steps
        offsets = batch.offsets
        last_rows = offsets + rows - 1
        constants = [self.episode_entries(v) for v in batch.episode_values]
        for field in self.fields:
            if not field.in_steps:
                at = np.array([table.put(c[field.key]) for c in constants], np.int64)
                size = np.array([len(c[field.key]) for c in constants], np.int64)
                segments.append((-1, at[batch.reasons], size[batch.reasons]))
                continue
            column = batch.columns[field.key]
            elems = self.elems[field.key]
            if field.kind == FLOAT or column.dtype == np.bool_:
                width = elems * (4 if field.kind == FLOAT else 1)
                if field.kind == FLOAT:
                    payload = np.ascontiguousarray(column, "<f4").reshape(-1).view(np.uint8)
                else:
                    payload = column.reshape(-1).view(np.uint8)
                starts, sizes = offsets * width, rows * width
            else:
                payload, lengths = _varints(np.ascontiguousarray(column))
                if len(payload) == len(lengths):  # one byte each
                    starts, sizes = offsets * elems, rows * elems
                else:
                    ends = np.cumsum(lengths.reshape(len(column), elems).sum(1))
                    starts = ends[offsets] - lengths.reshape(len(column), elems)[offsets].sum(1)
                    sizes = ends[last_rows] - starts
            head_at, head_len = self._heads_of(field, sizes)
            segments.append((-1, head_at, head_len))
            sources.append(payload)
            segments.append((len(sources) - 1, starts, sizes))
        total = np.zeros(count, np.int64)
        for _, _, size in segments:
            total += size
        # Each record's frame header and Example head, kept by the Example's length.
        prefix_at, prefix_len = self._prefixes_of(total)
        data_len = total + prefix_len - _FRAME
        footer_at = table.put(b"\x00" * _FOOTER)
        ordered = [
            (-1, prefix_at, prefix_len),
            *segments,
            (-1, np.full(count, footer_at, np.int64), np.full(count, _FOOTER, np.int64)),
        ]
        # One source buffer: the table, then every payload.
        bases = [len(table.data)]
        for payload in sources[:-1]:
            bases.append(bases[-1] + len(payload))
        source = np.concatenate([np.frombuffer(table.data, np.uint8), *sources])
        src = np.stack([s + (0 if k < 0 else bases[k]) for k, s, _ in ordered], axis=1)
        size = np.stack([n for _, _, n in ordered], axis=1)
        src, size = src.reshape(-1), size.reshape(-1)
        out_end = np.cumsum(size)
        shift = np.repeat(src - (out_end - size), size)
        shift += np.arange(int(out_end[-1]))
        buffer = source[shift]
        record_len = _FRAME + data_len + _FOOTER
        record_start = np.cumsum(record_len) - record_len
        crc = tfrecord.masked_crc32c
        view = memoryview(buffer)
        footers = np.empty(count, "<u4")
        for j, (start, n) in enumerate(zip(record_start.tolist(), data_len.tolist())):
            footers[j] = crc(view[start + _FRAME : start + _FRAME + n])
        foot = (record_start + _FRAME + data_len)[:, None] + np.arange(_FOOTER)
        buffer[foot.reshape(-1)] = footers.view(np.uint8)
        return buffer, record_start, data_len
