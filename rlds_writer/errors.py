"""Exceptions raised by rlds_writer.

Every error that concerns a value names the field path, what was expected and
what arrived, so that a bad step can be found from the message alone.
"""

from __future__ import annotations

import os


class RLDSWriterError(Exception):
    """Base class of every error raised by rlds_writer."""


class SpecError(RLDSWriterError, ValueError):
    """A dataset config or env spec cannot be turned into TFDS features."""


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
    """The target directory already holds a dataset and no mode was given."""


class IncompatibleDatasetError(RLDSWriterError, ValueError):
    """An existing dataset's features, name or format differ from the writer's."""


class UnsupportedFeatureError(RLDSWriterError, NotImplementedError):
    """A dataset's feature kind cannot be decoded without TensorFlow (it is valid TFDS)."""


class WriterClosedError(RLDSWriterError, RuntimeError):
    """The writer was used after `close()` or after it failed."""


class WriterFailedError(RLDSWriterError, RuntimeError):
    """The background writer thread failed; the cause is chained."""


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


class MissingDependencyError(RLDSWriterError, ImportError):
    """An optional library a function needs cannot be imported; the message says how to get it."""


class SourceError(RLDSWriterError, ValueError):
    """A file given to `convert` cannot be read safely as its format says.

    It is malformed, declares more data than it holds (a forged header, a
    decompression bomb), points outside itself (HDF5 external links, external
    storage, virtual datasets) or holds values the format does not allow. The
    message names the file and the field.
    """
