"""mode="append" on datasets TFDS itself wrote: new episodes, the old shards untouched.

`tfds build` names shards `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`
(`catch_crash-train.tfrecord-00001-of-00003`); TFDS's `SequentialWriter`
names them `-{SHARD_INDEX}`. The writer pins the count of the former in the
split's template before adding shards (docs/durability.md, "Appending to a
dataset `tfds build` wrote"), so every original shard keeps its name and its
bytes, and TFDS reads the original episodes (values as before) and the new ones.
A kill at any moment of an append leaves a dataset TFDS loads with at least
the original episodes.
"""

from __future__ import annotations

import random
import shutil
import signal
import time

import crash_child
import dm_env
import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.rlds import rlds_base

import rlds_writer
from rlds_writer.envs.catch import Catch
from rlds_writer.maintain.shard_walk import iter_shard_records
from rlds_writer.maintain.tfds_episodes import decoded_episodes
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage import file_io
from rlds_writer.store.writing import split_shards

ORIGINAL = 12  # episodes 0..11 in every dataset TFDS writes here
FIELDS = ("observation", "action", "reward", "discount", "t", "is_first", "is_last", "is_terminal")


def _example(episode_id):
    episode = crash_child.expected_episode(episode_id)
    return {"episode_id": episode_id, "steps": {k: episode[k] for k in FIELDS}}


class _CatchBuilt(tfds.core.GeneratorBasedBuilder):
    """crash_child's Catch episodes, built the way `tfds build` builds a dataset."""

    name = crash_child.NAME
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return rlds_base.build_info(crash_child.dataset_config(), self)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(ORIGINAL):
            yield i, _example(i)


def _build(root, origin, file_format, num_shards):
    if origin == "tfds build":
        builder = _CatchBuilt(data_dir=str(root), file_format=file_format)
        config = tfds.download.DownloadConfig(num_shards=num_shards)
        builder.download_and_prepare(download_config=config)
        return builder.data_path
    identity = tfds.core.DatasetIdentity(
        name=crash_child.NAME,
        version=tfds.core.Version("1.0.0"),
        data_dir=str(root),
        module_name="",
    )
    info = rlds_base.build_info(crash_child.dataset_config(), identity)
    writer = tfds.core.SequentialWriter(
        info, max_examples_per_shard=-(-ORIGINAL // num_shards), file_format=file_format
    )
    writer.initialize_splits(["train"])
    writer.add_examples({"train": [_example(i) for i in range(ORIGINAL)]})
    writer.close_all()
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(origin, file format, shards) -> a pristine dataset TFDS wrote (built once)."""
    cache = {}

    def get(origin, file_format, num_shards):
        key = (origin, file_format, num_shards)
        if key not in cache:
            root = tmp_path_factory.mktemp("built")
            cache[key] = _build(root, origin, file_format, num_shards)
        return cache[key]

    return get


def _copy(built, tmp_path, origin, file_format, num_shards):
    directory = tmp_path / "dataset"
    shutil.copytree(built(origin, file_format, num_shards), directory)
    return directory


def _shard_bytes(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir() if layout.ANY_SHARD.match(p.name)}


def _loaded(directory):
    """episode id -> episode, read by TFDS (`as_dataset`, or `as_data_source` for array_record)."""
    out = {}
    for episode in decoded_episodes(directory, "train"):
        episode_id = int(episode["episode_id"])
        assert episode_id not in out, f"episode {episode_id} read twice"
        out[episode_id] = episode
    return out


def _assert_same(got, want, what):
    for key in FIELDS:
        np.testing.assert_array_equal(got["steps"][key], want["steps"][key], f"{what}/{key}")


CASES = [
    (origin, file_format, num_shards)
    for origin in ("tfds build", "SequentialWriter")
    for file_format in ("tfrecord", "array_record")
    for num_shards in (1, 3)
]


@pytest.mark.parametrize(("origin", "file_format", "num_shards"), CASES)
def test_append_adds_episodes_and_leaves_every_original_shard_as_it_was(
    built, tmp_path, origin, file_format, num_shards
):
    directory = _copy(built, tmp_path, origin, file_format, num_shards)
    originals = _shard_bytes(directory)
    assert len(originals) == num_shards
    if origin == "tfds build":
        assert all(name.endswith(f"-of-{num_shards:05d}") for name in originals)
    before = _loaded(directory)
    assert sorted(before) == list(range(ORIGINAL))

    # Two appends: the second continues after the first's shards.
    crash_child.write_dataset(
        directory, range(12, 17), mode="append", file_format=file_format, max_episodes_per_file=2
    )
    crash_child.write_dataset(directory, range(17, 19), mode="append", file_format=file_format)

    now = _shard_bytes(directory)
    for name, data in originals.items():  # same names, same bytes
        assert now[name] == data, f"{name} changed"
    assert len(now) == num_shards + 4  # 2 + 2 + 1 episodes, then 2
    after = _loaded(directory)
    assert sorted(after) == list(range(19))
    for episode_id, episode in before.items():
        _assert_same(after[episode_id], episode, f"original {episode_id}")
    for episode_id in range(12, 19):
        _assert_same(after[episode_id], _example(episode_id), f"appended {episode_id}")

    # Every maintenance tool sees the same sound dataset.
    report = rlds_writer.recover(directory)
    assert not report.changed, report.summary()
    summary = rlds_writer.maintain.info(directory)
    assert summary["problems"] == []
    assert summary["total"]["episodes"] == 19
    result = rlds_writer.maintain.validate(directory)
    assert result["ok"], result["violations"]
    reader_ids = sorted(int(e["episode_id"]) for e in rlds_writer.open_dataset(directory)["train"])
    assert reader_ids == list(range(19))


def test_the_pinned_template_keeps_the_names_tfds_gave(built, tmp_path):
    directory = _copy(built, tmp_path, "tfds build", "tfrecord", 3)
    crash_child.write_dataset(directory, range(12, 14), mode="append", max_episodes_per_file=1)
    (split,) = file_io.read_json(directory / layout.DATASET_INFO)["splits"]
    assert split["filepathTemplate"] == "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}-of-00003"
    names = tfds.builder_from_directory(str(directory)).info.splits["train"].filenames
    assert names == [f"catch_crash-train.tfrecord-0000{i}-of-00003" for i in range(5)]


def test_the_pinned_template_is_committed_before_the_first_new_shard_exists(
    built, tmp_path, monkeypatch
):
    # A kill between a new shard's creation and a commit of the pinned template
    # would leave `...-00003-of-00003` beside an `-of-` template: recovery would
    # then count 4 shards and rename every original to `-of-00004`.
    directory = _copy(built, tmp_path, "tfds build", "tfrecord", 3)
    seen = []
    real_open_shard = split_shards.open_shard

    def open_shard(path, file_format, fsync, max_records=None):
        (split,) = file_io.read_json(directory / layout.DATASET_INFO)["splits"]
        seen.append((path.name, split["filepathTemplate"], list(split["shardLengths"])))
        return real_open_shard(path, file_format, fsync, max_records)

    monkeypatch.setattr(split_shards, "open_shard", open_shard)
    crash_child.write_dataset(directory, range(12, 13), mode="append")
    pinned = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}-of-00003"
    assert seen == [("catch_crash-train.tfrecord-00003-of-00003", pinned, ["4", "4", "4"])]


def _record_with_env_logger(backend, episode_id):
    """One episode of crash_child's Catch through EnvLogger (the same values it expects)."""
    env = Catch(
        rows=crash_child.ROWS,
        columns=crash_child.COLUMNS,
        seed=episode_id,
        max_steps=1 + episode_id % crash_child.ROWS,
    )
    counter = {"t": 0}

    def step_fn(timestep, action, env):
        counter["t"] = 0 if action is None else counter["t"] + 1
        return {"t": counter["t"]}

    logger = rlds_writer.EnvLogger(
        env,
        backend=backend,
        step_fn=step_fn,
        episode_fn=lambda timestep, action, env: {"episode_id": episode_id},
    )
    rng = np.random.default_rng(episode_id + 1_000_003)
    timestep = logger.reset()
    while not timestep.last():
        timestep = logger.step(int(rng.integers(3)))
    assert timestep.step_type == dm_env.StepType.LAST


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_env_logger_appends_to_a_tfds_built_dataset(built, tmp_path, file_format):
    directory = _copy(built, tmp_path, "tfds build", file_format, 3)
    originals = _shard_bytes(directory)
    before = _loaded(directory)
    backend = rlds_writer.TFDSBackendWriter(
        directory,
        crash_child.dataset_config(),
        mode="append",
        file_format=file_format,
        max_episodes_per_file=2,
    )
    for episode_id in range(12, 15):
        _record_with_env_logger(backend, episode_id)
    backend.close()
    assert {n: d for n, d in _shard_bytes(directory).items() if n in originals} == originals
    after = _loaded(directory)
    assert sorted(after) == list(range(15))
    for episode_id in range(15):
        want = before[episode_id] if episode_id < ORIGINAL else _example(episode_id)
        _assert_same(after[episode_id], want, str(episode_id))


@pytest.mark.parametrize("move", [False, True])
def test_merge_takes_an_appended_tfds_built_dataset(built, tmp_path, move):
    sources = []
    for i, file_format_shards in enumerate([3, 1]):
        source = tmp_path / f"src{i}"
        shutil.copytree(built("tfds build", "tfrecord", file_format_shards), source)
        crash_child.write_dataset(source, range(12, 14), mode="append")
        sources.append(source)
    report = rlds_writer.merge(sources, tmp_path / "merged", move=move)
    assert report.episodes == {"train": 2 * 14}
    ids = sorted(_loaded_ids(tmp_path / "merged"))
    assert ids == sorted(list(range(14)) * 2)
    assert rlds_writer.maintain.validate(tmp_path / "merged")["ok"]


def _loaded_ids(directory):
    return [int(e["episode_id"]) for e in decoded_episodes(directory, "train")]


# ----------------------------------------------------------- SIGKILL


def _listed_records(directory):
    """Episode ids of every listed record, each checked against the env (no TFDS)."""
    info = file_io.read_json(directory / layout.DATASET_INFO)
    file_format = info.get("fileFormat", "tfrecord")
    lengths, _ = layout.read_splits(info)["train"]
    template = layout.split_templates(info)["train"]
    ids = []
    for index, n in enumerate(lengths):
        path = directory / template.filename(index, len(lengths))
        records = list(iter_shard_records(path, file_format))
        assert len(records) == n, f"{path.name}: {len(records)} records, listed {n}"
        ids.extend(crash_child.check_record(record) for record in records)
    return ids


def _wait_for(path, word, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and word in path.read_text().split():
            return
        time.sleep(0.002)
    raise AssertionError(f"the recorder never reported {word!r}")


@pytest.mark.slow
@pytest.mark.parametrize(("file_format", "kills"), [("tfrecord", 8), ("array_record", 6)])
def test_an_append_killed_at_any_moment_leaves_the_original_episodes_loadable(
    built, tmp_path, file_format, kills
):
    forkserver = crash_child.forkserver_context()
    directory = _copy(built, tmp_path, "tfds build", file_format, 3)
    originals = _shard_bytes(directory)
    rng = random.Random(7)
    present = listed = ORIGINAL
    for kill in range(kills):
        report = tmp_path / f"report-{kill}.txt"
        process = forkserver.Process(
            target=crash_child.record_forever,
            args=(str(directory), present, str(report)),
            kwargs={
                "file_format": file_format,
                "seed": kill,
                # Every other kill inside a half-written record or a commit.
                "slow_io": 0.03 if kill % 2 else 0.0,
            },
        )
        process.start()
        if kill % 2:
            _wait_for(report, "replace")
        elif kill % 4 == 0:
            time.sleep(rng.uniform(0.0, 0.4))  # from start-up on: the pinning commit too
        else:
            _wait_for(report, "open")
            time.sleep(rng.uniform(0.0, 0.2))
        process.kill()
        process.join()
        assert process.exitcode == -signal.SIGKILL, process.exitcode

        # Before any recovery: the original shards are intact, and TFDS loads
        # the listed episodes, the originals among them.
        now = _shard_bytes(directory)
        assert {n: now.get(n) for n in originals} == originals
        ids = sorted(_loaded_ids(directory))
        assert ids == list(range(len(ids))) and len(ids) >= listed, (kill, listed, ids)
        listed = len(ids)
        # What the next append starts from (its own recovery lists the rest).
        present = sum(rlds_writer.recover(directory, dry_run=True).episodes.values())
        assert present >= listed

    rlds_writer.recover(directory)
    ids = _listed_records(directory)
    assert sorted(ids[:ORIGINAL]) == list(range(ORIGINAL))
    assert ids[ORIGINAL:] == list(range(ORIGINAL, present))
    assert sorted(_loaded_ids(directory)) == list(range(present))
    assert rlds_writer.maintain.validate(directory)["ok"]
    assert present > ORIGINAL


def test_pinned_fixes_every_count_placeholder_and_leaves_other_templates_alone():
    def template(text):
        return layout.ShardTemplate(text, "catch", "train", "tfrecord")

    counted = template("{DATASET}.{NUM_SHARDS}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}")
    pinned = counted.pinned(4)
    assert pinned.template == "{DATASET}.00004-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}-of-00004"
    assert not pinned.counts_shards
    for index in range(4):  # the existing names, unchanged
        assert pinned.filename(index, 9) == counted.filename(index, 4)
    assert pinned.filename(6, 9) == "catch.00004-train.tfrecord-00006-of-00004"
    ours = template(layout.FILEPATH_TEMPLATE)
    assert ours.pinned(4) is ours
    assert counted.pinned(0).template == layout.FILEPATH_TEMPLATE  # no shard to keep
