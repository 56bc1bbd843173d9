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
runner such as Dataflow, Flink or Spark can spread the work over many
processes or machines.

To publish your own dataset, copy this directory to `builders/<your_name>/`,
rename this file to `<your_name>_dataset_builder.py`, and edit `VERSION`,
`RELEASE_NOTES`, `HOMEPAGE`, `README.md` (the description) and
`CITATIONS.bib`. See `builders/README.md`.

The reading is `rlds_writer.interop.package_sources`; Beam workers import it
from their own install of rlds_writer (for DirectRunner the same environment;
for a remote runner `--setup_file=<rlds_writer checkout>/setup.py`), never
from this module, which TFDS imports on the driver only.
"""

from __future__ import annotations

import json
from typing import Any

import tensorflow_datasets as tfds

from rlds_writer.interop import package_sources


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
        download_config = package_sources.target_size_download_config(download_config)
        self._sources = package_sources.find_sources(dl_manager.manual_dir)
        self._use_beam = (
            download_config.beam_options is not None or download_config.beam_runner is not None
        )
        features_json = package_sources.common_features_json(self._sources)
        self.info._features = tfds.features.FeatureConnector.from_json(features_json)  # noqa: SLF001 - see _info
        metadata = package_sources.read_metadata(self._sources[0])
        if metadata and not self.info.metadata:
            self.info._metadata = tfds.core.MetadataDict(metadata)  # noqa: SLF001
        return super()._download_and_prepare(dl_manager, download_config)

    def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
        return {
            split: self._generate_examples(shards)
            for split, shards in package_sources.split_shards(self._sources).items()
        }

    def _generate_examples(self, shards: list[package_sources.SourceShard]) -> Any:
        features = self.info.features
        if not self._use_beam:
            return package_sources.iter_examples(features, shards)
        beam = tfds.core.lazy_imports.apache_beam
        # The workers run rlds_writer's function, imported from their own
        # install: nothing of this module (on the driver's sys.path only) is
        # pickled into the pipeline.
        features_json = json.dumps(features.to_json())
        return beam.Create(shards) | beam.FlatMap(
            package_sources.read_shard_examples, features_json
        )
