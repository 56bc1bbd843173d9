"""`recover`: make a crashed or damaged dataset list every complete episode.

The repair engine is `rlds_writer.store.repair.recovery` (the writer's append mode
runs it too); this is the public entry point, which takes the directory lock.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from rlds_writer.store.dataset import Dataset
from rlds_writer.store.dataset.locate import not_a_dataset
from rlds_writer.store.dataset.locking import DirectoryLock
from rlds_writer.store.repair.recovery import RecoveryReport, ShardReport, run_recovery
from rlds_writer.store.storage import file_io, unsaved_shards
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

__all__ = ["RecoveryReport", "ShardReport", "recover"]


def recover(
    path: Dataset | epath.PathLike,
    *,
    dry_run: bool = False,
    verify_data: bool = True,
) -> RecoveryReport:
    """Scans a dataset's shards and makes `dataset_info.json` list all of them.

    Works on datasets written by rlds_writer and by TFDS itself
    (`SequentialWriter`, `tfds build`, Beam), whatever their shard names.

    Args:
      path: the dataset directory (local, or an fsspec URL such as `s3://...`), or a
        `Dataset` (recover then rewrites its listing: reopen it afterwards), or a
        directory of shards a failed upload kept (named in the writer's error):
        they are uploaded to their dataset, which is then recovered. A remote
        dataset's kept shards on this machine are uploaded first in any case.
      dry_run: report what would be done without changing anything.
      verify_data: check the data CRC of every TFRecord record. With False,
        shards whose record count matches `dataset_info.json` only have their
        record headers checked (the last shard of each split, where a crash
        leaves its tear, is always fully checked). Readers still check every
        CRC when they read.

    Returns:
      A `RecoveryReport`.

    Raises:
      NotADatasetError: `path` is not a directory, or holds no dataset.
      RecoveryError: `dataset_info.json` or `features.json` is missing or
        unreadable while shard files exist, names files outside the
        directory, or a merge into the directory was interrupted (rerun the
        merge instead).
      LockedError: a live writer holds the directory.
      DiskFullError: the disk filled up; nothing already written was lost and
        running it again with free space finishes the repair.
    """
    if isinstance(path, Dataset):
        path = path.path
    kept = None
    if file_io.is_local(path) and unsaved_shards.destination_of(os.fspath(path)):
        # The shards a failed upload kept: they go where they belong.
        kept = os.fspath(path)
        path = unsaved_shards.destination_of(kept)
    path = as_path(path)
    if not path.is_dir():
        raise not_a_dataset(path)
    if dry_run:
        return run_recovery(path, dry_run=True, verify_data=verify_data, kept=kept)
    try:
        lock = DirectoryLock(path, purpose="recover")
        lock.acquire()
    except OSError as e:
        if file_io.is_disk_full(e):
            raise file_io.disk_full_error(path, e, "taking its lock") from e
        raise
    try:
        return run_recovery(path, dry_run=False, verify_data=verify_data, kept=kept)
    finally:
        lock.release()
