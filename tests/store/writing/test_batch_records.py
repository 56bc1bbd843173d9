"""Episodes encoded together (`EpisodeBatch`) are the records each one encoded alone gives."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlds_writer.record.config import recording_config
from rlds_writer.store.features import end_reasons, feature_defs
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.writing import batch_records
from rlds_writer.store.writing.batch_records import EpisodeBatch, supports
from rlds_writer.store.writing.writer import DatasetWriter


def _config():
    return recording_config(
        name="batch",
        observation_info={
            "pos": feature_defs.Tensor(shape=(3,), dtype=np.float32),
            "wide": feature_defs.Tensor(shape=(2, 2), dtype=np.float64),
        },
        action_info=feature_defs.Tensor(shape=(2,), dtype=np.int64),
        reward_info=feature_defs.Scalar(dtype=np.float32),
        discount_info=feature_defs.Scalar(dtype=np.float32),
        step_metadata_info={
            "big": feature_defs.Scalar(dtype=np.int64),
            "small": feature_defs.Scalar(dtype=np.uint8),
            "flag": feature_defs.Scalar(dtype=np.bool_),
        },
        episode_metadata_info={end_reasons.END_REASON: feature_defs.Text()},
    )


def _batch(writer: DatasetWriter, steps: list[int], seed: int = 0) -> EpisodeBatch:
    rng = np.random.default_rng(seed)
    total = sum(steps)
    columns = {}
    for field in writer.encoder.step_fields:
        shape = (total, *field.shape)
        if field.dtype == np.bool_:
            columns[field.key] = rng.integers(0, 2, shape).astype(np.bool_)
        elif field.key.endswith("big") or field.key.endswith("action"):
            # Negative and multi-byte varints, not only one-byte ones.
            columns[field.key] = rng.integers(-(2**40), 2**40, shape).astype(field.dtype)
        elif field.dtype.kind in "iu":
            columns[field.key] = rng.integers(0, 200, shape).astype(field.dtype)
        else:
            columns[field.key] = rng.standard_normal(shape).astype(field.dtype)
    steps_arr = np.array(steps, np.int64)
    offsets = np.cumsum(steps_arr) - steps_arr
    reasons = np.arange(len(steps)) % 3
    values = [{end_reasons.END_REASON: r.encode()} for r in ("terminated", "truncated", "cut")]
    return EpisodeBatch(columns, offsets, steps_arr, reasons, values)


@pytest.fixture(params=["c", "numpy"])
def encoding(request, monkeypatch):
    """Each test runs on the C extension (`_batch_records.c`) and on the numpy path."""
    if request.param == "c" and batch_records.native is None:
        pytest.skip("the _batch_records extension is not built here")
    if request.param == "numpy":
        monkeypatch.setattr(batch_records, "native", None)
    return request.param


def test_each_record_of_a_batch_is_the_episode_encoded_alone(tmp_path, encoding):
    with DatasetWriter(tmp_path / "ds", _config()) as writer:
        assert supports(writer.encoder.fields)
        steps = [1, 2, 5, 1, 40, 3]
        batch = _batch(writer, steps)
        buffer, starts, lengths = writer.batch_encoder.encode(batch)
        for j, n in enumerate(steps):
            lo = int(batch.offsets[j])
            alone = writer.encoder.encode(
                {k: c[lo : lo + n] for k, c in batch.columns.items()},
                batch.episode_values[batch.reasons[j]],
            )
            start = int(starts[j]) + 12
            assert buffer[start : start + int(lengths[j])].tobytes() == alone


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_a_batch_fills_shards_of_the_usual_size(tmp_path, file_format):
    from rlds_writer.read import open_dataset

    with DatasetWriter(
        tmp_path / "ds", _config(), max_episodes_per_file=3, file_format=file_format
    ) as writer:
        writer.write(_batch(writer, [2, 3, 1, 4, 2, 2, 5]))
        writer.write(_batch(writer, [1, 6, 2], seed=1))
    assert writer.episodes_written == 10 and writer.steps_written == 28
    lengths, _ = writer.splits["train"]
    assert lengths == [3, 3, 3, 1]
    episodes = list(open_dataset(tmp_path / "ds").episodes("train"))
    assert [len(e["steps"]["reward"]) for e in episodes] == [2, 3, 1, 4, 2, 2, 5, 1, 6, 2]


def test_the_batch_encoder_checksums_with_crc32c_and_does_not_load_without_it(tmp_path):
    # One masked CRC-32C in C: _crc32c's, taken at module init through its
    # capsule (_crc32c.h). Where _crc32c does not load, or is a build of another
    # interface version, neither does the encoder, and numpy frames the records
    # (the identity test above runs that path).
    if batch_records.native is None:
        pytest.skip("the _batch_records extension is not built here")
    # A _crc32c whose capsule is of another version, built here.
    source = Path(tfrecord.__file__).parent
    shutil.copy(source / "_crc32c.c", tmp_path)
    header = (source / "_crc32c.h").read_text()
    version = re.compile(r"^#define CRC32C_API_VERSION (\d+)$", re.MULTILINE)
    ours = int(version.search(header)[1])
    (tmp_path / "_crc32c.h").write_text(
        version.sub(f"#define CRC32C_API_VERSION {ours + 1}", header, count=1)
    )
    (tmp_path / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(name='other', ext_modules=[Extension('_crc32c', ['_crc32c.c'])])\n"
    )
    build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    subprocess.run(build, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    (other,) = tmp_path.glob("_crc32c.*.so")
    script = (
        "import importlib.util, sys\n"
        "name = 'rlds_writer.store.formats.tfrecord._crc32c'\n"
        "if sys.argv[1] == 'none':\n"
        "    sys.modules[name] = None\n"
        "elif sys.argv[1] != 'built':\n"
        "    spec = importlib.util.spec_from_file_location(name, sys.argv[1])\n"
        "    sys.modules[name] = importlib.util.module_from_spec(spec)\n"
        "try:\n"
        "    import rlds_writer.store.writing._batch_records\n"  # first thing: by name
        "    print('loaded')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    said = {}
    for case in ("built", "none", str(other)):
        done = subprocess.run(
            [sys.executable, "-c", script, case],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        said[case] = done.stdout.strip()
    assert said["built"] == "loaded", said
    assert "halted; None in sys.modules" in said["none"], said
    assert said[str(other)].endswith(
        f"C_API is version {ours + 1}, {ours} expected: rebuild the extensions"
    )
