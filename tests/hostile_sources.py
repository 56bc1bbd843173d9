"""Builders of small source files for the importers, honest and hostile.

Used by tests/test_convert_hostile.py and tests/test_fuzz_importers.py. Every
file is built in the test's tmp dir; nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

# A value no honest test file holds: its bytes must never reach an output.
MARKER = 31337.25


def victim(path: Path) -> Path:
    """An HDF5 file outside the source, full of MARKER (dataset `secret`), and a raw copy."""
    import h5py

    data = np.full((6, 3), MARKER, np.float64)
    with h5py.File(path, "w") as f:
        f["secret"] = data
    path.with_suffix(".raw").write_bytes(data.tobytes())
    return path


def marker_in(directory: Path) -> bool:
    """Whether any file under `directory` holds MARKER (as float64 or float32 bytes)."""
    needles = [np.float64(MARKER).tobytes(), np.float32(MARKER).tobytes()]
    for root, _, files in os.walk(directory):
        for name in files:
            data = Path(root, name).read_bytes()
            if any(n in data for n in needles):
                return True
    return False


def d4rl_file(path: Path, rows: int = 6, **extra) -> Path:
    """A valid D4RL file: `rows` transitions in two episodes; `extra` datasets added."""
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["observations"] = rng.standard_normal((rows, 3))
        f["actions"] = rng.standard_normal((rows, 2)).astype(np.float32)
        f["rewards"] = rng.standard_normal(rows).astype(np.float32)
        terminals = np.zeros(rows, bool)
        terminals[rows // 2 - 1] = terminals[-1] = True
        f["terminals"] = terminals
        f["timeouts"] = np.zeros(rows, bool)
        f["metadata/algorithm"] = "SAC"
        f.attrs["env"] = "Test-v0"
        for key, value in extra.items():
            f[key] = value
    return path


def hdf5_episodes_file(path: Path, episodes: int = 2) -> Path:
    """A valid robomimic-style file: `data/demo_<i>/{obs, actions, rewards, dones}`."""
    import h5py

    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        for i in range(episodes):
            g = f.create_group(f"data/demo_{i}")
            g["obs"] = rng.standard_normal((5, 3))
            g["actions"] = rng.standard_normal((4, 2)).astype(np.float32)
            g["rewards"] = rng.standard_normal(4).astype(np.float32)
            g["dones"] = np.array([0, 0, 0, 1], bool)
    return path


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def npy_header(descr: str, shape: tuple[int, ...], fortran: bool = False) -> bytes:
    """A .npy version 1.0 header (magic included) declaring `descr` and `shape`."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}
    )
    return out.getvalue()


def episode_arrays(n: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {
        "observations": rng.standard_normal((n, 3)),
        "actions": rng.standard_normal((n - 1, 2)).astype(np.float32),
        "rewards": rng.standard_normal(n - 1).astype(np.float32),
        "terminals": np.array([False] * (n - 2) + [True]),
    }


def npz_members(path: Path, members: dict[str, bytes], compress: bool = True) -> Path:
    """An .npz (a zip) of the given raw member bytes."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def deflate_bomb(path: Path, inflated: int) -> Path:
    """An .npz whose `observations.npy` holds `inflated` bytes of zeros (1/1000 of it on disk)."""
    arrays = episode_arrays()
    count = inflated // 8
    header = npy_header("<f8", (count,))
    chunk = bytes(16 << 20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open("observations.npy", "w", force_zip64=True) as member:
            member.write(header)
            left = count * 8
            while left:
                member.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
        for key in ("actions", "rewards", "terminals"):
            z.writestr(f"{key}.npy", npy_bytes(arrays[key]))
    return path


def lerobot_dir(root: Path, fps=10, tasks=None, extra_features=None) -> Path:
    """A tiny LeRobot v3.0 dataset (as another writer would make it): 2 episodes of 3 frames."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (root / "data" / "chunk-000").mkdir(parents=True)
    features = {
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
        **(extra_features or {}),
    }
    info = {
        "codebase_version": "v3.0",
        "robot_type": None,
        "total_episodes": 2,
        "total_frames": 6,
        "total_tasks": 1,
        "chunks_size": 1000,
        "fps": fps,
        "splits": {"train": "0:2"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
        "features": features,
    }
    (root / "meta" / "info.json").write_text(json.dumps(info))
    tasks = tasks if tasks is not None else {"reach": 0}
    pq.write_table(
        pa.table({"task": list(tasks), "task_index": pa.array(list(tasks.values()), pa.int64())}),
        root / "meta" / "tasks.parquet",
    )
    rng = np.random.default_rng(3)
    state = rng.standard_normal((6, 2)).astype(np.float32)
    action = rng.standard_normal((6, 2)).astype(np.float32)
    table = pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 2),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), 2),
            "next.reward": pa.array(np.arange(6, dtype=np.float32)),
            "next.done": pa.array([False, False, True] * 2),
            "timestamp": pa.array(np.array([0, 0.1, 0.2] * 2, np.float32)),
            "frame_index": pa.array([0, 1, 2] * 2, pa.int64()),
            "episode_index": pa.array([0, 0, 0, 1, 1, 1], pa.int64()),
            "index": pa.array(range(6), pa.int64()),
            "task_index": pa.array([0] * 6, pa.int64()),
        }
    )
    pq.write_table(table, root / "data" / "chunk-000" / "file-000.parquet")
    pq.write_table(
        pa.table({"episode_index": pa.array([0, 1], pa.int64()), "length": [3, 3]}),
        root / "meta" / "episodes" / "chunk-000" / "file-000.parquet",
    )
    return root


# Runs `rlds-writer ARGS` in a child and reports its exit code and how much its
# peak resident memory grew during the command (over the imports' baseline).
_MEMORY_CHILD = """
import json, resource, sys
import h5py, numpy, pyarrow.parquet
import rlds_writer.interop.formats.arrays.importer, rlds_writer.interop.formats.d4rl.importer
import rlds_writer.interop.formats.lerobot.importer
from rlds_writer.cli.main import main

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = main(sys.argv[1:])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"code": code, "baseline": before * 1024, "growth": (after - before) * 1024}))
"""


def run_cli_measured(*args: str, address_space: int = 4 << 30) -> tuple[dict, str]:
    """Runs the CLI in a child; returns ({code, baseline, growth} in bytes, stderr).

    The child's address space is capped (`address_space`) so that a regression
    fails with a MemoryError instead of exhausting the machine.
    """
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, *args],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limit,
        timeout=600,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"the child printed nothing; stderr: {done.stderr[-2000:]}"
    return json.loads(lines[-1]), done.stderr
