"""Exceptions raised by rlds_writer.

Every error that concerns a value names the field path, what was expected and
what arrived, so that a bad step can be found from the message alone.
"""

from __future__ import annotations


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


class WriterClosedError(RLDSWriterError, RuntimeError):
    """The writer was used after `close()` or after it failed."""


class WriterFailedError(RLDSWriterError, RuntimeError):
    """The background writer thread failed; the cause is chained."""


class LockedError(RLDSWriterError, RuntimeError):
    """Another live writer holds the dataset directory."""
