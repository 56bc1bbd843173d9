"""Tests of the `builders/rlds_package` TFDS dataset builder."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from helpers_core import new_buffer  # noqa: E402

import rlds_writer  # noqa: E402

_BUILDER_DIR = Path(__file__).resolve().parents[1] / "builders" / "rlds_package"


@pytest.fixture(scope="module")
def builder_module():
    # TFDS's code-based builders import it without declaring it (the builders extra).
    pytest.importorskip("importlib_resources")
    # Loaded the way `tfds build builders/rlds_package` loads it: as the module
    # `rlds_package.rlds_package_dataset_builder` with `builders/` on sys.path.
    with tfds.core.utils.add_sys_path(_BUILDER_DIR.parent):
        module = importlib.import_module("rlds_package.rlds_package_dataset_builder")
    return module


def _record(path, seed, episodes, splits=("train",), features_shape=(3,)):
    cfg = rlds_writer.DatasetConfig(
        name="robot",
        observation_info=tfds.features.Tensor(shape=features_shape, dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"note": tfds.features.Text()},
        episode_metadata_info={"worker": np.int64},
    )
    rng = np.random.default_rng(seed)
    with rlds_writer.store.DatasetWriter(
        path, cfg, max_episodes_per_file=3, metadata={"w": seed}
    ) as w:
        for i in range(episodes):
            buffer = new_buffer(w)
            buffer.start(
                rng.normal(size=features_shape).astype(np.float32), {"note": f"{seed}-{i}"}
            )
            for t in range(int(rng.integers(1, 5))):
                obs = rng.normal(size=features_shape).astype(np.float32)
                buffer.add(t, float(rng.normal()), 1.0, obs, {"note": f"{seed}-{i}-{t}"})
            buffer.set_episode_metadata({"worker": seed})
            w.write(buffer.finish(terminated=bool(i % 2)), splits[i % len(splits)])


def _episodes(builder, split):
    out = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split)):
        steps = list(episode.pop("steps"))
        episode["steps"] = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        out.append(episode)
    return out


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["worker"] == w["worker"]
        assert set(g["steps"]) == set(w["steps"])
        for key in w["steps"]:
            np.testing.assert_array_equal(g["steps"][key], w["steps"][key], err_msg=key)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("manual")
    _record(root / "worker_0", seed=0, episodes=7, splits=("train", "test"))
    _record(root / "worker_1", seed=1, episodes=5)
    return root


def _expected(sources, split):
    want = []
    for worker in ("worker_0", "worker_1"):
        builder = tfds.builder_from_directory(str(sources / worker))
        if split in builder.info.splits:
            want.extend(_episodes(builder, split))
    return want


def test_package_several_recordings_resharded_keeps_order_and_values(
    builder_module, sources, tmp_path
):
    builder = builder_module.Builder(data_dir=str(tmp_path / "data"))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=sources, max_shard_size=1500)
    )
    loaded = tfds.builder_from_directory(builder.data_dir)
    info = loaded.info
    assert info.name == "rlds_package" and str(info.version) == "1.0.0"
    assert "Episodes recorded with rlds_writer" in info.description
    assert "@misc{rlds_package" in info.citation
    assert info.release_notes["1.0.0"].startswith("Initial release")
    assert info.metadata["w"] == 0  # metadata.json of the first source
    assert info.splits["train"].num_examples == 4 + 5
    assert info.splits["test"].num_examples == 3
    # Re-sharded by size: far more shards than the sources' 3 episodes per file.
    assert info.splits["train"].num_shards >= 3
    for split in ("train", "test"):
        _assert_same(_episodes(loaded, split), _expected(sources, split))
    # The code-based builder restores its features from the prepared data.
    again = builder_module.Builder(data_dir=str(tmp_path / "data"))
    assert again.info.features["steps"]["note"] is not None
    assert again.info.splits["test"].num_examples == 3


def test_sources_with_other_features_are_refused(builder_module, tmp_path):
    _record(tmp_path / "src" / "a", seed=0, episodes=2)
    _record(tmp_path / "src" / "b", seed=1, episodes=2, features_shape=(4,))
    builder = builder_module.Builder(data_dir=str(tmp_path / "data"))
    with pytest.raises(ValueError, match="features differ"):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=tmp_path / "src")
        )


def test_empty_manual_dir_names_what_is_missing(builder_module, tmp_path):
    builder = builder_module.Builder(data_dir=str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match="no recorded dataset"):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=tmp_path)
        )


def _tfds_cli():
    tfds_bin = Path(sys.executable).parent / "tfds"
    if not tfds_bin.exists():
        pytest.skip("the tfds command is not installed")
    try:
        import importlib_resources  # noqa: F401
        import mlcroissant  # noqa: F401
    except ImportError:
        pytest.skip("tfds build needs mlcroissant and importlib_resources (the builders extra)")
    return str(tfds_bin)


@pytest.mark.slow
def test_tfds_build_cli_array_record(sources, tmp_path):
    """`tfds build builders/rlds_package --manual_dir=...` as a user runs it."""
    data_dir = tmp_path / "data"
    cmd = [
        _tfds_cli(),
        "build",
        str(_BUILDER_DIR),
        f"--manual_dir={sources}",
        f"--data_dir={data_dir}",
        "--file_format=array_record",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = data_dir / "rlds_package" / "1.0.0"
    assert sorted(p.name for p in path.glob("*.array_record-*"))
    info = json.loads((path / "dataset_info.json").read_text())
    assert info["fileFormat"] == "array_record"
    # ArrayRecord datasets are read through TFDS data sources.
    source = tfds.builder_from_directory(str(path)).as_data_source(split="train")
    assert len(source) == 9
    first = source[0]
    want = _expected(sources, "train")[0]
    np.testing.assert_array_equal(
        np.stack([first["steps"][i]["observation"] for i in range(len(first["steps"]))]),
        want["steps"]["observation"],
    )


def test_beam_direct_runner_gives_the_same_dataset(builder_module, sources, tmp_path):
    beam = pytest.importorskip("apache_beam")
    builder = builder_module.Builder(data_dir=str(tmp_path / "data"))
    options = beam.options.pipeline_options.PipelineOptions(["--runner=DirectRunner"])
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=sources, beam_options=options)
    )
    loaded = tfds.builder_from_directory(builder.data_dir)
    for split in ("train", "test"):
        _assert_same(_episodes(loaded, split), _expected(sources, split))


def _records(path):
    """Every shard's records of a prepared package, parsed as `tf.train.Example` protos."""
    import tensorflow as tf

    out = {}
    for shard in sorted(Path(path).glob("*.tfrecord-*")):
        out[shard.name] = [
            tf.train.Example.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(str(shard))
        ]
    return out


@pytest.mark.slow
def test_beam_multi_processing_workers_build_the_same_dataset_as_one_process(
    builder_module, sources, tmp_path
):
    """`tfds build` on Beam with 2 worker processes, as on a real runner (issue 25 item 5).

    The workers are other processes: they have neither the builder's module
    (TFDS puts `builders/` on the driver's sys.path only) nor anything the
    driver imported; they import rlds_writer from their install. Before,
    they failed with `ModuleNotFoundError: No module named 'rlds_package'`.
    """
    pytest.importorskip("apache_beam")
    data_dir = tmp_path / "beam"
    cmd = [
        _tfds_cli(),
        "build",
        str(_BUILDER_DIR),
        f"--manual_dir={sources}",
        f"--data_dir={data_dir}",
        "--num_shards=3",
        "--beam_pipeline_options=runner=DirectRunner,direct_running_mode=multi_processing,"
        "direct_num_workers=2",
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    assert str(_BUILDER_DIR.parent) not in env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    single = builder_module.Builder(data_dir=str(tmp_path / "single"))
    single.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=sources, num_shards=3)
    )
    beam_dir = data_dir / "rlds_package" / "1.0.0"
    beam_info = json.loads((beam_dir / "dataset_info.json").read_text())
    single_info = json.loads((Path(single.data_dir) / "dataset_info.json").read_text())
    assert beam_info == single_info
    for name in ("features.json", "metadata.json"):
        assert (beam_dir / name).read_text() == (Path(single.data_dir) / name).read_text()
    # Shard by shard, record by record: the same episodes as protos (their
    # bytes may differ only in the order protobuf writes map entries).
    beam_records, single_records = _records(beam_dir), _records(single.data_dir)
    assert sorted(beam_records) == sorted(single_records)
    assert len(beam_records) == 2 * 3  # train and test, 3 shards each
    assert beam_records == single_records
    loaded = tfds.builder_from_directory(str(beam_dir))
    for split in ("train", "test"):
        _assert_same(_episodes(loaded, split), _expected(sources, split))


@pytest.mark.slow
def test_setup_file_ships_the_worker_code_to_a_remote_worker(builder_module, sources, tmp_path):
    """`--setup_file=<checkout>/setup.py`, as for Dataflow/Flink/Spark workers.

    Beam's own stager builds the package a remote runner installs on its
    workers; a worker with only that install (not this checkout, not
    `builders/`) reads a shard into the same examples as the driver.
    """
    pytest.importorskip("apache_beam")
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    from rlds_writer.interop import package_sources

    root = Path(__file__).resolve().parents[1]
    staging = tmp_path / "staging"
    staging.mkdir()
    options = PipelineOptions([f"--setup_file={root / 'setup.py'}", "--sdk_location=container"])
    Stager.create_job_resources(options, str(staging), log_submission_env_dependencies=False)
    (sdist,) = staging.glob("*.tar.gz")
    site = tmp_path / "worker_site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(sdist)], check=True, timeout=300)

    shards = package_sources.split_shards(package_sources.find_sources(sources))["train"]
    shard = shards[-1]  # a shard of the second source: keys continue from the first
    features_json = json.dumps(package_sources.common_features_json([Path(sources) / "worker_0"]))
    child = f"""
import sys, pickle
sys.path.insert(0, {str(site)!r})
from rlds_writer.interop import package_sources
assert package_sources.__file__.startswith({str(site)!r}), package_sources.__file__
shard = package_sources.SourceShard(**{shard.__dict__!r})
out = list(package_sources.read_shard_examples(shard, {features_json!r}))
sys.stdout.buffer.write(pickle.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, env=env, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:].decode()
    import pickle

    got = pickle.loads(proc.stdout)
    features = tfds.features.FeatureConnector.from_json(json.loads(features_json))
    want = list(package_sources.iter_examples(features, [shard]))
    assert (
        [k for k, _ in got]
        == [k for k, _ in want]
        == list(range(shard.first_key, shard.first_key + shard.num_records))
    )
    for (_, g), (_, w) in zip(got, want):
        assert g["worker"] == w["worker"]
        assert len(g["steps"]) == len(w["steps"])
        for gs, ws in zip(g["steps"], w["steps"]):
            assert set(gs) == set(ws)
            for key in ws:
                np.testing.assert_array_equal(gs[key], ws[key], err_msg=key)
