"""Fuzzing the importers' parsers: any input ends in episodes or one-line RLDSWriterError.

Extends tests/read/test_fuzz_read_path.py to the files `convert` reads:

* `.npy` headers (generated header dicts: dtypes, shapes, orders, lengths of
  data) as `.npz` members and as `.npy` files, and byte mutations of a real
  `.npz`;
* HDF5 layouts built with h5py: the D4RL datasets and an episode group
  present or not, with any row count, huge unallocated shapes, scalars,
  empty dataspaces, strings, compound and variable-length dtypes, soft, hard
  and external links (cycles included), attributes;
* LeRobot metadata: `info.json` with values replaced at any path,
  `tasks.parquet` and `meta/episodes` rows with any index, byte mutations of
  the Parquet files.

Each input goes through the importer's episode reader and the schema pass of
`convert` (`source_schema.infer_schema`); it must end in data or an
`RLDSWriterError` whose message is one line, never another exception, with a
traced peak below `MEMORY_LIMIT`. In-suite runs are short
(`RLDS_FUZZ_EXAMPLES`, default 100 per test); for a long run::

    RLDS_FUZZ_EXAMPLES=5000 nice -n 19 python -m pytest -q -x \
        tests/interop/test_fuzz_importers.py -p no:cacheprovider

Byte mutations of a real D4RL HDF5 file run in a child process (seeded, not
hypothesis): libhdf5 is C, and should it abort on a corrupt file the child
reports which input did it instead of taking pytest down.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
import zipfile

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers_core import fuzz_settings
from helpers_fuzz import mutate
from hostile_sources import (
    d4rl_file,
    episode_arrays,
    lerobot_dir,
    npy_bytes,
    victim,
)
from hypothesis import event, given
from hypothesis import strategies as st

from rlds_writer.errors import RLDSWriterError
from rlds_writer.interop import hdf5_source
from rlds_writer.interop.formats.arrays import importer as array_episodes
from rlds_writer.interop.formats.d4rl import importer as d4rl
from rlds_writer.interop.formats.lerobot import importer as lerobot
from rlds_writer.interop.source_limits import Budget
from rlds_writer.interop.source_schema import infer_schema

FUZZ = fuzz_settings(100)
EXAMPLES = FUZZ.max_examples
# The honest inputs are a few kB; the budget's allowance is 64 MiB. More is a bug.
MEMORY_LIMIT = 200 << 20
HUGE = st.sampled_from([2**31, 2**36, 2**40, 2**62, 10**11])


def _ends_cleanly(fn, *args, record=True):
    """Runs fn(*args) and the schema pass over what it yields; returns the error or None."""
    tracemalloc.start()
    try:
        try:
            infer_schema(fn(*args))
            result = None
        except RLDSWriterError as e:
            assert "\n" not in str(e), f"error is not one line: {e!r}"
            result = e
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"peaked at {peak} bytes"
    if record:  # hypothesis's statistics: how many inputs gave data, and which errors
        event(f"{fn.__name__}: {type(result).__name__ if result else 'data'}")
    return result


def _fresh(tmp_path, name):
    path = tmp_path / name
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return path


# --------------------------------------------------------------------------- npy / npz

DESCRS = ["<f8", ">f4", "|u1", "<i8", "|b1", "<c16", "|O", "|V0", "|S0", "<U3", "|S5", "<f2",
          "[('a', '<f4')]", "<m8[s]", "|V8", "bogus", "<f8 ", ""]  # fmt: skip


@st.composite
def npy_headers(draw) -> bytes:
    """A .npy member: a generated header and some data (its length honest or not)."""
    descr = draw(st.sampled_from(DESCRS))
    shape = draw(
        st.one_of(
            st.lists(st.integers(0, 6), max_size=3).map(tuple),
            st.lists(st.one_of(st.integers(-3, 6), HUGE), min_size=1, max_size=3).map(tuple),
            st.sampled_from(["(3,)", "[3]", "None", "(2.5,)", "('a',)", "3"]),
        )
    )
    fortran = draw(st.sampled_from(["False", "True", "1", "'x'"]))
    shape_text = shape if isinstance(shape, str) else repr(tuple(shape))
    descr_text = descr if descr.startswith("[") else repr(descr)
    header = f"{{'descr': {descr_text}, 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    if draw(st.booleans()):
        header = header.replace("'shape'", draw(st.sampled_from(["'shap'", "'descr'"])))
    body = header.encode("latin1")
    body += b" " * ((-(len(body) + 11)) % 64) + b"\n"
    version = draw(st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x09\x00"]))
    length = len(body).to_bytes(2 if version == b"\x01\x00" else 4, "little")
    data_len = draw(st.one_of(st.integers(0, 256), st.sampled_from([15, 24, 40, 120])))
    fill = draw(st.sampled_from([b"\0", b"\x01", b"\xff"]))
    return b"\x93NUMPY" + version + length + body + fill * data_len


@FUZZ
@given(member=npy_headers(), as_npz=st.booleans(), key=st.sampled_from(["observations", "rewards"]))
def test_npy_headers_end_in_data_or_one_line_error(tmp_path, member, as_npz, key):
    arrays = episode_arrays()
    src = _fresh(tmp_path, "src")
    src.mkdir()
    if as_npz:
        with zipfile.ZipFile(src / "0.npz", "w", zipfile.ZIP_DEFLATED) as z:
            for k, v in arrays.items():
                z.writestr(f"{k}.npy", member if k == key else npy_bytes(v))
    else:
        (src / "ep0").mkdir()
        for k, v in arrays.items():
            (src / "ep0" / f"{k}.npy").write_bytes(member if k == key else npy_bytes(v))
    _ends_cleanly(array_episodes._npz_episodes, str(src), {}, None)


def _mutate(draw, data: bytes) -> bytes:
    # A size field: zip sizes and offsets, Parquet lengths.
    return mutate(draw, data, [b"\xff\xff\xff\xff", b"\0\0\0\x7f"], width=4)


def _npz_bytes(compress: bool) -> bytes:
    out = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(out, **episode_arrays())
    return out.getvalue()


NPZ = {True: _npz_bytes(True), False: _npz_bytes(False)}


@FUZZ
@given(data=st.data(), compress=st.booleans())
def test_mutated_npz_files_end_in_data_or_one_line_error(tmp_path, data, compress):
    src = _fresh(tmp_path, "src")
    src.mkdir()
    (src / "0.npz").write_bytes(_mutate(data.draw, NPZ[compress]))
    _ends_cleanly(array_episodes._npz_episodes, str(src), {}, None)


# --------------------------------------------------------------------------- HDF5 layouts

D4RL_KEYS = ["observations", "actions", "rewards", "terminals", "timeouts", "next_observations"]


@st.composite
def hdf5_datasets(draw, rows: int):
    """(kind, args) of one dataset: honest, mis-sized, huge, scalar, empty or odd dtype."""
    kind = draw(
        st.sampled_from(
            [
                "rows",
                "rows",
                "off_by_one",
                "huge",
                "scalar",
                "empty",
                "string",
                "vlen",
                "compound",
                "bool",
                "soft",
                "hard_group",
            ]  # fmt: skip
        )
    )
    width = draw(st.integers(0, 3))
    if kind == "off_by_one":
        rows += draw(st.sampled_from([-1, 1]))
    return kind, max(rows, 0), width, draw(HUGE)


def _make(f, key, spec):
    kind, rows, width, huge = spec
    shape = (rows,) if width == 0 else (rows, width)
    if kind in ("rows", "off_by_one"):
        f[key] = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    elif kind == "bool":
        f[key] = np.arange(rows) % 3 == 2
    elif kind == "huge":
        f.create_dataset(key, shape=(huge, *shape[1:]), dtype="f4", chunks=(64, *shape[1:]))
    elif kind == "scalar":
        f[key] = 1.5
    elif kind == "empty":
        f.create_dataset(key, data=h5py.Empty("f4"))
    elif kind == "string":
        f[key] = np.array([b"ab"] * rows)
    elif kind == "vlen":
        ds = f.create_dataset(key, (rows,), dtype=h5py.vlen_dtype(np.float32))
        for i in range(rows):
            ds[i] = np.arange(i % 3, dtype=np.float32)
    elif kind == "compound":
        f[key] = np.zeros(rows, dtype=[("a", "<f4"), ("b", "<i2")])
    elif kind == "soft":
        f[key] = h5py.SoftLink(f"/{'observations' if key != 'observations' else 'rewards'}")
    else:  # a group where a dataset belongs, linking back to the root
        g = f.create_group(key)
        g["up"] = f["/"]


@FUZZ
@given(
    data=st.data(),
    rows=st.integers(0, 8),
    extras=st.lists(
        st.sampled_from(
            [
                "cycle",
                "soft_cycle",
                "external",
                "dangling",
                "deep",
                "attrs",
                "infos",
                "metadata_big",
                "vds",
            ]
        ),  # fmt: skip
        max_size=3,
    ),
)
def test_hdf5_layouts_end_in_data_or_one_line_error(tmp_path, data, rows, extras):
    secret = victim(tmp_path / "victim.h5")
    src = _fresh(tmp_path, "d4rl.hdf5")
    present = data.draw(st.lists(st.sampled_from(D4RL_KEYS), unique=True, min_size=3))
    # Half the files have honest core datasets, so that the extras reach the data path.
    honest = data.draw(st.booleans())
    with h5py.File(src, "w") as f:
        for key in present:
            if honest and key in ("terminals", "timeouts"):
                spec = ("bool", rows, 0, 0)
            elif honest:
                spec = ("rows", rows, data.draw(st.integers(0, 3)), 0)
            else:
                spec = data.draw(hdf5_datasets(rows))
            _make(f, key, spec)
        if honest:
            for key in ("observations", "actions", "rewards", "terminals"):
                if key not in f:
                    _make(f, key, ("bool" if key == "terminals" else "rows", rows, 0, 0))
        for extra in extras:
            if extra == "cycle" and "loop" not in f:
                f["loop/a/back"] = h5py.SoftLink("/loop") if rows % 2 else f.require_group("loop")
            elif extra == "soft_cycle" and "s" not in f:
                f["s"] = h5py.SoftLink("/s")
            elif extra == "external" and "ext" not in f:
                f["ext"] = h5py.ExternalLink(str(secret), "/secret")
            elif extra == "dangling" and "dangle" not in f:
                f["dangle"] = h5py.SoftLink("/nowhere")
            elif extra == "deep" and "deep" not in f:
                f.create_group("deep" + "/d" * 200)
            elif extra == "attrs":
                f.attrs["x"] = np.arange(rows)
                f.attrs["s"] = "text"
            elif extra == "infos" and "infos" not in f:
                f["infos/q"] = np.zeros((rows, 2))
            elif extra == "metadata_big" and "metadata" not in f:
                f.create_dataset("metadata/big", shape=(10**9,), dtype="f8", chunks=(1024,))
            elif extra == "vds" and "v" not in f:
                layout = h5py.VirtualLayout(shape=(6, 3), dtype="f8")
                layout[:] = h5py.VirtualSource(str(secret), "secret", shape=(6, 3))
                f.create_virtual_dataset("v", layout)
    error = _ends_cleanly(d4rl.read_episodes, src)
    if error is None:  # convert reads the metadata too
        with hdf5_source.open_file(src, "a D4RL file") as f:
            d4rl._metadata(f, str(src), Budget(src, None))
    if error is None and ("external" in extras or "vds" in extras):
        raise AssertionError("a file linking to another converted")
    # The generic importer reads the same file as episode groups under the root.
    _ends_cleanly(array_episodes._hdf5_episodes, str(src), {}, "/", None)


# --------------------------------------------------------------------------- LeRobot metadata

HOSTILE_VALUES = [0, -1, None, "x", 1e308, float("nan"), True, [], {}, [10**12], 10**20, [-1],
                  "v3.0", {"dtype": "float32", "shape": [10**12]}, ["a"], 2**63]  # fmt: skip


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _set(node, path, value):
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


@FUZZ
@given(data=st.data())
def test_lerobot_metadata_ends_in_data_or_one_line_error(tmp_path, data):
    root = lerobot_dir(_fresh(tmp_path, "lerobot"))
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    for _ in range(data.draw(st.integers(0, 3))):
        paths = [p for p in _paths(info) if p]
        path = data.draw(st.sampled_from(paths))
        _set(info, path, copy.deepcopy(data.draw(st.sampled_from(HOSTILE_VALUES))))
    info_path.write_text(json.dumps(info))
    what = data.draw(st.sampled_from(["tasks", "episodes", "data", "tasks_bytes", "none"]))
    if what == "tasks":
        index = data.draw(st.lists(st.one_of(st.integers(-2, 3), HUGE), min_size=0, max_size=3))
        pq.write_table(
            pa.table({"task": [f"t{i}" for i in range(len(index))], "task_index": index}),
            root / "meta" / "tasks.parquet",
        )
    elif what == "episodes":
        values = st.one_of(st.integers(-2, 4), HUGE, st.none())
        n = data.draw(st.integers(0, 3))
        pq.write_table(
            pa.table(
                {
                    "episode_index": data.draw(st.lists(values, min_size=n, max_size=n)),
                    "length": data.draw(st.lists(values, min_size=n, max_size=n)),
                }
            ),
            root / "meta" / "episodes" / "chunk-000" / "file-000.parquet",
        )
    elif what in ("data", "tasks_bytes"):
        file = (
            root / "data" / "chunk-000" / "file-000.parquet"
            if what == "data"
            else root / "meta" / "tasks.parquet"
        )
        file.write_bytes(_mutate(data.draw, file.read_bytes()))
    _ends_cleanly(lerobot.read_episodes, root)


def test_the_honest_inputs_of_the_fuzzers_convert(tmp_path):
    """The fuzzers start from inputs that read: their errors come from the mutations."""
    src = tmp_path / "npz"
    src.mkdir()
    (src / "0.npz").write_bytes(NPZ[True])
    assert _ends_cleanly(array_episodes._npz_episodes, str(src), {}, None, record=False) is None
    assert _ends_cleanly(d4rl.read_episodes, d4rl_file(tmp_path / "d.hdf5"), record=False) is None
    assert _ends_cleanly(lerobot.read_episodes, lerobot_dir(tmp_path / "lr"), record=False) is None


# --------------------------------------------------------------------------- HDF5 bytes

_HDF5_BYTES_CHILD = r"""
import json, random, sys, tracemalloc
from pathlib import Path
from hostile_sources import d4rl_file
from rlds_writer.errors import RLDSWriterError
from rlds_writer.interop.formats.arrays import importer as array_episodes
from rlds_writer.interop.formats.d4rl import importer as d4rl
from rlds_writer.interop.source_schema import infer_schema

tmp, count = Path(sys.argv[1]), int(sys.argv[2])
base = d4rl_file(tmp / "base.hdf5").read_bytes()
outcomes, peak = {}, 0
for seed in range(count):
    rng = random.Random(seed)
    buf = bytearray(base)
    for _ in range(rng.randint(1, 6)):
        pos = rng.randrange(len(buf))
        op = rng.choice(["flip", "byte", "size"])
        if op == "flip":
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == "byte":
            buf[pos] = rng.randrange(256)
        else:
            buf[pos : pos + 4] = rng.choice([b"\xff\xff\xff\xff", b"\0\0\0\x7f"])
    path = tmp / "mutated.hdf5"
    path.write_bytes(bytes(buf))
    print("input", seed, flush=True, file=sys.stderr)
    for read in (lambda: d4rl.read_episodes(path),
                 lambda: array_episodes._hdf5_episodes(str(path), {}, "/", None)):
        tracemalloc.start()
        try:
            infer_schema(read())
            outcome = "data"
        except RLDSWriterError as e:
            assert "\n" not in str(e), repr(e)
            outcome = type(e).__name__
        finally:
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
print(json.dumps({"outcomes": outcomes, "peak": peak}))
"""


def test_byte_mutated_hdf5_files_end_in_data_or_one_line_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _HDF5_BYTES_CHILD, str(tmp_path), str(EXAMPLES)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    last = [line for line in done.stderr.splitlines() if line.startswith("input ")][-1:]
    assert done.returncode == 0, f"after {last}: {done.stderr[-3000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"byte-mutated HDF5, {EXAMPLES} inputs x 2 readers: {result}")
    assert result["peak"] < MEMORY_LIMIT
    assert sum(result["outcomes"].values()) == 2 * EXAMPLES
    assert result["outcomes"].get("data") and len(result["outcomes"]) > 1
