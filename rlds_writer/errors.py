"""Exceptions raised by rlds_writer, and the wording they share.

Every error that concerns a value names the field path, what was expected and
what arrived, so that a bad step can be found from the message alone. A
missing optional library is worded here too (`OPTIONAL_MODULES`: which extra
installs it), and `counted` makes numbers agree with their nouns.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import types
from collections.abc import Callable, Iterator


class RLDSWriterError(Exception):
    """Base class of every error raised by rlds_writer."""


class SpecError(RLDSWriterError, ValueError):
    """A dataset config or env spec cannot be turned into TFDS features."""


class UnsafePathError(RLDSWriterError, ValueError):
    """A name or path would lead outside the paths a tool was given.

    A field name, agent or module id or path template that cannot be one file
    name, or a destination that overlaps its source.
    """


class StepValueError(RLDSWriterError, ValueError):
    """A value given for a step or an episode does not match its feature.

    Attributes:
      path: the field path, e.g. `steps/observation/pixels`.
    """

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


class EncodingError(RLDSWriterError, ValueError):
    """An episode could not be encoded into a `tf.train.Example`."""


class DatasetExistsError(RLDSWriterError, FileExistsError):
    """The target directory already holds a dataset and no mode was given.

    Attributes:
      directory: the directory, when choosing a `mode` (append, overwrite)
        resolves it; else None. The command line words that advice as `--mode`.
    """

    def __init__(self, message: str, directory: str | None = None):
        super().__init__(message)
        self.directory = directory

    def __str__(self) -> str:
        return self.args[0] if self.args else ""

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.directory)


class IncompatibleDatasetError(RLDSWriterError, ValueError):
    """An existing dataset's features, name or format differ from the writer's."""


class UnsupportedFeatureError(RLDSWriterError, NotImplementedError):
    """A dataset's feature kind cannot be decoded without TensorFlow (it is valid TFDS)."""


class WriterClosedError(RLDSWriterError, RuntimeError):
    """The writer was used after `close()` or after it failed."""


class WriterFailedError(RLDSWriterError, RuntimeError):
    """The background writer thread failed; the cause is chained."""


class ForkedRecorderError(RLDSWriterError, RuntimeError):
    """A forked child used a recorder or writer its parent made (the files are the parent's)."""


class RecorderThreadError(RLDSWriterError, RuntimeError):
    """A thread stepped an episode that another thread records (one recorder, one env loop)."""


class StorageNotSupportedError(RLDSWriterError, NotImplementedError):
    """The storage behind a path cannot do what was asked.

    A protocol fsspec does not know, a store without the conditional create
    the one-writer lock needs, a file format whose writer needs a local file.
    """


class StorageError(RLDSWriterError, OSError):
    """A request to an object store failed, after its retries.

    The message names the object (`path`) and what to check: the endpoint, the
    credentials, the network. An `OSError`, as the local disk's errors are.

    Attributes:
      path: the object or directory the request was for.
    """

    def __init__(self, message: str, path: str = ""):
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return self.args[0] if self.args else ""

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.path)


class StorageAccessError(StorageError, PermissionError):
    """The object store refused the credentials (403 Forbidden, a wrong secret)."""


class BucketNotFoundError(StorageError, FileNotFoundError):
    """The bucket a path names does not exist (or the credentials cannot see it)."""


class UploadFailedError(StorageError):
    """A shard could not be uploaded; its local copy was kept (`kept`) for a later upload.

    Attributes:
      kept: the local file that holds the shard, in the unsaved-shards directory.
    """

    def __init__(self, message: str, path: str = "", kept: str = ""):
        super().__init__(message, path)
        self.kept = kept

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.path, self.kept)


class LockedError(RLDSWriterError, RuntimeError):
    """Another live writer holds the dataset directory."""


class CorruptRecordError(RLDSWriterError, IOError):
    """A shard record failed its length or CRC check, or could not be read.

    Every tool reports a damaged record with this one message: the file, the
    byte offset (TFRecord) and the record index, and the advice to recover.

    Attributes:
      path: the shard file.
      offset: byte offset of the bad TFRecord record (array_record: record index).
      reason: what failed.
      index: the record's index in its shard, if known.
    """

    def __init__(self, path: str, offset: int, reason: str, index: int | None = None):
        record = (
            f"record {index} at byte offset {offset}"
            if index is not None
            else (f"the record at byte offset {offset}")
        )
        super().__init__(
            f"{path}: {record} is corrupt: {reason}; run `rlds-writer recover "
            f"{_directory(path)}` to set damaged records aside"
        )
        self.path = path
        self.offset = offset
        self.reason = reason
        self.index = index


class CorruptArrayRecordError(CorruptRecordError):
    """An array_record record could not be read (bad chunk hash or torn file)."""

    def __init__(self, path: str, index: int, reason: str):
        IOError.__init__(
            self,
            f"{path}: array_record record {index} is corrupt: {reason}; run `rlds-writer "
            f"recover {_directory(path)}` to set the damaged shard aside",
        )
        self.path = path
        self.offset = index
        self.reason = reason
        self.index = index


def _directory(path: str) -> str:
    return os.path.dirname(os.fspath(path)) or "."


class WireError(RLDSWriterError, ValueError):
    """The bytes are not a well-formed `tf.train.Example`."""


class DecodeError(RLDSWriterError, ValueError):
    """A record is not a valid episode for the dataset's features.

    The message names the file, the record and the field.
    """


class RecoveryError(RLDSWriterError):
    """A directory cannot be recovered (its dataset_info.json is lost, a merge is pending)."""


class DiskFullError(RLDSWriterError, OSError):
    """The disk (or quota) filled up during a repair; what was on disk is kept.

    The message names the directory, says what was kept and how to finish:
    free space and run the same command again.
    """

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class MergeError(RLDSWriterError):
    """A merge cannot go on (an unfinished merge of other sources, a vanished shard)."""


class EpisodesLostError(RLDSWriterError, RuntimeError):
    """Episodes a recorder's runners finished are missing from the dataset they were bound for."""


class ViewerRequestError(RLDSWriterError, ValueError):
    """A request `rlds-writer view`'s server refuses: no such episode, a bad parameter.

    Attributes:
      status: the HTTP status the page gets (400, 403, 404, 415, 422), with the message.
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class MissingShardError(RLDSWriterError, FileNotFoundError):
    """A shard file that `dataset_info.json` lists is not there (deleted, or never synced).

    A `FileNotFoundError`, as before; `listed` words it with the commands that help.
    """

    @classmethod
    def listed(cls, path: str, split: str, index: int, dataset: str) -> MissingShardError:
        """The error for shard `index` of `split` at `path`, in the dataset directory `dataset`."""
        return cls(
            f"{path}: shard {index} of split {split!r} is listed in dataset_info.json but "
            f"missing; restore the file if you have it, else run `rlds-writer validate "
            f"{dataset}` to see what else is damaged and `rlds-writer recover {dataset}` to "
            "list only the episodes on disk (the missing shard's are lost)"
        )


class NotADatasetError(RLDSWriterError, FileNotFoundError):
    """A path given as a dataset is not one (`store.dataset.locate.require_dataset` words it).

    Attributes:
      path: the path as given.
      reason: what is there instead (it does not exist, it is a file, ...).
      datasets: datasets found below the path (a directory of datasets), for
        the caller to offer; empty if none.
    """

    def __init__(self, path: str, reason: str, datasets: list[str] | None = None):
        self.path = path
        self.reason = reason
        self.datasets = list(datasets or [])
        super().__init__(self.message(lambda d: f"rlds_writer.open_dataset({d!r})"))

    def message(self, open_command: Callable[[str], str] | None = None) -> str:
        """The one-line message; `open_command(dataset)` words how to open one found below.

        Without `open_command`, the message stops before the datasets below.
        """
        text = (
            f"{self.path}: not an RLDS dataset directory (expected one with "
            f"dataset_info.json and features.json): {self.reason}"
        )
        if not self.datasets or open_command is None:
            return text
        shown = self.datasets[:_MAX_LISTED]
        more = len(self.datasets) - len(shown)
        listed = ", ".join(open_command(d) for d in shown) + (f" (and {more} more)" if more else "")
        found = counted(len(self.datasets), "dataset")
        return f"{text}; {found} below it, {'open it' if len(shown) == 1 else 'pick one'}: {listed}"

    def __str__(self) -> str:
        return self.args[0] if self.args else ""

    def __reduce__(self) -> tuple:
        return type(self), (self.path, self.reason, self.datasets)


_MAX_LISTED = 10


class MissingDependencyError(RLDSWriterError, ModuleNotFoundError):
    """An optional library a feature needs is not installed; the message says how to get it.

    A `ModuleNotFoundError` (so an `ImportError`), for code that already
    catches those. Raised when the feature is used, never by `import rlds_writer`.

    Attributes:
      name: the module that is missing (as on `ModuleNotFoundError`).
      feature: what needed it.
      extra: the `rlds_writer` extra that installs it, or None.
    """

    def __init__(
        self, message: str, *, name: str | None = None, feature: str = "", extra: str | None = None
    ):
        super().__init__(message, name=name)
        self.feature = feature
        self.extra = extra

    def __reduce__(self) -> tuple:
        state = {"name": self.name, "feature": self.feature, "extra": self.extra}
        return _rebuild_missing_dependency, (str(self), state)


def _rebuild_missing_dependency(message: str, state: dict) -> MissingDependencyError:
    return MissingDependencyError(message, **state)


# The optional modules (import names) and the extra of setup.py's
# `extras_require` that installs each: the one place that says which extra a
# missing module needs. A feature in several extras' reach (pyarrow: `convert`
# and `lerobot`) may name its own extra to `missing_dependency`.
OPTIONAL_MODULES = {
    "gymnasium": "gymnasium",
    "matplotlib": "plot",
    "datasets": "hf",
    "h5py": "convert",
    "minari": "convert",
    "msgpack": "convert",
    "msgpack_numpy": "convert",
    "pyarrow": "convert",
    "pandas": "lerobot",
    "av": "lerobot",
    "ray": "rllib",
    "torch": "torch",
    "pettingzoo": "pettingzoo",
    "simplejpeg": "reader",
    "apache_beam": "beam",
}


def pip_install(extra: str) -> str:
    """The command that installs an extra (quoted: brackets are globs in zsh)."""
    return f'pip install "rlds_writer[{extra}]"'


def missing_dependency(
    module: str, feature: str, extra: str | None = None
) -> MissingDependencyError:
    """The error for `feature` when the optional `module` is not installed.

    Args:
      module: the module that cannot be imported (a submodule counts as its package).
      feature: what needs it, in words the user recognises ("plotting statistics").
      extra: the extra that installs it; default `OPTIONAL_MODULES[module]`.
    """
    top = module.partition(".")[0]
    extra = extra or OPTIONAL_MODULES.get(top)
    advice = pip_install(extra) if extra else f"pip install {top}"
    return MissingDependencyError(
        f"{feature} needs {top}, which is not installed: {advice}",
        name=top,
        feature=feature,
        extra=extra,
    )


def import_optional(module: str, feature: str, extra: str | None = None) -> types.ModuleType:
    """Imports an optional module, or raises `missing_dependency(module, feature, extra)`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if isinstance(e, MissingDependencyError) or not _is_optional(e):
            raise
        raise missing_dependency(e.name or module, feature, extra) from e


@contextlib.contextmanager
def optional_dependencies(feature: str, extra: str | None = None) -> Iterator[None]:
    """Turns an optional module missing inside the block into `MissingDependencyError`.

    For a feature's entry point (a dispatcher, a lazily loaded name): every
    import below it is covered, however deep. Other `ModuleNotFoundError`s
    (not optional modules of ours) pass unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as e:
        if isinstance(e, MissingDependencyError) or not _is_optional(e):
            raise
        raise missing_dependency(e.name or "", feature, extra) from e


def _is_optional(error: ModuleNotFoundError) -> bool:
    return (error.name or "").partition(".")[0] in OPTIONAL_MODULES


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and the noun that agrees with it: "1 episode", "3 episodes"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class SourceError(RLDSWriterError, ValueError):
    """A file given to `convert` cannot be read safely as its format says.

    It is malformed, declares more data than it holds (a forged header, a
    decompression bomb), points outside itself (HDF5 external links, external
    storage, virtual datasets) or holds values the format does not allow. The
    message names the file and the field.
    """

    def __str__(self) -> str:
        # File, member and link names come from the source: keep the message one line.
        return super().__str__().replace("\r", "\\r").replace("\n", "\\n")
