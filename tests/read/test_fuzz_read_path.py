"""Fuzzing the TF-free read path: crafted bytes give an RLDSWriterError, never anything else.

Three surfaces are fuzzed with hypothesis: the TFRecord framing
(`store.formats.tfrecord.tfrecord.scan` and `read_record`), the wire decoder
(`store.features.wire.parse_example` and `read.decode.Decoder.decode`, on mutated records
of a real recorded dataset and on random bytes) and `features.json` parsing
(`store.features.features.parse_features` on mutated real dicts, then decoding real
records with what it accepted). Each run must end in a clean result or an
`RLDSWriterError` subclass, within bounded memory.

The in-suite runs are short (`RLDS_FUZZ_EXAMPLES`, default 200 examples per
test). For a long local run raise it, niced, e.g.::

    RLDS_FUZZ_EXAMPLES=20000 nice -n 19 python -m pytest -q -x \
        tests/read/test_fuzz_read_path.py -k framing -p no:cacheprovider

Inputs the long runs found are kept below as `@example`s.
"""

from __future__ import annotations

import copy
import json
import os
import tracemalloc
import zlib

import numpy as np
import pytest
from helpers_core import fuzz_settings, random_episodes, write_with_rlds_writer
from helpers_fuzz import mutate
from hypothesis import example, given
from hypothesis import strategies as st

from rlds_writer.errors import RLDSWriterError
from rlds_writer.read.decode import Decoder
from rlds_writer.store.features import wire
from rlds_writer.store.features.features import parse_features
from rlds_writer.store.formats.tfrecord import tfrecord

FUZZ = fuzz_settings(200)
# Decoding a record of a few kB may take a small multiple of the largest
# legitimate value (the zlib budget is 64 MiB for unsized values); more is a bug.
MEMORY_LIMIT = 200 << 20


# --------------------------------------------------------------------------- helpers


def _within_memory(fn, *args):
    """Runs fn(*args); returns its result or the RLDSWriterError it raised; checks peak memory."""
    tracemalloc.start()
    try:
        try:
            result = fn(*args)
        except RLDSWriterError as e:
            assert "\n" not in str(e), f"error is not one line: {e!r}"
            result = e
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"{fn.__name__} peaked at {peak} bytes"
    return result


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """`data` with random bit flips, byte overwrites, truncation and insertions."""
    # A long or huge varint where a length was.
    return mutate(draw, data, [b"\xff" * 9 + b"\x01", b"\xff" * 11], width=1)


# --------------------------------------------------------------------------- framing


def _check_scan(path, data: bytes, result: tfrecord.Scan) -> None:
    """Every span is a whole record whose CRCs check; spans are ordered and never overlap."""
    end = 0
    for offset, length in result.spans:
        assert offset >= end, f"span at {offset} overlaps the one before (ends at {end})"
        record, nxt, problem = tfrecord.read_record(
            lambda o, n: data[o : o + n], offset, len(data), True
        )
        assert problem is None and len(record) == length
        end = nxt
    assert end <= len(data)
    for error in result.errors(path):
        assert isinstance(error, RLDSWriterError) and "\n" not in str(error)


def _scan_all_ways(tmp_path, data: bytes) -> dict[tuple[bool, bool], tfrecord.Scan]:
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(data)
    out = {}
    for verify in (True, False):
        for resync in (True, False):
            result = _within_memory(tfrecord.scan, path, verify, resync)
            assert isinstance(result, tfrecord.Scan), result
            if verify:
                _check_scan(path, data, result)
            out[verify, resync] = result
    return out


@FUZZ
@given(data=st.binary(max_size=4096))
@example(data=tfrecord._LEN.pack(2**60) + b"\0" * 8)
@example(data=b"\x0a" * 64)
def test_framing_scan_of_random_bytes_keeps_only_records_whose_crcs_check(tmp_path, data):
    _scan_all_ways(tmp_path, data)


@FUZZ
@given(data=st.binary(max_size=512), offset=st.integers(0, 600))
def test_framing_read_record_of_random_bytes_never_trusts_the_length(data, offset):
    data = tfrecord.frame(b"\x0a\x00") + data
    record, nxt, problem = tfrecord.read_record(
        lambda o, n: data[o : o + n], offset, len(data), True
    )
    if problem is None:
        assert record is not None and offset + tfrecord.FRAMING + len(record) == nxt <= len(data)
    else:
        assert record is None and "\n" not in problem


def _frames(payloads: list[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    spans, parts, offset = [], [], 0
    for payload in payloads:
        framed = tfrecord.frame(payload)
        spans.append((offset, len(payload)))
        parts.append(framed)
        offset += len(framed)
    return b"".join(parts), spans


# Records as TFDS writes them start with the Example's `features` tag (0x0a).
payloads = st.lists(st.binary(max_size=200).map(lambda b: b"\x0a" + b), min_size=1, max_size=8)


@FUZZ
@given(
    records=payloads,
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=4),
)
def test_framing_resync_finds_every_intact_record_after_bit_flips(tmp_path, records, flips):
    data, spans = _frames(records)
    buf = bytearray(data)
    hit = set()
    for pos, bit in flips:
        pos %= len(buf)
        buf[pos] ^= 1 << bit
        hit.add(pos)
    scans = _scan_all_ways(tmp_path, bytes(buf))
    intact = [(o, n) for o, n in spans if not any(o <= p < o + tfrecord.FRAMING + n for p in hit)]
    found = set(scans[True, True].spans)
    assert set(intact) <= found, f"lost intact records {sorted(set(intact) - found)}"
    # Without resync every intact record before the first damage is still found.
    first = min(hit)
    before = {(o, n) for o, n in intact if o + tfrecord.FRAMING + n <= first}
    assert before <= set(scans[True, False].spans)


@FUZZ
@given(records=payloads, at=st.integers(0, 10**6), garbage=st.binary(min_size=1, max_size=64))
@example(records=[b"\x0a"], at=0, garbage=b"\x0a")
def test_framing_resync_finds_every_record_after_inserted_garbage(tmp_path, records, at, garbage):
    data, spans = _frames(records)
    at %= len(data) + 1
    buf = data[:at] + garbage + data[at:]
    scans = _scan_all_ways(tmp_path, buf)
    shifted = [(o + len(garbage), n) for o, n in spans if o >= at]
    kept = [(o, n) for o, n in spans if o + tfrecord.FRAMING + n <= at]
    found = set(scans[True, True].spans)
    assert set(shifted + kept) <= found


@FUZZ
@given(records=payloads, cut=st.integers(0, 10**6))
def test_framing_truncated_file_keeps_every_whole_record_and_reports_the_tail(
    tmp_path, records, cut
):
    data, spans = _frames(records)
    cut %= len(data) + 1
    scans = _scan_all_ways(tmp_path, data[:cut])
    whole = [(o, n) for o, n in spans if o + tfrecord.FRAMING + n <= cut]
    for result in scans.values():
        assert result.spans == whole
        torn = any(o < cut < o + tfrecord.FRAMING + n for o, n in spans)
        assert (result.tail_problem is not None) == torn


# --------------------------------------------------------------------------- index cache


def _read_all(shard, count: int) -> list:
    out = []
    for i in range(count):
        try:
            out.append(shard.read(i))
        except RLDSWriterError as e:
            assert "\n" not in str(e)
            out.append(None)
    return out


# Slow: a long fuzz run (6 s under load).
@pytest.mark.slow
@FUZZ
@given(records=payloads, data=st.data())
def test_index_cache_crafted_never_gives_the_wrong_record(tmp_path, records, data):
    """A crafted `.rlds_reader_index` cache gives the right records or an error, never others."""
    from rlds_writer.store.formats.tfrecord.tfrecord_reader import TFRecordShard

    blob, _ = _frames(records)
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(blob)
    cache = tmp_path / "index" / "shard.npz"
    n = len(records)
    TFRecordShard(str(path), n, True, str(cache)).offsets()  # writes a true cache
    stat = os.stat(path)
    if data.draw(st.booleans()):
        raw = data.draw(mutated(cache.read_bytes()))
        cache.write_bytes(raw)
    else:  # well-formed arrays with crafted content and the file's true stat key
        offsets = data.draw(
            st.one_of(
                st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n),
                st.permutations(
                    [int(x) for x in TFRecordShard(str(path), n, True, None).offsets()]
                ),
            )
        )
        steps = data.draw(st.lists(st.integers(-(2**31), 2**31), min_size=n, max_size=n))
        with open(cache, "wb") as f:
            np.savez(
                f,
                stat=np.array([stat.st_size, stat.st_mtime_ns], np.int64),
                num_records=np.int64(n),
                offsets=np.array(offsets, np.int64),
                steps=np.array(steps, np.int64),
            )
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    shard = TFRecordShard(str(path), n, True, str(cache))
    got = _read_all(shard, n)
    shard.close()
    for i, (want, have) in enumerate(zip(records, got)):
        assert have is None or have == want, f"record {i}: wrong bytes from a crafted cache"
    cached = shard.cached_steps
    assert cached is None or (np.asarray(cached) >= 0).all()


# --------------------------------------------------------------------------- wire decoder


def _dataset_config():
    import tensorflow_datasets as tfds

    import rlds_writer

    enc = tfds.features.Tensor
    return rlds_writer.DatasetConfig(
        name="fuzz",
        observation_info={
            "vec": enc(shape=(3,), dtype=np.float32),
            "count": np.int64,
            "pixels": tfds.features.Image(shape=(4, 4, 3)),
            "mask": enc(shape=(2, 2), dtype=np.bool_, encoding="zlib"),
            "ragged": enc(shape=(None,), dtype=np.float32, encoding="zlib"),
            "rows": enc(shape=(None, 2), dtype=np.int16, encoding="bytes"),
            "grid": enc(shape=(None, None), dtype=np.uint8, encoding="bytes"),
            "words": enc(shape=(2,), dtype=np.object_),
        },
        action_info=tfds.features.ClassLabel(num_classes=4),
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"note": tfds.features.Text()},
        episode_metadata_info={
            "episode_id": np.int64,
            "title": tfds.features.Text(),
            "blob": enc(shape=(2, 2), dtype=np.int32, encoding="zlib"),
            "ids": enc(shape=(None,), dtype=np.int64),
            "cover": tfds.features.Image(shape=(3, 3, 3)),
        },
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(features.json dict, [record bytes]) of a small dataset recorded by TFDSBackendWriter."""
    path = tmp_path_factory.mktemp("fuzz") / "ds"
    config = _dataset_config()
    write_with_rlds_writer(path, config, random_episodes(config, np.random.default_rng(3)))
    features = json.loads((path / "features.json").read_text())
    records = []
    for shard in sorted(path.glob("*.tfrecord*")):
        with open(shard, "rb") as f:
            records.extend(data for _, data in tfrecord.iter_records(f, str(shard)))
    assert len(records) == 3
    decoder = Decoder(parse_features(features))
    for record in records:  # the unmutated records decode
        decoder.decode(record, "fixture")
    return features, records


def _decode_everything(decoder: Decoder, buf: bytes) -> None:
    located = wire.parse_example(buf)
    for loc in located.values():
        wire.count_values(buf, loc)
    decoder.num_steps(buf, "fuzz")
    decoder.decode(buf, "fuzz")


def _wire_outcome(decoder: Decoder, buf: bytes) -> None:
    _within_memory(_decode_everything, decoder, buf)


@FUZZ
@given(data=st.data())
def test_wire_decoder_on_mutated_real_records_raises_only_our_errors(recorded, data):
    features, records = recorded
    record = data.draw(st.sampled_from(records))
    _wire_outcome(Decoder(parse_features(features)), data.draw(mutated(record)))


@FUZZ
@given(buf=st.binary(max_size=2048))
@example(buf=b"\x0a\x05\x0a\x03\x0a\x01\xff")
@example(buf=b"\x0a\x80")
def test_wire_decoder_on_random_bytes_raises_only_our_errors(recorded, buf):
    features, _ = recorded
    _wire_outcome(Decoder(parse_features(features)), buf)


@FUZZ
@given(data=st.data())
def test_wire_decoder_on_spliced_zlib_and_lists_raises_only_our_errors(recorded, data):
    """A real record whose one list payload is replaced by crafted bytes (zlib bombs, varints)."""
    features, records = recorded
    record = data.draw(st.sampled_from(records))
    located = sorted(wire.parse_example(record).items())
    key, (_, start, end) = data.draw(st.sampled_from(located))
    crafted = data.draw(
        st.one_of(
            st.binary(max_size=64),
            st.builds(lambda n: _bytes_list(zlib.compress(b"\0" * n)), st.integers(0, 1 << 22)),
            st.builds(lambda v: b"\x0a" + _varint(len(v)) + v, st.binary(max_size=40)),
        )
    )
    payload = record[:start] + crafted + record[end:]
    # Fix the enclosing lengths is not attempted: broken framing is part of the fuzz.
    _wire_outcome(Decoder(parse_features(features)), payload)
    del key


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bytes_list(value: bytes) -> bytes:
    return b"\x0a" + _varint(len(value)) + value


# --------------------------------------------------------------------------- features.json


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([-1, 0, 1, 2**31, 2**32, 2**63, -(2**63)])
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["float32", "uint8", "string", "zlib", "bytes", "Tensor", "Image"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_features(draw, features: dict) -> dict:
    config = copy.deepcopy(features)
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(config) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = config
        for k in path[:-1]:
            parent = parent[k]
        last = path[-1]
        op = draw(st.sampled_from(["delete", "replace", "nest", "number", "dup"]))
        if op == "delete":
            del parent[last]
        elif op == "replace":
            parent[last] = draw(json_values)
        elif op == "nest":  # the node wrapped in itself, past the reader's depth limit (64)
            node = parent[last]
            # Up to 80 per op keeps the test's own deepcopy ("dup") within Python's recursion limit.
            for _ in range(draw(st.integers(1, 80))):
                node = {"featuresDict": {"features": {"x": node}}}
            parent[last] = node
        elif op == "number":
            parent[last] = draw(
                st.sampled_from([-5, -1, 0, 2**32, 2**63, -(2**63), 10**30, 1.5, "7", "-5", True])
            )
        else:
            parent[last] = copy.deepcopy(parent[last])
            if isinstance(parent[last], list):
                parent[last] = parent[last] * draw(st.integers(0, 5))
    return config


def _parse_and_decode(config, records):
    parsed = parse_features(config)
    decoder = Decoder(parsed)
    for record in records:
        try:
            _decode_everything(decoder, record)
        except RLDSWriterError:
            pass
    return parsed


# Slow: a long fuzz run (9 s under load).
@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_features_json_mutated_raises_only_our_errors_and_decodes_safely(recorded, data):
    features, records = recorded
    config = data.draw(mutated_features(features))
    _within_memory(_parse_and_decode, config, records)


@FUZZ
@given(config=json_values)
@example(config=[])
@example(config={"pythonClassName": "x.FeaturesDict", "featuresDict": {"features": []}})
def test_features_json_random_values_raise_only_our_errors(config):
    _within_memory(parse_features, config)
