"""Records straight from a batch recorder's ring: no columns between the ring and the shard.

A batch recorder (`record.batch`) keeps every per-step field time-major, one
ring `[L, N, ...]` per field; the episodes that end on one vector step are
some rows of some columns of it. A `RingCut` says which (each episode's
sub-env, first ring row and number of rows, its end reason, and its first
observation, copied out when it ended), and the writer thread encodes the
records of every batch it finds queued in one call of `_ring_records.c`,
without the GIL and without gathering columns first: the RLDS flags come from
the lengths and end reasons. Each record is the bytes `BatchRecordEncoder`
gives for the episode's gathered columns.

Until it is encoded, a batch holds the ring's rows: before the recorder
overwrites them it cuts the columns out itself (`EpisodeBatch.materialize`,
`RingCut.columns`), under the batch's lock, which the writer thread holds
while it encodes; such a batch is encoded from its columns as any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.store.features.features import FLOAT
from rlds_writer.store.writing.batch_records import BatchRecordEncoder, EpisodeBatch, native

_FLAGS = {"is_first": 0, "is_last": 1, "is_terminal": 2}
# The struct codes `encode_ring` reads, by numpy dtype (bools as bytes, as `encode` takes them).
_SOURCES = {
    np.dtype(t): c
    for t, c in (
        (np.float32, "f"), (np.float64, "d"), (np.int8, "b"), (np.int16, "h"),
        (np.int32, "i"), (np.int64, "q"), (np.uint8, "B"), (np.bool_, "B"),
        (np.uint16, "H"), (np.uint32, "I"), (np.uint64, "Q"),
    )
}  # fmt: skip


def flag_columns(
    flag_keys: dict[str, str], offsets: np.ndarray, steps: np.ndarray, ended: np.ndarray
) -> dict[str, np.ndarray]:
    """The RLDS flags of episodes side by side (episode `j`: rows `offsets[j]` on, `steps[j]`).

    Args:
      flag_keys: flag name (`is_first`, ...) -> the dataset's key, for the flags it has.
      offsets, steps: int64 `[E]`.
      ended: bool `[E]`: the env terminated the episode (`is_terminal`).
    """
    total = int(offsets[-1] + steps[-1])
    last = offsets + steps - 1
    columns = {}
    for name, key in flag_keys.items():
        column = columns[key] = np.zeros(total, np.bool_)
        if name == "is_first":
            column[offsets] = True
        elif name == "is_last":
            column[last] = True
        else:
            column[last] = ended
    return columns


class RingSource:
    """A batch recorder's ring, as records are encoded from it (one per recorder).

    Args:
      ring: per-step field key -> its ring `[L, N, *shape]` (never reallocated).
      zeros: transition field key -> its final step's row `[1, *shape]`.
      heads: the observation-like keys, in the order of each cut's `firsts`.
      flag_keys: flag name -> the dataset's key, for the flags it has.
      episode_values: the episode-level values per end reason (the batches').
    """

    def __init__(
        self,
        ring: dict[str, np.ndarray],
        zeros: dict[str, np.ndarray],
        heads: list[str],
        flag_keys: dict[str, str],
        episode_values: list[dict[str, Any]],
    ):
        self.ring = ring
        self.zeros = zeros
        self.slots = {key: slot for slot, key in enumerate(heads)}
        self.flag_keys = flag_keys
        self.episode_values = episode_values
        self._encoder: BatchRecordEncoder | None = None
        self._arguments: tuple[list[tuple[Any, ...]], tuple[Any, ...]] | None = None

    def arguments(self, encoder: BatchRecordEncoder) -> tuple[list[tuple[Any, ...]], Any] | None:
        """`encode_ring`'s fields and constants for `encoder`'s records, or None where a
        field's values are not read from the ring as they are (then: columns)."""
        if encoder is not self._encoder:
            self._encoder, self._arguments = encoder, self._make_arguments(encoder)
        return self._arguments

    def _make_arguments(self, encoder: BatchRecordEncoder) -> Any:
        flags = {key: _FLAGS[name] for name, key in self.flag_keys.items()}
        fields: list[tuple[Any, ...]] = []
        constant_keys = []
        for field in encoder.fields:
            if not field.in_steps:
                fields.append((len(constant_keys),))
                constant_keys.append(field.key)
                continue
            key, tag = encoder.native_heads[field.key]
            ring = self.ring.get(field.key)
            if field.key in flags:
                fields.append((key, tag, flags[field.key]))
                continue
            source = _SOURCES.get(ring.dtype) if ring is not None and ring.dtype.isnative else None
            if source is None or (source in "fd") != (field.kind == FLOAT):
                return None
            slot = self.slots.get(field.key, -1)
            zero = self.zeros[field.key] if slot < 0 else None
            fields.append((key, tag, source, encoder.elems[field.key], ring, zero, slot))
        constants = tuple(
            tuple(entries[key] for key in constant_keys)
            for entries in map(encoder.episode_entries, self.episode_values)
        )
        return fields, constants


class RingCut:
    """Where the episodes of one batch are in a ring, until they are encoded."""

    __slots__ = ("source", "envs", "starts", "counts", "offsets", "steps", "reasons", "firsts")

    def __init__(
        self,
        source: RingSource,
        envs: np.ndarray,
        starts: np.ndarray,
        counts: np.ndarray,
        offsets: np.ndarray,
        steps: np.ndarray,
        reasons: np.ndarray,
        firsts: tuple[np.ndarray, ...],
    ):
        self.source = source
        self.envs = envs  # int64 [E]: each episode's sub-env
        self.starts = starts  # its first ring row (not yet modulo L)
        self.counts = counts  # its ring rows (transitions): steps - 1
        self.offsets = offsets
        self.steps = steps
        self.reasons = reasons  # 0 terminated, 1 truncated, 2 cut short
        self.firsts = firsts  # per observation-like field (`source.slots`): [E, *shape]

    def columns(self) -> dict[str, np.ndarray]:
        """The batch's columns gathered from the ring (one C call per field), flags included."""
        src, envs, starts, counts, offsets = (
            self.source,
            self.envs,
            self.starts,
            self.counts,
            self.offsets,
        )
        total = int(offsets[-1] + self.steps[-1])
        columns = {}
        for key, ring in src.ring.items():
            column = columns[key] = np.empty((total, *ring.shape[2:]), ring.dtype)
            slot = src.slots.get(key)
            if slot is None:  # the rows, then the final step's zero
                native.gather(column, ring, src.zeros[key], envs, starts, counts, offsets, 0)
            else:  # the first observation, then the rows
                native.gather(column, ring, self.firsts[slot], envs, starts, counts, offsets, 2)
        columns.update(flag_columns(src.flag_keys, offsets, self.steps, self.reasons == 0))
        return columns


def encode_batches(
    encoder: BatchRecordEncoder, batches: list[EpisodeBatch]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records of `batches`, in order, as `BatchRecordEncoder.encode` returns them.

    Those still in the ring are encoded from it in one C call, holding their
    locks (the recorder waits before it overwrites their rows), then let go of
    it; the others from their columns.
    """
    locks = [batch.lock for batch in batches if batch.lock is not None]
    for lock in locks:
        lock.acquire()
    try:
        runs: list[tuple[Any, list[EpisodeBatch]]] = []  # (arguments or None, batches)
        for batch in batches:
            cut = batch.cut
            arguments = cut.source.arguments(encoder) if cut is not None else None
            if cut is not None and arguments is None:
                batch.cut_out()  # a field the C encoder does not read as it is
            if runs and runs[-1][0] is arguments and arguments is not None:
                runs[-1][1].append(batch)
            else:
                runs.append((arguments, [batch]))
        parts = []
        for arguments, run in runs:
            if arguments is None:
                parts.append(encoder.encode(run[0]))
                continue
            fields, constants = arguments
            items = [
                (c.envs, c.starts, c.counts, c.reasons, c.firsts) for c in (b.cut for b in run)
            ]
            buffer, starts, lengths = native.encode_ring(fields, items, constants)
            parts.append((np.frombuffer(buffer, np.uint8), np.frombuffer(starts, np.int64),
                          np.frombuffer(lengths, np.int64)))  # fmt: skip
            for batch in run:
                batch.drop()
    finally:
        for lock in locks:
            lock.release()
    if len(parts) == 1:
        return parts[0]
    bases = np.cumsum([0] + [len(buffer) for buffer, _, _ in parts[:-1]])
    return (
        np.concatenate([buffer for buffer, _, _ in parts]),
        np.concatenate([starts + base for (_, starts, _), base in zip(parts, bases.tolist())]),
        np.concatenate([lengths for _, _, lengths in parts]),
    )
