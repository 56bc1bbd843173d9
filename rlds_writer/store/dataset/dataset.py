"""`Dataset`: a dataset directory opened once, its listing parsed and checked once.

Every tool that reads a dataset (the reader, `info`, `validate`, `stats`,
`show`, `recover`, the exporters) takes a `Dataset`, or a path it opens as
one::

    dataset = Dataset.open("s3://bucket/catch")   # or a local directory
    dataset.splits["train"].shard_lengths          # from dataset_info.json
    ra = dataset.open_shard("train", 0)            # range reads: ra.read_at(offset, n)

Opening reads `dataset_info.json`, `features.json` and `metadata.json` through
the storage seam (`store.storage.storage`: the local disk, or any fsspec store) and
checks what a crafted file could abuse: names and `filepathTemplate`s that
would lead outside the directory, counts that are not counts, features TFDS
could not read back, file formats nobody reads. Nothing re-reads the JSON
afterwards; the shard files themselves are listed afresh on each call to
`shard_files` (a writer may be adding some).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from rlds_writer.errors import IncompatibleDatasetError, UnsupportedFeatureError
from rlds_writer.store.dataset import layout
from rlds_writer.store.dataset.locate import require_dataset
from rlds_writer.store.features import features as features_lib
from rlds_writer.store.formats import shards
from rlds_writer.store.storage import file_io, storage


@dataclasses.dataclass(frozen=True)
class SplitListing:
    """One split as `dataset_info.json` lists it.

    Attributes:
      name: the split name (checked: it can name files).
      shard_lengths: episodes per shard file, in order.
      num_bytes: the bytes the listing records for the split.
      template: how its shard files are named.
    """

    name: str
    shard_lengths: tuple[int, ...]
    num_bytes: int
    template: layout.ShardTemplate

    @property
    def num_episodes(self) -> int:
        return sum(self.shard_lengths)

    @property
    def num_shards(self) -> int:
        return len(self.shard_lengths)

    def shard_name(self, index: int) -> str:
        """The file name of listed shard `index`."""
        return self.template.filename(index, len(self.shard_lengths))


class Dataset:
    """An RLDS dataset directory, local or in object storage, opened once.

    Use `Dataset.open(path)` (or `open_handle`, which also takes a `Dataset`).

    Attributes:
      path: the directory as given (`/data/catch`, `s3://bucket/catch`).
      storage: the `store.storage.storage` object that reaches its files.
      info: the parsed `dataset_info.json`.
      features_config: the parsed `features.json` (the JSON dict).
      features: the features as the reader models them (`store.features.features.Features`).
      metadata: the parsed `metadata.json`, or None.
      name: the dataset name.
      version: the dataset version.
      file_format: `"tfrecord"` or `"array_record"`.
      splits: split name -> `SplitListing`, in the listing's order.
    """

    def __init__(
        self,
        path: str,
        backend: Any,
        info: Mapping[str, Any],
        features_config: Mapping[str, Any],
        features: features_lib.Features,
        metadata: Any,
    ):
        self.path = path
        self.storage = backend
        self.info = dict(info)
        self.features_config = features_config
        self.features = features
        self.metadata = metadata
        where = self.file(layout.DATASET_INFO)
        self.name = layout.check_name(self.info.get("name"), "dataset name", where)
        self.version = self.info.get("version", "")
        self.file_format = layout.file_format_of(self.info)
        if self.file_format not in shards.names():
            raise UnsupportedFeatureError(
                f"{where}: file format {self.file_format!r} is not supported "
                f"({' and '.join(shards.names())} are)"
            )
        # Names and counts are checked: a crafted file cannot point outside `path`.
        templates = layout.split_templates(self.info, where)
        self.splits = {
            split: SplitListing(split, tuple(lengths), nbytes, templates[split])
            for split, (lengths, nbytes) in layout.read_splits(self.info, where).items()
        }

    @classmethod
    def open(cls, path: str | os.PathLike) -> Dataset:
        """Opens the dataset at `path`: reads and checks its JSON files once.

        Raises:
          NotADatasetError: `path` is not a dataset (says what is there instead).
          IncompatibleDatasetError: a listing or features file that is malformed,
            or names files outside the directory.
          UnsupportedFeatureError: a feature kind or file format nobody reads.
        """
        text = os.fspath(path)
        if not file_io.is_local(text):
            text = text.rstrip("/")
        backend = storage.storage_for(text)
        require_dataset(text, backend)
        info = _load_json(backend, _join(backend, text, layout.DATASET_INFO))
        if not isinstance(info, dict):
            raise IncompatibleDatasetError(
                f"{_join(backend, text, layout.DATASET_INFO)}: expected a JSON object, got "
                f"{type(info).__name__}; run `rlds-writer recover` to rebuild it"
            )
        features_path = _join(backend, text, layout.FEATURES)
        config = _load_json(backend, features_path, features=True)
        features = features_lib.parse_features_file(config, features_path)
        metadata = None
        meta_path = _join(backend, text, layout.METADATA)
        if backend.exists(meta_path):
            metadata = _load_json(backend, meta_path)
        return cls(text, backend, info, config, features, metadata)

    def __repr__(self) -> str:
        splits = ", ".join(f"{k}={v.num_episodes}" for k, v in self.splits.items())
        return f"Dataset({self.path!r}, {self.file_format}, episodes: {splits})"

    @property
    def is_local(self) -> bool:
        return self.storage.is_local

    @property
    def shard_format(self) -> Any:
        """The `FileFormat` of its shards (`store.formats.shards`): readers, walks, repairs."""
        return shards.adapter(self.file_format)

    def file(self, name: str) -> str:
        """The path of file `name` of the directory."""
        return _join(self.storage, self.path, name)

    def listdir(self) -> list[str]:
        """The names in the directory now, sorted."""
        return self.storage.listdir(self.path)

    def shard_path(self, split: str, index: int) -> str:
        """The path of listed shard `index` of `split`."""
        return self.file(self.splits[split].shard_name(index))

    def split_template(self, split: str) -> layout.ShardTemplate:
        """How the shards of `split` are named (ours for a split not listed yet)."""
        listing = self.splits.get(split)
        if listing is not None:
            return listing.template
        return layout.ShardTemplate(layout.FILEPATH_TEMPLATE, self.name, split, self.file_format)

    def shard_files(self, split: str, names: list[str] | None = None) -> dict[int, str]:
        """Shard index -> file name of the shards of `split` present now.

        Args:
          split: a split (listed or not).
          names: the directory's names, if already listed (saves a listing).
        """
        names = self.listdir() if names is None else names
        return self.split_template(split).select(names)

    def unlisted_splits(self, names: list[str]) -> list[str]:
        """Splits whose shard files are present but not listed, in name order."""
        out = []
        for name in names:
            m = layout.ANY_SHARD.match(name)
            if (
                m
                and m["name"] == self.name
                and m["format"] == self.file_format
                and m["split"] not in self.splits
                and m["split"] not in out
            ):
                out.append(m["split"])
        return out

    def open_file(self, name: str) -> Any:
        """Opens file `name` of the directory for range reads (never through a link).

        Returns:
          A `store.storage.storage.RandomAccess` (`size`, `read_at(offset, n)`, `close`).

        Raises:
          IncompatibleDatasetError: the file is a symbolic link.
        """
        path = self.file(name)
        if self.is_local and os.path.islink(path):  # object stores have no links
            raise IncompatibleDatasetError(
                f"{path}: a symbolic link (to {os.readlink(path)!r}); rlds_writer never reads "
                "a dataset's files through links. Replace it with the file itself"
            )
        return self.storage.open_random(path)

    def local_file(self, name: str) -> str:
        """A local path holding file `name`, for readers that open paths (array_record).

        A local dataset's own file (never through a link); for a dataset in
        object storage, a copy of that one object in a bounded local cache
        (`store.storage.local_copies`, reused while the object is unchanged).

        Raises:
          IncompatibleDatasetError: the file is a symbolic link.
        """
        path = self.file(name)
        if self.is_local:
            if os.path.islink(path):
                self.open_file(name)  # raises, naming the link
            return path
        from rlds_writer.store.storage.local_copies import local_copy

        return local_copy(self.storage, path)

    def size(self, name: str) -> int:
        """The size in bytes of file `name` of the directory."""
        return self.storage.size(self.file(name))

    def is_being_written(self) -> bool:
        """Whether a live writer holds the directory (in object storage: its lock exists)."""
        if self.is_local:
            from rlds_writer.store.dataset import locking

            return locking.is_locked(self.path)
        return self.storage.exists(self.file(layout.LOCK))

    def writer(self) -> dict[str, Any] | None:
        """The live writer holding the directory (its lock file's content), or None."""
        if self.is_local:
            from rlds_writer.store.dataset import locking

            return locking.read_holder(self.path) if locking.is_locked(self.path) else None
        lock = self.file(layout.LOCK)
        if not self.storage.exists(lock):
            return None
        try:
            return json.loads(self.storage.read_bytes(lock))
        except (OSError, ValueError):
            return {}


def open_handle(source: Dataset | str | os.PathLike) -> Dataset:
    """Returns `source` if it is a `Dataset`, else opens the path as one."""
    if isinstance(source, Dataset):
        return source
    if isinstance(source, str | os.PathLike):
        return Dataset.open(source)
    raise TypeError(f"expected a dataset path or Dataset, got {type(source).__name__}")


def _join(backend: Any, directory: str, name: str) -> str:
    return backend.join(directory, name)


def _load_json(backend: Any, path: str, features: bool = False) -> Any:
    """Reads one JSON file of the dataset; a malformed one is a one-line error."""
    try:
        return json.loads(backend.read_bytes(path))
    except (RecursionError, ValueError) as e:
        # json's own errors are ValueErrors; a crafted file may nest without end.
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        if features:
            raise IncompatibleDatasetError(
                f"{path}: not a features.json TFDS can read ({reason}); restore the file "
                "from the dataset's source"
            ) from None
        raise IncompatibleDatasetError(
            f"{path}: not valid JSON ({reason}); run `rlds-writer recover` to rebuild it, or "
            "restore it from the dataset's source"
        ) from None
