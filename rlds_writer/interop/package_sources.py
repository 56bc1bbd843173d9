"""The recorded sources of a TFDS package build (`builders/rlds_package`), and reading them.

A package build reads one or more recorded dataset directories and hands
TFDS `(key, episode)` pairs in source order. This module does the reading;
the builder module (`builders/<name>/<name>_dataset_builder.py`) only
declares the dataset (name, version, description) and hands TFDS what this
module yields.

The builder's module lives in `builders/`, which TFDS puts on the driver's
`sys.path` only. On a Beam runner the per-shard work runs in other
processes or machines, so everything a worker calls is here, in the
installed `rlds_writer` package: `read_shard_examples` is pickled by
reference (`rlds_writer.interop.package_sources.read_shard_examples`) and
the workers import it from their own install. Getting `rlds_writer` onto the
workers is done the way Beam documents for any package: the same
environment (DirectRunner), or `--setup_file=<rlds_writer checkout>/setup.py`,
`--extra_package=<rlds_writer sdist or wheel>` or a custom container.

The same functions read the episodes in a single-process build, so both give
the same dataset.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterator
from typing import Any

# Only package builds import this module, and they run TFDS: the shard config
# below subclasses TFDS's, and Beam workers unpickle it by this module's name.
import tensorflow_datasets as tfds
from etils import epath

from rlds_writer.errors import MissingShardError
from rlds_writer.store.dataset import layout
from rlds_writer.store.formats import shards as shard_formats

_DATASET_INFO = "dataset_info.json"
_FEATURES = "features.json"
_MAX_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class SourceShard:
    """One shard file of one source split, and where its episodes go in the package.

    Attributes:
      source_index: position of its source directory (sources sorted by path).
      shard_index: its index in the source split.
      path: the shard file.
      file_format: "tfrecord" or "array_record".
      num_records: the episodes its source's dataset_info.json lists for it.
      first_key: the key of its first episode in the packaged split (keys
        are dense and in source order).
    """

    source_index: int
    shard_index: int
    path: str
    file_format: str
    num_records: int
    first_key: int = 0


class TargetSizeShardConfig(tfds.core.utils.shard_utils.ShardConfig):
    """Shards of about `max_shard_size` bytes each.

    TFDS's own rule makes 1 shard below 64 MiB and otherwise a power of two;
    a package wants shards close to the size asked for, so that
    `--max_shard_size_mb` is the target shard size. TFDS's Beam writer
    pickles the shard config into the pipeline, so it lives here, not in the
    builder's module.
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
    def get_shard_config(self) -> TargetSizeShardConfig:
        return TargetSizeShardConfig(
            num_shards=self.num_shards,
            min_shard_size=self.min_shard_size,
            max_shard_size=self.max_shard_size,
        )


def target_size_download_config(download_config: Any = None) -> Any:
    """`download_config` (a `tfds.download.DownloadConfig`) with target-size sharding."""
    download_config = download_config or tfds.download.DownloadConfig()
    return _TargetSizeDownloadConfig(
        **{f.name: getattr(download_config, f.name) for f in dataclasses.fields(download_config)}
    )


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


def common_features_json(sources: list[epath.Path]) -> dict[str, Any]:
    """The sources' `features.json`, which must be the same for all.

    Raises:
      ValueError: if a source's features differ from the first source's.
    """
    texts = [json.loads((s / _FEATURES).read_text()) for s in sources]
    for source, text in zip(sources[1:], texts[1:]):
        if text != texts[0]:
            raise ValueError(
                f"{source}: features differ from those of {sources[0]}; every source "
                "directory must have the same features.json"
            )
    return texts[0]


def read_metadata(source: epath.Path) -> dict[str, Any]:
    """A source's `metadata.json` (empty when it has none)."""
    path = source / "metadata.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def split_shards(sources: list[epath.Path]) -> dict[str, list[SourceShard]]:
    """Lists each split's shards over all sources, numbered with their first key."""
    splits: dict[str, list[SourceShard]] = {}
    for index, source in enumerate(sources):
        for split, shards in _source_split_shards(source, index).items():
            splits.setdefault(split, []).extend(shards)
    out = {}
    for split, shards in splits.items():
        first = 0
        numbered = []
        for shard in shards:
            numbered.append(dataclasses.replace(shard, first_key=first))
            first += shard.num_records
        out[split] = numbered
    return out


def _source_split_shards(source: epath.Path, source_index: int) -> dict[str, list[SourceShard]]:
    info = json.loads((source / _DATASET_INFO).read_text())
    name = info["name"]
    file_format = layout.file_format_of(info)
    out: dict[str, list[SourceShard]] = {}
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
                raise MissingShardError.listed(os.fspath(path), split["name"], index, str(source))
            shards.append(SourceShard(source_index, index, os.fspath(path), file_format, length))
        out[split["name"]] = shards
    return out


def _read_records(shard: SourceShard) -> Iterator[tuple[int, bytes]]:
    """Yields (record index, serialized episode) of one shard; damage raises."""
    records = shard_formats.adapter(shard.file_format).records(shard.path, strict=True)
    yield from enumerate(records)


def _materialize(value: Any) -> Any:
    """Turns TFDS's lazy nested-dataset views into lists, so TFDS can encode them again."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if (
        hasattr(value, "__getitem__")
        and hasattr(value, "__len__")
        and type(value).__name__ == ("PythonDataSource")
    ):
        return [_materialize(value[i]) for i in range(len(value))]
    return value


def _key(shard: SourceShard, record_index: int) -> int:
    # Dense integer keys in source order: with shuffling disabled TFDS (and its
    # Beam writer) orders episodes by key and spreads keys evenly over shards.
    if record_index >= shard.num_records:
        raise ValueError(
            f"{shard.path}: more records than the {shard.num_records} its dataset_info.json "
            "lists; run `rlds-writer recover` on the source first"
        )
    return shard.first_key + record_index


def iter_examples(features: Any, shards: list[SourceShard]) -> Iterator[tuple[int, Any]]:
    """Yields `(key, episode)` of the shards, episodes decoded as TFDS encodes them.

    Args:
      features: the package's `tfds.features.FeaturesDict`.
      shards: shards from `split_shards`.
    """
    for shard in shards:
        for index, record in _read_records(shard):
            decoded = features.deserialize_example_np(record)
            yield _key(shard, index), _materialize(decoded)


@functools.lru_cache(maxsize=4)
def _features_from_json(features_json: str) -> Any:
    return tfds.features.FeatureConnector.from_json(json.loads(features_json))


def read_shard_examples(shard: SourceShard, features_json: str) -> Iterator[tuple[int, Any]]:
    """One Beam work item: a shard's `(key, episode)` pairs.

    Runs on Beam workers, so it takes the features as JSON text (rebuilt once
    per worker process) and nothing of the builder's module.
    """
    yield from iter_examples(_features_from_json(features_json), [shard])
