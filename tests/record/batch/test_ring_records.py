"""Records encoded straight from the batch recorder's ring, and coalesced by the writer thread.

The writer thread encodes the batches it finds queued in one C call from the
time-major ring (`store.writing.ring_records`); each record must be the bytes
the batch's gathered columns encode to, whatever the dtypes, the rows
wrapping round the ring, episodes of one step and every end reason, and the
batches must land in shards of `max_episodes_per_file` episodes.
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_envs import records, waiting_batches

from rlds_writer.record.batch import BatchRecorder
from rlds_writer.record.config import recording_config
from rlds_writer.store.features import end_reasons, feature_defs
from rlds_writer.store.writing import batch_records, ring_records, split_shards
from rlds_writer.store.writing.batch_records import EpisodeBatch

N = 6

pytestmark = pytest.mark.skipif(
    batch_records.native is None, reason="the _batch_records extension is not built here"
)


def _config():
    return recording_config(
        name="ring",
        observation_info={
            "pos": feature_defs.Tensor(shape=(3,), dtype=np.float32),
            "wide": feature_defs.Tensor(shape=(2, 2), dtype=np.float64),
        },
        action_info=feature_defs.Tensor(shape=(2,), dtype=np.int64),
        reward_info=feature_defs.Scalar(dtype=np.float64),
        discount_info=feature_defs.Scalar(dtype=np.float32),
        step_metadata_info={
            "small": feature_defs.Scalar(dtype=np.uint8),
            "i8": feature_defs.Scalar(dtype=np.int8),
            "u16": feature_defs.Tensor(shape=(2,), dtype=np.uint16),
            "u64": feature_defs.Scalar(dtype=np.uint64),
            "flag": feature_defs.Scalar(dtype=np.bool_),
        },
        episode_metadata_info={end_reasons.END_REASON: feature_defs.Text()},
    )


def _record(rec: BatchRecorder, steps: int, seed: int = 0) -> None:
    """Random steps, ends (terminated or truncated) and restarts; one-step episodes too."""
    rng = np.random.default_rng(seed)

    def obs():
        metadata = {
            "small": rng.integers(0, 256, N).astype(np.uint8),  # varints of two bytes too
            "i8": rng.integers(-128, 128, N).astype(np.int8),  # negative: ten bytes
            "u16": rng.integers(0, 2**16, (N, 2)).astype(np.uint16),
            "u64": rng.integers(0, 2**63, N, dtype=np.uint64) * np.uint64(2),
            "flag": rng.integers(0, 2, N).astype(np.bool_),
        }
        pos = rng.standard_normal((N, 3)).astype(np.float32)
        return {"pos": pos, "wide": rng.standard_normal((N, 2, 2))}, metadata

    rec.begin(*obs())
    for t in range(steps):
        action = rng.integers(-(2**40), 2**40, (N, 2))
        rec.add(action, rng.standard_normal(N), rng.random(N).astype(np.float32), *obs())
        done = rng.random(N) < (0.5 if t % 7 == 0 else 0.08)  # some after one step
        if done.any():
            rec.end(done, rng.random(N) < 0.5)
            rec.begin(*obs(), mask=done)
        if t % 11 == 5:  # a restart of an open episode: it is written cut short
            rec.begin(*obs(), mask=np.arange(N) == t % N)
    for _ in range(2):  # the second cuts short an episode of its first step alone
        rec.begin(*obs(), mask=np.arange(N) == 1)


def test_records_encoded_from_the_ring_are_those_of_the_gathered_columns(tmp_path):
    rec = BatchRecorder(tmp_path / "ds", _config(), N, ring_bytes=1, queue_size=10_000)
    writer, ring = rec.writer, rec._ring
    assert rec._plan_ends and ring.size == 32  # the smallest ring: rows wrap
    writer._io_lock.acquire()  # the writer thread waits: the batches stay handed over
    try:
        _record(rec, 100)  # the rows of the last batches wrap round row 96
        batches = waiting_batches(writer)
        pending = [b for b in batches if b.pending]
        # The oldest were cut out by the env thread (their rows were overwritten), not the newest.
        assert pending and len(pending) < len(batches)
        cuts = [b.cut for b in pending]
        assert any(((c.starts % ring.size) + c.counts > ring.size).any() for c in cuts)  # wrapped
        assert any((c.counts == 0).any() for c in cuts)  # an episode of one step
        assert {r for c in cuts for r in c.reasons.tolist()} == {0, 1, 2}
        encoder = writer.batch_encoder
        fields, constants = rec._source.arguments(encoder)
        want = []
        for batch in batches:  # each one encoded from its columns
            columns = batch.cut.columns() if batch.pending else batch.columns
            alone = EpisodeBatch(
                columns, batch.offsets, batch.steps, batch.reasons, batch.episode_values
            )
            buffer, starts, lengths = encoder.encode(alone)
            want += [buffer[s : s + 16 + n].tobytes() for s, n in zip(starts, lengths)]
            if batch.pending:  # and from the ring, alone
                c = batch.cut
                got, _, _ = batch_records.native.encode_ring(
                    fields, [(c.envs, c.starts, c.counts, c.reasons, c.firsts)], constants
                )
                assert bytes(got) == buffer.tobytes()
        # All at once, as the writer thread does: ring runs and cut-out batches, in
        # order (copies: the queued ones are the writer's to write).
        copies = [
            EpisodeBatch(b._columns, b.offsets, b.steps, b.reasons, b.episode_values, b.cut, 0)
            for b in batches
        ]
        buffer, starts, lengths = ring_records.encode_batches(encoder, copies)
        got = [buffer[s : s + 16 + n].tobytes() for s, n in zip(starts, lengths)]
        assert got == want and len(got) == sum(b.count for b in batches) > 40
        assert not any(b.pending for b in copies)  # they let go of the ring's rows
    finally:
        writer._io_lock.release()
        rec.close()


def test_queued_batches_are_written_at_once_across_shard_rotations(tmp_path, monkeypatch):
    appended = []
    append = split_shards.SplitShards.append_records

    def counted(self, split, buffer, starts, lengths):
        appended.append(len(starts))
        return append(self, split, buffer, starts, lengths)

    monkeypatch.setattr(split_shards.SplitShards, "append_records", counted)
    native = split_shards.batch_records.native
    write_shards, calls = native.write_shards, []

    def counted_shards(head_fd, head_end, close_head, paths, buffer, bounds, keep_last):
        calls.append((head_fd >= 0, len(paths), keep_last))
        return write_shards(head_fd, head_end, close_head, paths, buffer, bounds, keep_last)

    monkeypatch.setattr(native, "write_shards", counted_shards)
    alone = BatchRecorder(tmp_path / "alone", _config(), N, max_episodes_per_file=7)
    _record(alone, 60)
    alone.close()
    rec = BatchRecorder(tmp_path / "held", _config(), N, max_episodes_per_file=7, queue_size=10_000)
    rec.writer._io_lock.acquire()  # the writer thread waits: the batches stay handed over
    try:
        _record(rec, 60)  # a ring this size spills nor cuts out nothing: every end is a batch
        queued = len(waiting_batches(rec.writer))
        appended.clear()  # the run alone's
        calls.clear()
    finally:
        rec.writer._io_lock.release()
    rec.flush()
    # One encode; one call without the GIL for every shard: the whole shards of 7 (files
    # made, written, closed) and the rest, in a shard left open; nothing appended from Python.
    episodes = rec.episodes_written
    assert queued > 10 and episodes > 14 and not appended
    assert calls == [(False, episodes // 7 + (episodes % 7 > 0), episodes % 7 > 0)]
    rec.close()
    assert records(tmp_path / "held") == records(tmp_path / "alone")
    lengths, _ = rec.writer.splits["train"]
    # flush() closed the shard of the rest; close() wrote the episodes still open.
    assert lengths[: episodes // 7] == [7] * (episodes // 7)
    assert sum(lengths) == alone.episodes_written > episodes
