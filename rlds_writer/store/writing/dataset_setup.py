"""A dataset directory made ready for a `DatasetWriter`: created, overwritten or opened to append.

`check_mode` refuses `mode="error"` on a directory holding a dataset before
anything is recorded. `describe_dataset` makes the dataset's description
(`WriterInfo`: its features, `dataset_info.json`, `features.json`): with
TFDS's own `DatasetInfo` where the config holds TFDS's feature objects, else
without importing TFDS, as the same files (`store/features/feature_defs.py`).
`prepare_directory` then creates those files, deletes an old dataset
(`overwrite`), or, to `append`, recovers the directory first and checks that
its name, file format and features match the writer's; a split whose shard
names hold the shard count gets that count pinned in its template, so new
shards continue the sequence without renaming any (docs/durability.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import DatasetExistsError, IncompatibleDatasetError, SpecError
from rlds_writer.store.dataset import json_values, layout
from rlds_writer.store.features import feature_defs, feature_walk
from rlds_writer.store.repair import recovery
from rlds_writer.store.storage import file_io
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

_log = logging.getLogger(__name__)

MODES = ("error", "append", "overwrite")

# A split's listing: (shard lengths, data bytes).
Listing = dict[str, tuple[list[int], int]]


# TFDS's `Version`: MAJOR.MINOR.PATCH, numbers without leading zeros.
_VERSION = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)")
# The step flags, first in `steps` as in `tfds.rlds.rlds_base.build_info`.
_FLAGS = ("is_terminal", "is_first", "is_last")
# Config fields that only TFDS's `DatasetInfo` writes (into dataset_info.json).
_DESCRIPTION_FIELDS = ("overall_description", "homepage", "citation", "supervised_keys")


def check_version(version: Any) -> str:
    """Returns `version` if TFDS takes it as a dataset version, else raises `SpecError`."""
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise SpecError(
            f"version: expected MAJOR.MINOR.PATCH, numbers without leading zeros "
            f"(e.g. '1.0.0'), got {version!r}"
        )
    return version


def _step_features(ds_config: Any) -> dict[str, Any]:
    import numpy as np

    steps = {flag: np.bool_ for flag in _FLAGS}
    steps.update(ds_config.step_metadata_info or {})
    for field in ("observation", "action", "reward", "discount"):
        info = getattr(ds_config, f"{field}_info")
        if info:
            steps[field] = info
    return steps


def build_dataset_info(
    ds_config: Any,
    name: str,
    version: str,
    data_directory: epath.PathLike,
    metadata: Mapping[str, Any] | None = None,
) -> Any:
    """Returns the `tfds.core.DatasetInfo` of an RLDS dataset config.

    The same features, in the same order, as `tfds.rlds.rlds_base.build_info`,
    which names the step flags `tf.bool` and so imports TensorFlow (about 5 s)
    into every recording process; NumPy's bool is the same feature
    (`features.json` is byte-identical) and nothing here needs TensorFlow.
    Features of `store.features.feature_defs` in the config are made TFDS's own.
    """
    import tensorflow_datasets as tfds

    identity = tfds.core.DatasetIdentity(
        name=name,
        version=tfds.core.Version(check_version(version)),
        data_dir=os.fspath(data_directory),
        module_name="",
    )
    steps = feature_defs.as_tfds(_step_features(ds_config))
    episode = feature_defs.as_tfds(dict(ds_config.episode_metadata_info or {}))
    features = {"steps": tfds.features.Dataset(steps), **episode}
    return tfds.core.DatasetInfo(
        builder=identity,
        description=ds_config.overall_description,
        features=tfds.features.FeaturesDict(features),
        supervised_keys=ds_config.supervised_keys,
        homepage=ds_config.homepage,
        citation=ds_config.citation,
        metadata=tfds.core.MetadataDict(metadata) if metadata else None,
    )


@dataclasses.dataclass(frozen=True)
class WriterInfo:
    """A new dataset's description, as the writer writes it.

    Attributes:
      features: the top-level `FeaturesDict` (`store.features.feature_defs`' or TFDS's).
      info_json: `dataset_info.json` before any split is listed (what TFDS's
        `DatasetInfo.as_proto` gives as JSON).
      features_json: `features.json` (the `FeaturesDict` proto as JSON).
      metadata: `metadata.json`, or None to write none.
      tfds_info: TFDS's `DatasetInfo`, where it was built (it writes its own
        files: per-feature files such as class label names among them).
    """

    features: Any
    info_json: dict[str, Any]
    features_json: dict[str, Any]
    metadata: dict[str, Any] | None
    tfds_info: Any = None

    def write_files(self, path: epath.PathLike) -> None:
        """`DatasetInfo.write_to_directory` but for dataset_info.json: features.json
        and TFDS's metadata.json (no license file is set).

        Written here, the info file would be replaced by the first commit
        straight away; on ext4 a rename over an existing file flushes the new
        one's blocks (about 0.1-0.3 ms of every new writer).
        """
        if self.tfds_info is not None:
            self.tfds_info.features.save_config(path)
            if self.tfds_info.metadata is not None:
                self.tfds_info.metadata.save_metadata(path)
            return
        # As TFDS's `save_config` and `MetadataDict.save_metadata` write them.
        path = as_path(path)
        text = json.dumps(self.features_json, indent=4, sort_keys=True)
        file_io.write_new_text(path / layout.FEATURES, text)
        if self.metadata is not None:
            file_io.write_new_text(path / layout.METADATA, json.dumps(self.metadata))


def describe_dataset(
    ds_config: Any,
    name: str,
    version: str,
    data_directory: epath.PathLike,
    metadata: Mapping[str, Any] | None,
    file_format: str,
) -> WriterInfo:
    """The `WriterInfo` of an RLDS dataset config.

    Without TFDS (its import is most of a short recording's cost) where every
    feature is one of `store.features.feature_defs` that this package encodes and the
    config sets nothing else TFDS would write; else from `build_dataset_info`.

    Args:
      ds_config: TFDS's RLDS `DatasetConfig`, or an object with its fields.
      name: the dataset name.
      version: the dataset version, MAJOR.MINOR.PATCH.
      data_directory: where it is written.
      metadata: dataset-level metadata, JSON-safe, or None.
      file_format: the shard format's name.
    """
    check_version(version)
    steps = _step_features(ds_config)
    episode = dict(ds_config.episode_metadata_info or {})
    if not any(getattr(ds_config, f, None) for f in _DESCRIPTION_FIELDS):
        # TFDS's objects in it are kept as they are, and `natively_written` refuses them.
        features = feature_defs.FeaturesDict({"steps": feature_defs.Dataset(steps), **episode})
        if feature_defs.natively_written(features):
            info_json = {"name": name, "version": version, "fileFormat": file_format}
            return _checked(WriterInfo(features, info_json, features.to_json(), metadata or None))
    from google.protobuf import json_format
    from tensorflow_datasets.core import file_adapters

    info = build_dataset_info(ds_config, name, version, data_directory, metadata)
    info.set_file_format(file_adapters.FileFormat.from_value(file_format))
    return _checked(
        WriterInfo(
            info.features,
            json_format.MessageToDict(info.as_proto),
            json_format.MessageToDict(info.features.to_proto()),
            metadata or None,
            tfds_info=info,
        )
    )


def _checked(info: WriterInfo) -> WriterInfo:
    """Refuses fields that would share one key (a name holding `/`): TFDS could not load them."""
    nodes = feature_walk.walk_features_json(info.features_json)
    feature_walk.check_unique_keys((node.path for node in nodes if not node.empty_dict), SpecError)
    return info


def check_mode(path: epath.PathLike, mode: str) -> bool:
    """Refuses `mode="error"` on a directory that holds a dataset (before anything is recorded).

    Returns:
      Whether `path` holds a dataset.

    Raises:
      ValueError: `mode` is not one of `MODES`.
      DatasetExistsError: the directory holds a dataset and mode is `error`.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    exists = layout.holds_dataset(path)
    if mode == "error" and exists:
        raise DatasetExistsError(
            f"{path} already holds a dataset. Pass mode='append' to add episodes "
            "to it or mode='overwrite' to replace it.",
            directory=os.fspath(path),
        )
    return exists


@dataclasses.dataclass
class Prepared:
    """A directory ready for writing.

    Attributes:
      info_json: dataset_info.json as it stands (the writer's commits replace its splits).
      splits: the listing to continue, the writer's split included.
      templates: split -> how its shards are named (pinned where they count shards).
      metadata: the dataset-level metadata (earlier runs' keys kept on append).
      first_commit: a listing to commit before any episode (a new dataset, or
        pinned templates), or None.
      write_metadata: `metadata.json` must be rewritten (append with new metadata).
    """

    info_json: dict[str, Any]
    splits: Listing
    templates: dict[str, layout.ShardTemplate]
    metadata: dict[str, Any] | None
    first_commit: Listing | None = None
    write_metadata: bool = False


def prepare_directory(
    path: epath.Path,
    info: WriterInfo,
    *,
    mode: str,
    name: str,
    file_format: str,
    split: str,
    metadata: dict[str, Any] | None,
) -> Prepared:
    """Creates, overwrites or opens for appending the dataset at `path` (locked by the caller).

    Args:
      path: the dataset directory (exists).
      info: the writer's `WriterInfo` (`describe_dataset`).
      mode: `error`, `append` or `overwrite`.
      name: the dataset name.
      file_format: the writer's shard format.
      split: the writer's default split.
      metadata: the writer's dataset-level metadata, JSON-safe, or None.

    Raises:
      DatasetExistsError: the directory holds a dataset and mode is `error`.
      IncompatibleDatasetError: appending to a dataset of another name, file
        format or features.
    """
    exists = check_mode(path, mode)
    if exists and mode == "overwrite":
        _delete_dataset_files(path)
        exists = False
    if exists:
        return _open_for_append(path, info, name, file_format, split, metadata)
    return _create(path, info, file_format, split, metadata)


def _delete_dataset_files(path: epath.Path) -> None:
    # Shards of every naming TFDS or we use (`-00000` and `-00000-of-00004`).
    for child in path.iterdir():
        if child.name in (
            layout.DATASET_INFO,
            layout.FEATURES,
            layout.METADATA,
        ) or layout.ANY_SHARD.match(child.name):
            child.unlink()


def _create(
    path: epath.Path,
    info: WriterInfo,
    file_format: str,
    split: str,
    metadata: dict[str, Any] | None,
) -> Prepared:
    if info.tfds_info is None or file_io.is_local(path):
        info.write_files(path)
    else:
        _write_tfds_files_remotely(path, info)
    listing = {split: ([], 0)}
    # dataset_info.json is what TFDS would write (`DatasetInfo.as_proto` as
    # JSON); the first commit writes it once, with the split listed.
    return Prepared(dict(info.info_json), {split: ([], 0)}, {}, metadata, first_commit=listing)


def _write_tfds_files_remotely(path: epath.Path, info: WriterInfo) -> None:
    """TFDS's files, made in a local directory and uploaded (TFDS would write
    through TensorFlow's file system and rename)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlds_writer-info-") as tmp:
        info.write_files(tmp)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                data = f.read()
            (path / name).write_bytes(data)


def _open_for_append(
    path: epath.Path,
    info: WriterInfo,
    name: str,
    file_format: str,
    split: str,
    metadata: dict[str, Any] | None,
) -> Prepared:
    # Headers of every record are checked; data CRCs only in each split's last
    # shard (where a crash tears) and in shards whose count is off.
    report = recovery.run_recovery(path, dry_run=False, verify_data=False)
    if report.changed:
        _log.warning("recovered %s before appending: %s", path, report.summary())
    if not (path / layout.DATASET_INFO).exists():
        # Its creation was interrupted before any episode: start it afresh.
        return _create(path, info, file_format, split, metadata)
    existing = file_io.read_json(path / layout.DATASET_INFO)
    problems = []
    if existing.get("name") != name:
        problems.append(f"name: dataset has {existing.get('name')!r}, writer has {name!r}")
    fmt = layout.file_format_of(existing)
    if fmt != file_format:
        problems.append(f"file_format: dataset has {fmt!r}, writer has {file_format!r}")
    templates = layout.split_templates(existing)
    # features.json is the FeaturesDict proto as JSON (TFDS's save_config).
    diff = json_values.json_diff(file_io.read_json(path / layout.FEATURES), info.features_json)
    if diff:
        problems.append(
            "features differ:\n"
            + "\n".join(f"  {where}: dataset has {a!r}, writer has {b!r}" for where, a, b in diff)
        )
    if problems:
        raise IncompatibleDatasetError(f"cannot append to {path}: " + "; ".join(problems))
    splits: Listing = {
        split_name: (lengths, nbytes)
        for split_name, (lengths, nbytes) in layout.read_splits(existing).items()
    }
    # A split whose shard names hold the shard count (`tfds build`'s
    # `-00000-of-00004`) gets that count pinned in its template before any
    # shard is added: its shards keep their names, new ones continue the
    # sequence (`-00004-of-00004`, ...), and dataset_info.json never lists
    # a template its files do not follow (docs/durability.md).
    pinned = {
        s: template.pinned(len(splits[s][0]) if s in splits else 0)
        for s, template in templates.items()
    }
    prepared = Prepared(existing, splits, pinned, metadata)
    if pinned != templates:
        _log.info(
            "%s: pinned the shard count in %s so shards can be added without renaming",
            path,
            ", ".join(f"{s}'s filepathTemplate" for s in pinned if pinned[s] != templates[s]),
        )
        prepared.first_commit = dict(splits)
    if metadata is not None:
        if (path / layout.METADATA).exists():
            # Keep the keys earlier runs recorded; the new ones win.
            prepared.metadata = {**file_io.read_json(path / layout.METADATA), **metadata}
        prepared.write_metadata = True
    splits.setdefault(split, ([], 0))
    return prepared
