"""The on-disk layout of a dataset directory, as TFDS's `SequentialWriter` makes it.

```
<data_directory>/
  dataset_info.json                       splits, shard lengths, format, version
  features.json                           the FeaturesDict
  metadata.json                           optional dataset-level metadata
  {name}-{split}.{tfrecord|array_record}-{00000}   one record per episode
```

TFDS itself (`tfds build`, Beam) names shards `...-00000-of-00004`; every
tool matches shard files through `ShardTemplate`, from the split's
`filepathTemplate`, as TFDS does. Appending to such a split first pins the
count its names hold (`ShardTemplate.pinned`): the template becomes
`...-{SHARD_INDEX}-of-00004`, which names the existing shards exactly as
before and the new ones `...-00004-of-00004`, `...-00005-of-00004`, ...
This module is the one home of these names, of the fsync helpers, and of the
quarantine, journal and temp-file names.

`dataset_info.json` is always replaced atomically (write to a temporary file in
the same directory, then rename), so a reader never sees half of it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rlds_writer.errors import IncompatibleDatasetError
from rlds_writer.store.dataset import names
from rlds_writer.store.formats import shards
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
METADATA = "metadata.json"
LOCK = ".rlds_writer.lock"
MERGE_JOURNAL = ".rlds_writer.merge.json"
# What we write: one index per shard, so a shard's name never depends on how
# many shards follow it (a writer can add shards without renaming any).
FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"
# What TFDS assumes when a split has no filepathTemplate (`tfds build` writes it).
TFDS_DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
# What a dataset_info.json without `fileFormat` means (TFDS's default); the
# format names themselves come from the registry, `store.formats.shards.names()`.
DEFAULT_FILE_FORMAT = shards.DEFAULT_FILE_FORMAT
# Temporary files: ours (`.x.tmp-<pid>-<random>`, older `.x.tmp-<pid>`, `.x.recover-tmp`).
TEMP_FILE = re.compile(r"^\..+\.(tmp-\d+(-[0-9a-f]+)?|recover-tmp)$")


@functools.lru_cache(maxsize=8)
def _any_shard_pattern(formats: tuple[str, ...]) -> re.Pattern:
    alternatives = "|".join(re.escape(f) for f in formats)
    shard = rf"\.(?P<format>{alternatives})-\d{{5,}}(-of-\d{{5,}})?"
    return re.compile(rf"^(?P<name>.+)-(?P<split>.+){shard}$")


class _AnyShard:
    """`match(name)`: a shard name of any registered format (`store.formats.shards.names()`,
    which `register` can extend), groups `name`, `split`, `format`."""

    def match(self, name: str) -> re.Match | None:
        return _any_shard_pattern(shards.names()).match(name)


# Any shard name of any template TFDS or we write, for "does this look like a
# dataset" checks; never used to decide which files belong to a split.
ANY_SHARD = _AnyShard()
_PLACEHOLDERS = (
    "{DATASET}",
    "{SPLIT}",
    "{FILEFORMAT}",
    "{SHARD_INDEX}",
    "{NUM_SHARDS}",
    "{SHARD_X_OF_Y}",
)
_MAX_SHARDS = 10**6


def check_name(value: Any, what: str, where: str = DATASET_INFO) -> str:
    """Returns `value` if it can be part of a file name inside the dataset directory.

    Raises:
      IncompatibleDatasetError: for absolute names, path separators, `..` or
        anything but letters, digits and `_.+-` (`store.dataset.names`).
    """
    return names.check_name(
        value,
        what,
        where=where,
        fix="fix the file or rewrite the dataset",
        error=IncompatibleDatasetError,
    )


@dataclasses.dataclass(frozen=True)
class ShardTemplate:
    """How the shard files of one split are named (TFDS's `filepathTemplate`).

    Attributes:
      template: e.g. `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}`.
      dataset: the dataset name.
      split: the split name.
      file_format: `tfrecord` or `array_record`.
    """

    template: str
    dataset: str
    split: str
    file_format: str

    def __post_init__(self) -> None:
        check_name(self.dataset, "dataset name")
        check_name(self.split, "split name")
        if self.file_format not in shards.names():
            raise IncompatibleDatasetError(
                f"{DATASET_INFO}: file format {self.file_format!r} is not supported "
                f"(expected one of {shards.names()})"
            )
        rest = self.template
        for placeholder in _PLACEHOLDERS:
            rest = rest.replace(placeholder, "")
        if (
            "/" in self.template
            or "\\" in self.template
            or ".." in rest
            or "{" in rest
            or "}" in rest
            or not ("{SHARD_INDEX}" in self.template or "{SHARD_X_OF_Y}" in self.template)
        ):
            raise IncompatibleDatasetError(
                f"{DATASET_INFO}: split {self.split!r} has filepathTemplate {self.template!r}; "
                "expected file names in the dataset directory built from {DATASET}, {SPLIT}, "
                "{FILEFORMAT} and {SHARD_INDEX} or {SHARD_X_OF_Y}"
            )

    @property
    def counts_shards(self) -> bool:
        """True if names include the number of shards (renaming them all on a change)."""
        return "{SHARD_X_OF_Y}" in self.template or "{NUM_SHARDS}" in self.template

    def pinned(self, num_shards: int) -> ShardTemplate:
        """Returns a template that names shards `0..num_shards-1` as this one does,
        with the count fixed, so shards can be added without renaming any.

        TFDS keeps one `filepathTemplate` per split, so new shards must follow
        it; with `{SHARD_X_OF_Y}` their count would rename every existing shard.
        `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}` pinned at 4 is
        `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}-of-00004`. A template
        that does not count shards is returned as it is; with no shard to
        keep, ours is returned.
        """
        if not self.counts_shards:
            return self
        if num_shards == 0:
            return dataclasses.replace(self, template=FILEPATH_TEMPLATE)
        count = f"{num_shards:05d}"
        template = self.template.replace("{SHARD_X_OF_Y}", "{SHARD_INDEX}-of-" + count)
        return dataclasses.replace(self, template=template.replace("{NUM_SHARDS}", count))

    def filename(self, index: int, num_shards: int) -> str:
        """Returns the file name of shard `index` of `num_shards`."""
        return (
            self.template.replace("{SHARD_X_OF_Y}", f"{index:05d}-of-{num_shards:05d}")
            .replace("{DATASET}", self.dataset)
            .replace("{SPLIT}", self.split)
            .replace("{FILEFORMAT}", self.file_format)
            .replace("{SHARD_INDEX}", f"{index:05d}")
            .replace("{NUM_SHARDS}", f"{num_shards:05d}")
        )

    def pattern(self) -> re.Pattern:
        """Matches this split's shard names; groups `index` and (if named) `count`."""
        out = re.escape(self.template)
        for placeholder, regex in (
            ("{SHARD_X_OF_Y}", r"(?P<index>\d{5,})-of-(?P<count>\d{5,})"),
            ("{DATASET}", re.escape(self.dataset)),
            ("{SPLIT}", re.escape(self.split)),
            ("{FILEFORMAT}", re.escape(self.file_format)),
            ("{SHARD_INDEX}", r"(?P<index>\d{5,})"),
            ("{NUM_SHARDS}", r"(?P<count>\d{5,})"),
        ):
            out = out.replace(re.escape(placeholder), regex, 1)
        return re.compile(f"^{out}$")

    def files_on_disk(self, directory: epath.PathLike) -> dict[int, epath.Path]:
        """Returns index -> path of this split's shard files present in `directory`.

        With a counting template, only files of the count that most files
        agree on are returned (a stale shard of another build is left alone).
        """
        directory = as_path(directory)
        return {
            i: directory / n for i, n in self.select(p.name for p in directory.iterdir()).items()
        }

    def select(self, names: Iterable[str]) -> dict[int, str]:
        """Returns index -> name of this split's shard files among `names`.

        With a counting template, only files of the count that most files
        agree on are returned (a stale shard of another build is left alone).
        """
        pattern = self.pattern()
        found: dict[int, dict[int, str]] = {}
        for name in names:
            m = pattern.match(name)
            if m:
                count = int(m.group("count")) if "count" in m.groupdict() else -1
                found.setdefault(count, {})[int(m.group("index"))] = name
        if not found:
            return {}
        best = max(found, key=lambda c: (len(found[c]), c))
        return dict(sorted(found[best].items()))


def split_templates(info: Mapping[str, Any], where: str = DATASET_INFO) -> dict[str, ShardTemplate]:
    """Returns split name -> `ShardTemplate` of a dataset_info.json dict, checked."""
    name = check_name(info.get("name"), "dataset name", where)
    file_format = file_format_of(info)
    out = {}
    for entry in info.get("splits", []):
        split = check_name(entry.get("name"), "split name", where)
        template = entry.get("filepathTemplate") or TFDS_DEFAULT_TEMPLATE
        out[split] = ShardTemplate(template, name, split, file_format)
    return out


def file_format_of(info: Mapping[str, Any]) -> str:
    """The shard format a dataset_info.json dict names (TFDS's default if none)."""
    return info.get("fileFormat") or DEFAULT_FILE_FORMAT


def shard_name(name: str, split: str, file_format: str, index: int) -> str:
    """Returns the name we give shard `index`, e.g. `catch-train.tfrecord-00003`."""
    return ShardTemplate(FILEPATH_TEMPLATE, name, split, file_format).filename(index, 0)


def list_shard_files(
    path: epath.PathLike, name: str, split: str, file_format: str, template: str | None = None
) -> dict[int, epath.Path]:
    """Returns shard index -> path for a split's shard files present on disk."""
    template = template or FILEPATH_TEMPLATE
    return ShardTemplate(template, name, split, file_format).files_on_disk(path)


def holds_dataset(path: epath.PathLike) -> bool:
    """True if the directory holds a dataset (info file or any shard file)."""
    path = as_path(path)
    if not path.exists():
        return False
    if (path / DATASET_INFO).exists():
        return True
    # The lock is skipped unmatched: a new dataset's directory holds only it, and
    # the shard pattern's first compile costs about 0.5 ms of every new writer.
    return any(p.name != LOCK and ANY_SHARD.match(p.name) for p in path.iterdir())


def split_entry(
    split: str, shard_lengths: list[int], num_bytes: int, template: str = FILEPATH_TEMPLATE
) -> dict[str, Any]:
    """Returns one `splits` entry of dataset_info.json (int64s as strings)."""
    return {
        "filepathTemplate": template,
        "name": split,
        "numBytes": str(int(num_bytes)),
        "shardLengths": [str(int(n)) for n in shard_lengths],
    }


def read_splits(
    info: Mapping[str, Any], where: str = DATASET_INFO
) -> dict[str, tuple[list[int], int]]:
    """Returns split name -> (shard lengths, num bytes) from dataset_info.json.

    Raises:
      IncompatibleDatasetError: a split name that cannot name files, or a
        shard length or byte count that is not a non-negative integer.
    """
    out = {}
    for entry in info.get("splits", []):
        split = check_name(entry.get("name"), "split name", where)
        lengths = entry.get("shardLengths", [])
        if not isinstance(lengths, list) or len(lengths) > _MAX_SHARDS:
            raise IncompatibleDatasetError(
                f"{where}: split {split!r}: shardLengths must be a list of at most "
                f"{_MAX_SHARDS} counts; run `rlds-writer recover` to rebuild it"
            )
        out[split] = (
            [_count(n, f"split {split!r} shardLengths", where) for n in lengths],
            _count(entry.get("numBytes", 0), f"split {split!r} numBytes", where),
        )
    return out


def _count(value: Any, what: str, where: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or isinstance(value, bool | float) or n >= 1 << 63:
        raise IncompatibleDatasetError(
            f"{where}: {what}: expected a non-negative integer, got {value!r}; "
            "run `rlds-writer recover` to rebuild the listing"
        )
    return n


def with_splits(
    info: Mapping[str, Any],
    splits: Mapping[str, tuple[list[int], int]],
    templates: Mapping[str, ShardTemplate] | None = None,
) -> dict[str, Any]:
    """Returns a copy of dataset_info.json's dict with the given splits.

    A split keeps its entry's other fields and its `filepathTemplate` (from
    `templates`, else the entry, else ours), so files keep matching it.
    """
    old = {entry.get("name"): entry for entry in info.get("splits", [])}
    out = dict(info)
    out["splits"] = []
    for name, (lengths, nbytes) in splits.items():
        if templates and name in templates:
            template = templates[name].template
        else:
            template = old.get(name, {}).get("filepathTemplate") or FILEPATH_TEMPLATE
        entry = dict(old.get(name, {}))
        entry.update(split_entry(name, lengths, nbytes, template))
        out["splits"].append(entry)
    return out
