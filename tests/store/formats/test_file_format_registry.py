"""The shard file formats come from one registry (`store/formats/shards.py`): a format
registered there is offered by the CLI, written, read, walked and repaired
through its own object, and nothing else in the package has to know its name."""

from __future__ import annotations

import json

import pytest
from helpers_core import run_cli

from rlds_writer.read.reader import open_dataset
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats import shards
from rlds_writer.store.formats.tfrecord.tfrecord_shards import TFRecordFormat


class FakeFormat(TFRecordFormat):
    """A third format as a module would declare it: TFRecord frames under another name.

    The name must be one TFDS's `FileFormat` enum knows (dataset_info.json
    stores it); nothing ever hands these files to TFDS's riegeli reader.
    """

    name = "riegeli"

    def __init__(self):
        self.readers: list[str] = []
        self.walked: list[str] = []

    def open_reader(self, path, *args, **kwargs):
        self.readers.append(path)
        return super().open_reader(path, *args, **kwargs)

    def walk(self, dataset, name, **kwargs):
        self.walked.append(name)
        return super().walk(dataset, name, **kwargs)


@pytest.fixture
def fake_format():
    fmt = FakeFormat()
    shards.register(fmt)
    try:
        yield fmt
    finally:
        shards.unregister(fmt.name)


def test_a_registered_format_is_offered_written_read_and_walked(tmp_path, fake_format):
    assert shards.names() == ("tfrecord", "array_record", "riegeli")
    out = tmp_path / "ds"
    run_cli("record", "--output", out, "--episodes", 3, "--format", "riegeli", "--no-load-back")

    info = json.loads((out / layout.DATASET_INFO).read_text())
    assert info["fileFormat"] == "riegeli"
    files = sorted(p.name for p in out.iterdir() if layout.ANY_SHARD.match(p.name))
    assert files == ["catch-train.riegeli-00000"]

    with open_dataset(out) as ds:
        assert len(list(ds.episodes("train"))) == 3
    assert fake_format.readers == [str(out / files[0])]

    assert "3 episodes" in run_cli("info", out).stdout.replace("episodes: 3", "3 episodes")
    assert fake_format.walked == files

    # recover finds the format's shards by its name and checks them with its object.
    (out / files[0]).write_bytes((out / files[0]).read_bytes()[:-3])  # a crash's torn tail
    run_cli("recover", out)
    with open_dataset(out) as ds:
        assert len(list(ds.episodes("train"))) == 2


def test_the_cli_offers_only_registered_formats(tmp_path):
    assert "riegeli" not in shards.names()
    result = run_cli("record", "--output", tmp_path / "ds", "--format", "riegeli", expect=2)
    assert "invalid choice: 'riegeli'" in result.stderr
    assert "'tfrecord', 'array_record'" in result.stderr
    assert not (tmp_path / "ds").exists()


def test_an_unknown_format_in_a_dataset_is_refused_by_name(tmp_path, fake_format):
    out = tmp_path / "ds"
    run_cli("record", "--output", out, "--episodes", 1, "--format", "riegeli", "--no-load-back")
    shards.unregister("riegeli")
    with pytest.raises(Exception, match="file format 'riegeli' is not supported"):
        open_dataset(out)
    shards.register(fake_format)


def test_register_refuses_a_taken_name_and_a_name_that_cannot_name_files():
    class Clash(TFRecordFormat):
        name = "array_record"

    class BadName(TFRecordFormat):
        name = "../x"

    with pytest.raises(ValueError, match="already registered"):
        shards.register(Clash())
    with pytest.raises(ValueError, match="lowercase letters"):
        shards.register(BadName())
    with pytest.raises(ValueError, match="built-in"):
        shards.unregister("tfrecord")
    assert shards.names() == ("tfrecord", "array_record")
