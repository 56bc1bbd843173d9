"""What a failed `DatasetWriter` says at `close()`: what is saved, what is not, and where."""

from __future__ import annotations

import os
from typing import Any

from rlds_writer.errors import counted


def failure_text(path: Any, error: BaseException | None, dropped: int, shards: Any) -> str:
    """The message of the `WriterFailedError` that `close()` raises after a failure.

    Args:
      path: the dataset directory.
      error: what failed.
      dropped: episodes handed over after the failure, not written.
      shards: the writer's `SplitShards` (whether the store is remote, what
        it appended, the shards a failed upload left unsaved).
    """
    said = f"writing {path} failed: {error!r}"
    dropped_text = (
        f"; {counted(dropped, 'episode')} handed over after the failure were not written"
        if dropped
        else ""
    )
    if not shards.remote:
        return (
            f"{said}; episodes written before the failure are on disk (run "
            f"rlds_writer.recover on the directory){dropped_text}"
        )
    unsaved = shards.unsaved
    lost = [n for shard in unsaved for n in shard.episodes]
    saved = shards.appended - len(lost)
    text = (
        f"{said}; {counted(saved, 'episode')} of this run are in the store (run "
        f"`rlds-writer recover {path}` to list any the failure left unlisted)"
    )
    if unsaved:
        kept = sorted({os.path.dirname(shard.kept) for shard in unsaved})
        text += (
            f"; {counted(len(lost), 'episode')} were NOT uploaded (episodes "
            f"{_ranges(lost)} of this run, in the order written): their shards are kept "
            f"in {', '.join(kept)}; `rlds-writer recover {path}` uploads them once "
            "the store is reachable (or `rlds-writer recover` on that directory)"
        )
    return text + dropped_text


def _ranges(numbers: list[int]) -> str:
    """`1-4, 7, 9-10` for [1, 2, 3, 4, 7, 9, 10]."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
