"""The numpy reader (`rlds_writer.read.reader`) against TFDS's own decoding.

Every test writes tiny datasets with rlds_writer and with TFDS's own
`SequentialWriter`, decodes them with our reader, and compares field by field
(dtype, shape, value) with `tfds.builder_from_directory(...).as_dataset()`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers_core import (
    EpisodeSpec,
    load_episodes,
    random_numbers,
    random_text,
    write_with_rlds_writer,
    write_with_tfds,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import rlds_writer
from rlds_writer.read import reader as reader_lib
from rlds_writer.store.features import wire
from rlds_writer.store.formats.tfrecord.tfrecord import CorruptRecordError

NUMERIC_DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


def _all_kinds_config():
    import tensorflow_datasets as tfds

    F = tfds.features  # noqa: N806 - reads like the TFDS docs
    obs = {np.dtype(d).name: F.Tensor(shape=(2,), dtype=d) for d in NUMERIC_DTYPES}
    obs.update(
        {
            "matrix": F.Tensor(shape=(2, 3), dtype=np.float32),
            "bytes_f64": F.Tensor(shape=(3,), dtype=np.float64, encoding="bytes"),
            "bytes_bool": F.Tensor(shape=(4,), dtype=np.bool_, encoding="bytes"),
            "zlib_u64": F.Tensor(shape=(2, 2), dtype=np.uint64, encoding="zlib"),
            "png": F.Image(shape=(6, 5, 3), encoding_format="png"),
            "gray": F.Image(shape=(6, 5, 1), encoding_format="png"),
            "jpeg": F.Image(shape=(8, 8, 3), encoding_format="jpeg"),
            "gray16": F.Image(shape=(4, 3, 1), dtype=np.uint16),
            "float_img": F.Image(shape=(3, 2, 1), dtype=np.float32),
            "text": F.Text(),
            "strings": F.Tensor(shape=(2,), dtype=np.object_),
            "label": F.ClassLabel(num_classes=5),
            "nested": {"inner": {"x": F.Scalar(dtype=np.int32)}},
        }
    )
    return rlds_writer.DatasetConfig(
        name="kinds",
        observation_info=obs,
        action_info=F.Scalar(dtype=np.int64),
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"info_text": F.Text(), "info_val": np.float64},
        episode_metadata_info={
            "ep_id": np.int64,
            "ep_name": F.Text(),
            "ep_vec": F.Tensor(shape=(3,), dtype=np.float64),
            "ep_img": F.Image(shape=(4, 4, 3)),
            "ep_nested": {"a": np.uint64},
            "ep_raw": F.Tensor(shape=(2,), dtype=np.int16, encoding="zlib"),
            "ep_list": F.Tensor(shape=(None,), dtype=np.int32),
        },
    )


def _all_kinds_obs(rng):
    obs = {np.dtype(d).name: random_numbers(rng, (2,), d) for d in NUMERIC_DTYPES}
    obs.update(
        {
            "matrix": random_numbers(rng, (2, 3), np.float32),
            "bytes_f64": random_numbers(rng, (3,), np.float64),
            "bytes_bool": random_numbers(rng, (4,), np.bool_),
            "zlib_u64": random_numbers(rng, (2, 2), np.uint64),
            "png": rng.integers(0, 256, (6, 5, 3), dtype=np.uint8),
            "gray": rng.integers(0, 256, (6, 5, 1), dtype=np.uint8),
            "jpeg": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
            "gray16": rng.integers(0, 2**16, (4, 3, 1), dtype=np.uint16),
            "float_img": rng.normal(size=(3, 2, 1)).astype(np.float32),
            "text": random_text(rng),
            "strings": np.array([random_text(rng).encode(), b"x"], dtype=object),
            "label": int(rng.integers(0, 5)),
            "nested": {"inner": {"x": np.int32(rng.integers(-9, 9))}},
        }
    )
    return obs


def _all_kinds_episodes(n=4, seed=0):
    rng = np.random.default_rng(seed)
    episodes = []
    for k in range(n):
        length = 1 + k  # transitions; one-step episodes included
        meta = [
            {"info_text": random_text(rng), "info_val": float(rng.normal())}
            for _ in range(length + 1)
        ]
        episodes.append(
            EpisodeSpec(
                observations=[_all_kinds_obs(rng) for _ in range(length + 1)],
                actions=[np.int64(rng.integers(-5, 5)) for _ in range(length)],
                rewards=[np.float32(rng.normal()) for _ in range(length)],
                discounts=[np.float32(1.0)] * length,
                step_metadata=meta,
                episode_metadata={
                    "ep_id": np.int64(k),
                    "ep_name": f"episode {k} é",
                    "ep_vec": rng.normal(size=3),
                    "ep_img": rng.integers(0, 256, (4, 4, 3), dtype=np.uint8),
                    "ep_nested": {"a": np.uint64(2**64 - 1 - k)},
                    "ep_raw": np.array([k, -k], np.int16),
                    "ep_list": np.arange(k, dtype=np.int32) - 1,
                },
                terminated=k % 2 == 0,
            )
        )
    return episodes


def _columnar(steps):
    """TFDS's per-step dicts -> our layout: one array per field, time axis first."""
    first = steps[0]
    out = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = _columnar([s[key] for s in steps])
        elif isinstance(value, bytes):
            col = np.empty(len(steps), object)
            col[:] = [s[key] for s in steps]
            out[key] = col
        elif len({np.shape(s[key]) for s in steps}) > 1:  # varying shapes: a list
            out[key] = [s[key] for s in steps]
        else:
            out[key] = np.stack([s[key] for s in steps])
    return out


def assert_identical(ours, ref, path=""):
    """Keys, python types, dtypes, shapes and values all equal."""
    if isinstance(ref, dict):
        assert isinstance(ours, dict), f"{path}: {type(ours)}"
        assert sorted(ours) == sorted(ref), f"{path}: {sorted(ours)} != {sorted(ref)}"
        for k in ref:
            assert_identical(ours[k], ref[k], f"{path}/{k}")
        return
    assert type(ours) is type(ref), f"{path}: type {type(ours)} != {type(ref)}"
    if isinstance(ref, list):
        assert len(ours) == len(ref), f"{path}: {len(ours)} != {len(ref)} items"
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            assert_identical(a, b, f"{path}[{i}]")
        return
    if isinstance(ref, bytes):
        assert ours == ref, f"{path}: {ours!r} != {ref!r}"
        return
    assert ours.dtype == ref.dtype, f"{path}: dtype {ours.dtype} != {ref.dtype}"
    assert ours.shape == ref.shape, f"{path}: shape {ours.shape} != {ref.shape}"
    if ref.dtype == object:
        assert list(np.ravel(ours)) == list(np.ravel(ref)), path
    else:
        assert np.array_equal(ours, ref, equal_nan=ref.dtype.kind == "f"), f"{path}: values differ"


def _reference(path):
    """TFDS's decoding of a dataset, in our layout."""
    out = []
    for episode in load_episodes(path):
        episode["steps"] = _columnar(episode["steps"])
        out.append(episode)
    return out


@pytest.fixture(scope="module")
def kinds_datasets(tmp_path_factory):
    """The all-kinds episodes written four ways, and TFDS's decoding of them."""
    root = tmp_path_factory.mktemp("kinds")
    config = _all_kinds_config()
    episodes = _all_kinds_episodes()
    paths = {}
    for fmt in ("tfrecord", "array_record"):
        paths["tfds", fmt] = root / f"tfds_{fmt}"
        write_with_tfds(
            paths["tfds", fmt], config, episodes, max_episodes_per_file=3, file_format=fmt
        )
        paths["ours", fmt] = root / f"ours_{fmt}"
        write_with_rlds_writer(
            paths["ours", fmt], config, episodes, max_episodes_per_file=3, file_format=fmt
        )
    reference = _reference(paths["tfds", "tfrecord"])
    return paths, reference


@pytest.mark.parametrize("fmt", ["tfrecord", "array_record"])
@pytest.mark.parametrize("writer", ["tfds", "ours"])
def test_every_feature_kind_decodes_exactly_like_tfds(kinds_datasets, writer, fmt):
    paths, reference = kinds_datasets
    ds = reader_lib.open_dataset(paths[writer, fmt])
    episodes = ds.episodes("train")
    assert len(episodes) == len(reference) == 4
    assert len(episodes.files()) == 2
    decoded = list(episodes)
    for i, (ours, ref) in enumerate(zip(decoded, reference, strict=True)):
        assert_identical(ours, ref, f"episode {i}")
        assert_identical(episodes[i], ref, f"episodes[{i}]")
    if fmt == "tfrecord":  # TFDS's tf.data path reads tfrecord only: compare with it directly
        assert len(_reference(paths[writer, fmt])) == 4


def test_encoded_tensors_of_unknown_shape_decode_like_tfds(tmp_path):
    import tensorflow_datasets as tfds

    config = rlds_writer.DatasetConfig(
        name="dynamic",
        observation_info={
            "varying": tfds.features.Tensor(shape=(None, None), dtype=np.int16, encoding="zlib"),
            "fixed": tfds.features.Tensor(shape=(None, None, 2), dtype=np.uint8, encoding="bytes"),
            "rows": tfds.features.Tensor(shape=(None, 3), dtype=np.float64, encoding="bytes"),
        },
        action_info=np.int64,
        episode_metadata_info={
            "map": tfds.features.Tensor(shape=(None, None), dtype=np.float32, encoding="zlib")
        },
    )
    rng = np.random.default_rng(2)
    episodes = []
    for k in range(3):
        obs = [
            {
                "varying": rng.integers(-99, 99, (t + 1, 2 + k), dtype=np.int16),
                "fixed": rng.integers(0, 256, (2, 3, 2), dtype=np.uint8),
                "rows": rng.normal(size=(k + 1, 3)),
            }
            for t in range(k + 2)
        ]
        episodes.append(
            EpisodeSpec(
                observations=obs,
                actions=[np.int64(1)] * (k + 1),
                rewards=[],
                discounts=[],
                episode_metadata={"map": rng.normal(size=(k + 1, 2)).astype(np.float32)},
            )
        )
    write_with_tfds(tmp_path, config, episodes)
    reference = _reference(tmp_path)
    decoded = list(reader_lib.open_dataset(tmp_path)["train"])
    for i, (ours, ref) in enumerate(zip(decoded, reference, strict=True)):
        assert_identical(ours, ref, f"episode {i}")
    lengths = reader_lib.open_dataset(tmp_path)["train"].episode_lengths()
    assert lengths.tolist() == [2, 3, 4]
    assert isinstance(decoded[0]["steps"]["observation"]["varying"], list)
    assert decoded[0]["steps"]["observation"]["fixed"].shape == (2, 2, 3, 2)


def test_decoded_dtypes_follow_tfds_rules(kinds_datasets):
    paths, _ = kinds_datasets
    episode = reader_lib.open_dataset(paths["ours", "tfrecord"])["train"][1]
    obs = episode["steps"]["observation"]
    assert obs["float64"].dtype == np.float64
    assert np.array_equal(obs["float64"], obs["float64"].astype(np.float32))  # float32 precision
    assert obs["uint64"].dtype == np.uint64 and obs["bool"].dtype == np.bool_
    assert obs["text"].dtype == object and all(isinstance(t, bytes) for t in obs["text"])
    assert isinstance(episode["ep_name"], bytes) and isinstance(episode["ep_id"], np.int64)
    assert obs["png"].shape == (3, 6, 5, 3) and obs["png"].flags.writeable


# Slow: TFDS loads every slice of every split form (15 s under load).
@pytest.mark.slow
def test_split_slices_select_the_same_episodes_as_tfds(tmp_path):
    import tensorflow_datasets as tfds

    config = _all_kinds_config()
    episodes = _all_kinds_episodes(n=10, seed=1)
    for e in episodes:  # keep it small: one step each
        e.observations, e.actions = e.observations[:2], e.actions[:1]
        e.rewards, e.discounts, e.step_metadata = (
            e.rewards[:1],
            e.discounts[:1],
            e.step_metadata[:2],
        )
    write_with_rlds_writer(tmp_path, config, episodes, max_episodes_per_file=4)
    ds = reader_lib.open_dataset(tmp_path)
    builder = tfds.builder_from_directory(os.fspath(tmp_path))
    specs = [
        "train",
        "train[:10%]",
        "train[25%:75%]",
        "train[5:8]",
        "train[-3:]",
        "train[:-7]",
        "train[1shard:2shard]",
        "train[:33%]+train[90%:]",
    ]
    for spec in specs:
        ref = [int(e["ep_id"]) for e in tfds.as_numpy(builder.as_dataset(split=spec))]
        ours = [int(e["ep_id"]) for e in ds.episodes(spec)]
        assert ours == ref, spec
        assert ds.num_episodes(spec) == len(ref), spec
    with pytest.raises(ValueError, match="Unknown split 'test'"):
        ds.episodes("test")
    with pytest.raises(ValueError, match="incompatible with 10"):
        ds.episodes("train[:11]")


def _catch_dataset(path, episodes=9, fmt="tfrecord", per_file=4):
    env = rlds_writer.Catch(rows=5, columns=3, seed=3)
    config = rlds_writer.config_from_env(env, name="catch")
    with rlds_writer.TFDSBackendWriter(
        path, config, max_episodes_per_file=per_file, file_format=fmt
    ) as backend:
        logger = rlds_writer.EnvLogger(env, backend=backend)
        rng = np.random.default_rng(0)
        for _ in range(episodes):
            ts = logger.reset()
            while not ts.last():
                ts = logger.step(np.int64(rng.integers(0, 3)))
    return path


@pytest.mark.parametrize("fmt", ["tfrecord", "array_record"])
def test_random_access_counts_and_slices_agree_with_iteration(tmp_path, fmt):
    ds = reader_lib.open_dataset(_catch_dataset(tmp_path, fmt=fmt))
    episodes = ds["train"]
    sequential = list(episodes)
    assert len(sequential) == len(episodes) == 9 == ds.splits["train"]
    for i in (8, 0, 5, -1, 3):
        assert_identical(episodes[i], sequential[i], f"episode {i}")
    lengths = episodes.episode_lengths()
    assert lengths.tolist() == [len(e["steps"]["is_first"]) for e in sequential]
    assert episodes.num_steps == ds.num_steps("train") == int(lengths.sum())
    middle = episodes[2:7]
    assert len(middle) == 5
    assert_identical(next(iter(middle)), sequential[2])
    assert_identical(middle[-1], sequential[6])
    with pytest.raises(IndexError):
        episodes[9]


def test_iterating_the_reader_itself_says_to_pick_a_split(tmp_path):
    ds = reader_lib.open_dataset(_catch_dataset(tmp_path, fmt="tfrecord"))
    with pytest.raises(TypeError, match=r"iterate reader.episodes\('train'\).*\['train'\]"):
        iter(ds)
    with pytest.raises(TypeError, match="a split spec is a str"):
        ds[0]


def test_offset_index_is_cached_next_to_the_dataset_and_reused(tmp_path, monkeypatch):
    path = _catch_dataset(tmp_path, episodes=5, per_file=10)
    ds = reader_lib.open_dataset(path, index_cache="disk")
    expected = ds["train"][4]
    lengths = ds["train"].episode_lengths()
    cache = tmp_path / ".rlds_reader_index" / "catch-train.tfrecord-00000.npz"
    assert cache.exists()

    def no_scan(self):
        raise AssertionError("the cached index should have been used")

    from rlds_writer.store.formats.tfrecord.tfrecord_reader import TFRecordShard

    monkeypatch.setattr(TFRecordShard, "_scan_offsets", no_scan)
    again = reader_lib.open_dataset(path, index_cache="disk")
    assert_identical(again["train"][4], expected)
    assert again["train"].episode_lengths().tolist() == lengths.tolist()


def test_steps_iterate_every_step_in_order(tmp_path):
    ds = reader_lib.open_dataset(_catch_dataset(tmp_path, episodes=3))
    episodes = list(ds["train"])
    steps = list(ds["train"].steps())
    assert len(steps) == sum(len(e["steps"]["reward"]) for e in episodes)
    flat_obs = np.concatenate([e["steps"]["observation"] for e in episodes])
    assert np.array_equal(np.stack([s["observation"] for s in steps]), flat_obs)
    assert steps[0]["is_first"] and isinstance(steps[0]["reward"], np.generic)
    assert sum(bool(s["is_first"]) for s in steps) == 3


def test_windows_never_cross_an_episode_boundary(tmp_path):
    ds = reader_lib.open_dataset(_catch_dataset(tmp_path, episodes=4))
    episodes = ds["train"]
    lengths = episodes.episode_lengths()
    size, stride = 3, 2
    windows = list(episodes.windows(size, stride))
    assert len(windows) == int(np.maximum(0, (lengths - size) // stride + 1).sum())
    index = episodes.window_index(size, stride)
    assert len(index) == len(windows)
    for window, (episode, start) in zip(windows, index, strict=True):
        assert window["observation"].shape[0] == size
        assert not window["is_first"][1:].any() and not window["is_last"][:-1].any()
        ref = episodes[int(episode)]["steps"]["observation"][start : start + size]
        assert np.array_equal(window["observation"], ref)
    too_long = list(episodes.windows(int(lengths.max()) + 1))
    assert too_long == []


def _record_offsets(path):
    with open(path, "rb") as f:
        data = f.read()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = np.frombuffer(data[pos : pos + 8], "<u8")
        pos += 12 + int(length) + 4
    return offsets


def test_crc_mismatch_raises_with_file_and_offset_or_is_skipped(tmp_path):
    path = _catch_dataset(tmp_path, episodes=4, per_file=10)
    shard = tmp_path / "catch-train.tfrecord-00000"
    good = list(reader_lib.open_dataset(path)["train"])
    offsets = _record_offsets(shard)
    raw = bytearray(shard.read_bytes())
    raw[offsets[2] + 12 + 5] ^= 0x40  # one bit inside episode 2's data
    shard.write_bytes(bytes(raw))

    ds = reader_lib.open_dataset(path)
    with pytest.raises(CorruptRecordError) as err:
        list(ds["train"])
    assert err.value.path == str(shard) and err.value.offset == offsets[2]
    assert f"offset {offsets[2]}" in str(err.value) and "CRC" in str(err.value)
    with pytest.raises(CorruptRecordError, match="data CRC mismatch"):
        ds["train"][2]
    assert_identical(ds["train"][3], good[3])  # the others still read by index

    skipping = reader_lib.open_dataset(path, on_corrupt="skip")["train"]
    assert [int(e["steps"]["observation"].sum()) for e in skipping] == [
        int(good[i]["steps"]["observation"].sum()) for i in (0, 1, 3)
    ]
    lengths = skipping.episode_lengths()
    assert lengths[2] == 0 and lengths[3] == len(good[3]["steps"]["reward"])
    assert len(list(skipping.windows(2))) == sum(
        len(good[i]["steps"]["reward"]) - 1 for i in (0, 1, 3)
    )


def test_torn_tail_raises_with_offset_or_is_skipped(tmp_path):
    path = _catch_dataset(tmp_path, episodes=3, per_file=10)
    shard = tmp_path / "catch-train.tfrecord-00000"
    offsets = _record_offsets(shard)
    raw = shard.read_bytes()
    shard.write_bytes(raw[: offsets[2] + 20])  # episode 2 cut mid-record
    with pytest.raises(CorruptRecordError) as err:
        list(reader_lib.open_dataset(path)["train"])
    assert err.value.offset == offsets[2] and "truncated" in str(err.value)
    with pytest.raises(CorruptRecordError, match=f"offset {offsets[2]}"):
        reader_lib.open_dataset(path)["train"][1]  # building the index finds it too
    skipping = reader_lib.open_dataset(path, on_corrupt="skip", index_cache="disk")
    assert len(list(skipping["train"])) == 2
    assert list(skipping["train[2:]"]) == []  # seeking past the break finds nothing
    assert skipping["train"].episode_lengths()[2] == 0
    assert not (tmp_path / ".rlds_reader_index").exists() or not list(
        (tmp_path / ".rlds_reader_index").iterdir()
    )  # a partial index is never cached


def test_corrupt_array_record_raises_naming_the_file(tmp_path):
    path = _catch_dataset(tmp_path, episodes=3, per_file=10, fmt="array_record")
    shard = tmp_path / "catch-train.array_record-00000"
    raw = bytearray(shard.read_bytes())
    for i in range(100, 160):
        raw[i] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError, match="catch-train.array_record-00000"):
        list(reader_lib.open_dataset(path)["train"])


# Slow: a fresh interpreter where TensorFlow cannot import.
@pytest.mark.slow
def test_reader_runs_where_importing_tensorflow_fails(tmp_path):
    _catch_dataset(tmp_path / "catch", episodes=3)
    _catch_dataset(tmp_path / "catch_ar", episodes=3, fmt="array_record")
    script = textwrap.dedent(
        f"""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("tensorflow", "tensorflow_datasets"):
                    raise ImportError("blocked: " + name)
                return None

        sys.meta_path.insert(0, Block())
        try:
            import tensorflow
        except ImportError:
            pass
        else:
            raise SystemExit("the block did not work")
        from rlds_writer.read.reader import open_dataset
        ds = open_dataset({os.fspath(tmp_path / "catch")!r})
        episodes = ds["train[:2]"]
        n = sum(1 for _ in episodes.steps())
        assert n == episodes.num_steps > 0
        last = ds["train"][-1]
        assert last["steps"]["is_last"][-1]
        ar = open_dataset({os.fspath(tmp_path / "catch_ar")!r})["train"]
        assert ar[1]["steps"]["is_first"][0] and len(list(ar)) == 3
        import importlib.util
        if importlib.util.find_spec("torch"):  # the torch extra
            from rlds_writer.read.torch_data import RLDSIterableDataset
            assert len(list(RLDSIterableDataset(ar))) == 3
        blocked = ("tensorflow", "tensorflow_datasets")
        loaded = [m for m in sys.modules if m.split(".")[0] in blocked]
        assert not loaded, loaded
        print("OK", n)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK")


def test_unsupported_feature_kinds_raise_not_implemented():
    from rlds_writer.store.features.features import parse_features

    config = {
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {
            "features": {
                "video": {
                    "pythonClassName": "tensorflow_datasets.core.features.video_feature.Video",
                    "video": {},
                }
            }
        },
    }
    with pytest.raises(NotImplementedError, match="video: feature Video"):
        parse_features(config)


def test_varints_decode_vectorised_like_protobuf():
    from rlds_writer.store.features.field_encoding import encode_varints

    values = np.array(
        [0, 1, 127, 128, 300, 2**31, -1, -(2**63), 2**63 - 1, 16384, -300], dtype=np.int64
    )
    data = np.frombuffer(encode_varints(values), np.uint8)
    assert np.array_equal(wire.decode_varints(data), values)
    with pytest.raises(wire.WireError):
        wire.decode_varints(data[:-1])


def test_unpacked_lists_decode_like_packed():
    # Int64List{value: 5, value: 300} and FloatList{value: 1.5} written unpacked.
    ints = b"\x08\x05\x08\xac\x02"
    floats = b"\x0d" + np.float32(1.5).tobytes()
    assert wire.int64_list(ints, 0, len(ints)).tolist() == [5, 300]
    assert wire.float_list(floats, 0, len(floats)).tolist() == [1.5]


def test_shard_names_with_num_shards_template_like_tfds_builders(tmp_path):
    import json

    import tensorflow_datasets as tfds

    path = _catch_dataset(tmp_path, episodes=5, per_file=3)
    info_path = tmp_path / "dataset_info.json"
    info = json.loads(info_path.read_text())
    for entry in info["splits"]:
        entry["filepathTemplate"] = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
    info_path.write_text(json.dumps(info))
    for i in range(2):
        os.rename(
            tmp_path / f"catch-train.tfrecord-{i:05d}",
            tmp_path / f"catch-train.tfrecord-{i:05d}-of-00002",
        )
    builder = tfds.builder_from_directory(os.fspath(path))
    ref = [e["steps"]["observation"].shape[0] for e in _reference(path)]
    episodes = reader_lib.open_dataset(path)["train"]
    assert [len(e["steps"]["observation"]) for e in episodes] == ref
    assert len(ref) == builder.info.splits["train"].num_examples == 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_varint_decoding_matches_encoding_for_any_int64(values):
    from rlds_writer.store.features.field_encoding import encode_varints

    arr = np.array(values, dtype=np.int64)
    data = np.frombuffer(encode_varints(arr), np.uint8)
    assert wire.decode_varints(data).tolist() == values


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_raise_wire_error_or_parse(data):
    try:
        located = wire.parse_example(data)
    except wire.WireError:
        return
    for kind, start, end in located.values():
        assert 0 <= start <= end <= len(data) or kind == 0
