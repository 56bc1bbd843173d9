"""`info` summarizes a dataset; `validate` decodes it through TFDS and finds RLDS violations."""

from __future__ import annotations

import json
import shutil

import crash_child
import numpy as np
import pytest

import rlds_writer
from rlds_writer import cli
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats.tfrecord import tfrecord
from rlds_writer.store.storage import file_io

NAME = crash_child.NAME
STEPS = sum(len(crash_child.expected_episode(i)["t"]) for i in range(10))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine") / "ds"
    crash_child.write_dataset(directory, range(10), metadata={"agent": "seeded random"})
    return directory


@pytest.fixture
def dataset(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def _append_tfds_encoded_episode(directory, **overrides):
    """Appends episode 99, encoded by TFDS itself, with some step fields replaced."""
    import tensorflow_datasets as tfds

    features = tfds.builder_from_directory(str(directory)).info.features
    want = crash_child.expected_episode(99)
    steps = {k: want[k] for k in ("observation", "action", "reward", "discount", "t")}
    steps.update({k: want[k].copy() for k in ("is_first", "is_last", "is_terminal")})
    for key, (step, value) in overrides.items():
        steps[key][step] = value
    encoded = features.encode_example({"episode_id": 99, "steps": steps})
    record = tfds.core.example_serializer.ExampleSerializer(
        features.get_serialized_info()
    ).serialize_example(encoded)
    shards = layout.list_shard_files(directory, NAME, "train", "tfrecord")
    path = directory / layout.shard_name(NAME, "train", "tfrecord", max(shards) + 1)
    path.write_bytes(tfrecord.frame(record))
    rlds_writer.recover(directory)
    return len(want["t"])


def test_info_summarizes_splits_steps_features_and_metadata(dataset):
    summary = rlds_writer.maintain.info(dataset)
    train = summary["splits"]["train"]
    assert (train["episodes"], train["steps"], train["shards"]) == (10, STEPS, 4)
    assert train["shard_lengths"] == [3, 3, 3, 1]
    assert train["num_bytes"] > 0 and train["file_bytes"] > train["num_bytes"]
    assert summary["total"] == {
        "episodes": 10,
        "steps": STEPS,
        "num_bytes": train["num_bytes"],
        "shards": 4,
    }
    steps = summary["features"]["features"]["steps"]
    assert steps["type"] == "Dataset"
    assert steps["feature"]["features"]["observation"] == {
        "type": "Tensor",
        "dtype": "float32",
        "shape": [6, 4],
    }
    assert summary["features"]["features"]["episode_id"]["dtype"] == "int64"
    assert summary["metadata"] == {"agent": "seeded random"}
    assert summary["problems"] == [] and summary["writer"] is None
    json.dumps(summary)  # plain JSON types


def test_info_command_prints_a_feature_tree_and_json(dataset, capsys):
    assert cli.main(["info", str(dataset)]) == 0
    text = capsys.readouterr().out
    assert f"train: 10 episodes, {STEPS} steps" in text
    assert "steps (Dataset)" in text and "    observation: Tensor float32[6, 4]" in text
    assert '"agent": "seeded random"' in text
    assert cli.main(["info", str(dataset), "--json", "--no-steps"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"]["train"]["steps"] is None


def test_info_tells_what_recover_would_fix(dataset):
    info = file_io.read_json(dataset / layout.DATASET_INFO)
    (dataset / layout.DATASET_INFO).write_text(
        json.dumps(layout.with_splits(info, {"train": ([3, 3], 0)}))
    )
    with open(dataset / layout.shard_name(NAME, "train", "tfrecord", 3), "ab") as f:
        f.write(b"\x01" * 5)
    problems = rlds_writer.maintain.info(dataset)["problems"]
    assert any("tfrecord-00002 is not listed" in p for p in problems)
    # The same words as the reader and validate: file, record, offset, reason, advice.
    assert any(
        "tfrecord-00003: record 1 at byte offset" in p and "truncated record header" in p
        for p in problems
    )
    assert "recover" in problems[-1]


def test_validate_passes_a_sound_dataset(dataset, capsys):
    result = rlds_writer.maintain.validate(dataset)
    assert result["ok"] and result["violations"] == [] and result["first_violation"] is None
    assert result["splits"] == {"train": {"episodes": 10, "steps": STEPS}}
    assert cli.main(["validate", str(dataset)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("overrides", "step", "words"),
    [
        ({"is_first": (2, True)}, 2, "is_first is True on step 2"),
        ({"is_first": (0, False)}, 0, "is_first is False on step 0"),
        ({"is_last": (1, True)}, 1, "is_last is True on step 1"),
        ({"is_last": (-1, False)}, "last", "is_last is False on the final step"),
        ({"is_terminal": (1, True)}, 1, "is_terminal is True on step 1"),
    ],
)
def test_validate_names_the_episode_and_step_of_the_first_violation(
    dataset, capsys, overrides, step, words
):
    n = _append_tfds_encoded_episode(dataset, **overrides)
    step = n - 1 if step == "last" else step
    result = rlds_writer.maintain.validate(dataset)
    assert not result["ok"]
    first = result["first_violation"]
    assert (first["episode"], first["step"], first["record"]) == (10, step, 0)
    assert first["shard"] == layout.shard_name(NAME, "train", "tfrecord", 4)
    assert words in first["message"]
    assert cli.main(["validate", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert f"episode 10, step {step}" in err and words in err


def test_validate_flags_episodes_that_dataset_info_does_not_list(dataset):
    _append_tfds_encoded_episode(dataset)
    info = file_io.read_json(dataset / layout.DATASET_INFO)
    (dataset / layout.DATASET_INFO).write_text(
        json.dumps(layout.with_splits(info, {"train": ([3, 3, 3, 1], 0)}))
    )
    result = rlds_writer.maintain.validate(dataset)
    assert not result["ok"]
    assert "not listed" in result["first_violation"]["message"]
    assert "recover" in result["first_violation"]["message"]
    rlds_writer.recover(dataset)
    assert rlds_writer.maintain.validate(dataset)["ok"]


def test_validate_reports_a_torn_tail_as_needing_recover(dataset):
    shard = dataset / layout.shard_name(NAME, "train", "tfrecord", 3)
    with open(shard, "ab") as f:
        f.write(np.arange(40, dtype=np.uint8).tobytes())
    result = rlds_writer.maintain.validate(dataset, max_violations=5)
    assert not result["ok"]
    assert "length CRC mismatch" in result["first_violation"]["message"]
    assert result["first_violation"]["shard"] == shard.name


def test_validate_json_output(dataset, capsys):
    assert cli.main(["validate", str(dataset), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] is True and result["splits"]["train"]["episodes"] == 10
