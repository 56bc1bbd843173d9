"""TFDS dataset builder that packages recorded RLDS directories as one dataset.

Build it like any TFDS dataset, pointing `--manual_dir` at the recorded data:

    tfds build builders/rlds_package --manual_dir=/data/my_runs \
        --data_dir=/data/tensorflow_datasets --max_shard_size_mb=256 \
        [--file_format=array_record] [--beam_pipeline_options=runner=DirectRunner]

`--manual_dir` is one recorded dataset directory (it holds
`dataset_info.json`, as written by rlds_writer or TFDS's `SequentialWriter`)
or a directory whose subdirectories (up to 3 levels down) are such datasets, e.g. one
per worker. Every source must have the same features. Each split of the
sources becomes a split of the package; episodes keep their order (sources in
path order, then shards, then records) and are re-sharded by TFDS to
`--max_shard_size_mb` (or `--num_shards`), in tfrecord or array_record.

The features are read from the first source's `features.json` when the
dataset is prepared. With `--beam_pipeline_options` the episodes are read and
re-encoded in an Apache Beam pipeline (one work item per source shard), so a
runner such as Dataflow or Spark can spread the work over many machines.

To publish your own dataset, copy this directory to `builders/<your_name>/`,
rename this file to `<your_name>_dataset_builder.py`, and edit `VERSION`,
`RELEASE_NOTES`, `HOMEPAGE`, `README.md` (the description) and
`CITATIONS.bib`. See `builders/README.md`.

The module needs only `tensorflow_datasets` (and TensorFlow), not rlds_writer,
so it also runs on Beam workers that have just TFDS installed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import tensorflow_datasets as tfds
from etils import epath

_DATASET_INFO = "dataset_info.json"
_FEATURES = "features.json"
_MAX_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class _Shard:
    """One shard file of one source split."""

    source_index: int
    shard_index: int
    path: str
    file_format: str
    num_records: int
    first_key: int = 0  # position of its first episode in the packaged split


def find_sources(manual_dir: epath.PathLike) -> list[epath.Path]:
    """Returns the dataset directories in `manual_dir` (itself, or up to 3 levels down).

    Raises:
      FileNotFoundError: if there is none.
    """
    root = epath.Path(manual_dir)
    if (root / _DATASET_INFO).exists():
        return [root]
    # epath refuses "**" (thousands of requests on GCS): look up to _MAX_DEPTH levels down.
    found = sorted(
        {
            p.parent
            for depth in range(1, _MAX_DEPTH + 1)
            for p in root.glob("/".join(["*"] * depth + [_DATASET_INFO]))
        },
        key=os.fspath,
    )
    if not found:
        raise FileNotFoundError(
            f"{root}: no recorded dataset (no {_DATASET_INFO} in it or below it); pass "
            "--manual_dir=<a dataset directory or a directory of them>"
        )
    return found


def _split_shards(source: epath.Path, source_index: int) -> dict[str, list[_Shard]]:
    """Lists the shards of each split of one source, from its dataset_info.json."""
    info = json.loads((source / _DATASET_INFO).read_text())
    name = info["name"]
    file_format = info.get("fileFormat", "tfrecord") or "tfrecord"
    out: dict[str, list[_Shard]] = {}
    for split in info.get("splits", []):
        lengths = [int(n) for n in split.get("shardLengths", [])]
        shards = []
        for index, length in enumerate(lengths):
            if not length:
                continue
            filename = f"{name}-{split['name']}.{file_format}-{index:05d}-of-{len(lengths):05d}"
            path = source / filename
            if not path.exists():
                # rlds_writer and TFDS's SequentialWriter name shards without "-of-N".
                path = source / f"{name}-{split['name']}.{file_format}-{index:05d}"
            if not path.exists():
                raise FileNotFoundError(f"{source}: shard {index} of split {split['name']} missing")
            shards.append(_Shard(source_index, index, os.fspath(path), file_format, length))
        out[split["name"]] = shards
    return out


def _read_records(shard: _Shard) -> Iterator[tuple[int, bytes]]:
    """Yields (record index, serialized episode) of one shard."""
    if shard.file_format == "array_record":
        from array_record.python import array_record_module

        reader = array_record_module.ArrayRecordReader(shard.path)
        try:
            for index in range(reader.num_records()):
                yield index, reader.read([index])[0]
        finally:
            reader.close()
        return
    if shard.file_format != "tfrecord":
        raise NotImplementedError(f"{shard.path}: file format {shard.file_format!r}")
    import tensorflow as tf

    for index, record in enumerate(tf.data.TFRecordDataset(shard.path).as_numpy_iterator()):
        yield index, record


def _to_example(features: Any, record: bytes) -> dict[str, Any]:
    """Decodes one serialized episode into the nested numpy dict TFDS encodes."""
    decoded = features.deserialize_example_np(record)
    return _materialize(decoded)


def _materialize(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if (
        hasattr(value, "__getitem__")
        and hasattr(value, "__len__")
        and type(value).__name__ == ("PythonDataSource")
    ):
        return [_materialize(value[i]) for i in range(len(value))]
    return value


class _TargetSizeShardConfig(tfds.core.utils.shard_utils.ShardConfig):
    """Shards of about `max_shard_size` bytes each.

    TFDS's own rule makes 1 shard below 64 MiB and otherwise a power of two;
    a package wants shards close to the size asked for, so that
    `--max_shard_size_mb` is the target shard size.
    """

    def get_number_shards(
        self, total_size: int, num_examples: int, uses_precise_sharding: bool = True
    ) -> int:
        if self.num_shards:
            return self.num_shards
        total = total_size + num_examples * self.overhead
        target = self.max_shard_size if uses_precise_sharding else 0.9 * self.max_shard_size
        return int(max(1, min(num_examples, math.ceil(total / target))))


class _TargetSizeDownloadConfig(tfds.download.DownloadConfig):
    def get_shard_config(self) -> _TargetSizeShardConfig:
        return _TargetSizeShardConfig(
            num_shards=self.num_shards,
            min_shard_size=self.min_shard_size,
            max_shard_size=self.max_shard_size,
        )


def _key(shard: _Shard, record_index: int) -> int:
    # Dense integer keys in source order: with shuffling disabled TFDS (and its
    # Beam writer) orders episodes by key and spreads keys evenly over shards.
    if record_index >= shard.num_records:
        raise ValueError(
            f"{shard.path}: more records than the {shard.num_records} its dataset_info.json "
            "lists; run `rlds-writer recover` on the source first"
        )
    return shard.first_key + record_index


class Builder(tfds.core.GeneratorBasedBuilder):
    """Packages recorded RLDS datasets (`--manual_dir`) as one versioned TFDS dataset."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {
        "1.0.0": "Initial release: the recorded episodes, re-sharded.",
    }
    MANUAL_DOWNLOAD_INSTRUCTIONS = """
    Pass --manual_dir=<dir>: a dataset directory recorded with rlds_writer (or
    TFDS's SequentialWriter / envlogger), or a directory of such datasets (for
    example one subdirectory per worker). All must have the same features.
    """
    HOMEPAGE = "https://github.com/google-research/rlds"

    def _info(self) -> tfds.core.DatasetInfo:
        # The features come from the sources, which are only known when the
        # dataset is prepared (--manual_dir): they are set in
        # _download_and_prepare. With features=None, a prepared dataset's
        # features are restored from its own features.json.
        return self.dataset_info_from_configs(
            features=None,
            homepage=self.HOMEPAGE,
            disable_shuffling=True,  # keep the recorded episode order
        )

    def _download_and_prepare(self, dl_manager: Any, download_config: Any = None) -> None:
        download_config = download_config or tfds.download.DownloadConfig()
        download_config = _TargetSizeDownloadConfig(
            **{
                f.name: getattr(download_config, f.name)
                for f in dataclasses.fields(download_config)
            }
        )
        self._sources = find_sources(dl_manager.manual_dir)
        self._use_beam = (
            download_config.beam_options is not None or download_config.beam_runner is not None
        )
        features = self._check_features(self._sources)
        self.info._features = features  # noqa: SLF001 - see _info
        self._source_metadata = _read_metadata(self._sources[0])
        if self._source_metadata and not self.info.metadata:
            self.info._metadata = tfds.core.MetadataDict(self._source_metadata)  # noqa: SLF001
        return super()._download_and_prepare(dl_manager, download_config)

    def _check_features(self, sources: list[epath.Path]) -> Any:
        texts = [json.loads((s / _FEATURES).read_text()) for s in sources]
        for source, text in zip(sources[1:], texts[1:]):
            if text != texts[0]:
                raise ValueError(
                    f"{source}: features differ from those of {sources[0]}; every source "
                    "directory must have the same features.json"
                )
        return tfds.features.FeatureConnector.from_json(texts[0])

    def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
        splits: dict[str, list[_Shard]] = {}
        for index, source in enumerate(self._sources):
            for split, shards in _split_shards(source, index).items():
                splits.setdefault(split, []).extend(shards)
        out = {}
        for split, shards in splits.items():
            first = 0
            numbered = []
            for shard in shards:
                numbered.append(dataclasses.replace(shard, first_key=first))
                first += shard.num_records
            out[split] = self._generate_examples(numbered)
        return out

    def _generate_examples(self, shards: list[_Shard]) -> Any:
        features = self.info.features
        if self._use_beam:
            beam = tfds.core.lazy_imports.apache_beam
            features_json = json.dumps(features.to_json())

            def read_shard(shard: _Shard) -> Iterator[tuple[int, dict[str, Any]]]:
                # Runs on a Beam worker: rebuild the features there.
                worker_features = tfds.features.FeatureConnector.from_json(
                    json.loads(features_json)
                )
                for index, record in _read_records(shard):
                    yield _key(shard, index), _to_example(worker_features, record)

            return beam.Create(shards) | beam.FlatMap(read_shard)
        return self._iter_examples(features, shards)

    def _iter_examples(
        self, features: Any, shards: list[_Shard]
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        for shard in shards:
            for index, record in _read_records(shard):
                yield _key(shard, index), _to_example(features, record)


def _read_metadata(source: epath.Path) -> dict[str, Any]:
    path = source / "metadata.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())
