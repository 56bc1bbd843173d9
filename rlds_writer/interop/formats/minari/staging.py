"""Minari's staging: the export is built under a private Minari root, then moved in.

Minari writes `<root>/<dataset id>` itself, so the generic staging
(`interop.staging.export_staged`) cannot hand it a path: the staging
directory, next to the final dataset directory, is made the Minari root
(`MINARI_DATASETS_PATH`) while the exporter runs, and only the finished
dataset directory is renamed into the real root.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlds_writer.interop import staging
from rlds_writer.store.dataset import names
from rlds_writer.store.storage import file_io

# The Minari root is process-wide state (an environment variable): one export at a time.
_MINARI_ROOT = threading.Lock()


def minari_root() -> Path:
    """Minari's local datasets root, as `minari.storage.get_dataset_path` finds it (no mkdir)."""
    root = os.environ.get("MINARI_DATASETS_PATH")
    return Path(root) if root is not None else Path.home() / ".minari" / "datasets"


def minari_dataset_path(dataset_id: str) -> Path:
    """The directory of Minari dataset `dataset_id`; refuses ids that climb out of the root."""
    names.check_relative_path(
        dataset_id,
        "Minari dataset id",
        fix="expected e.g. 'cartpole/random-v0' (namespace/name-vN)",
    )
    return minari_root() / dataset_id


def export_staged(run: Callable[..., Any], src: os.PathLike | str, dataset_id: str) -> Any:
    """Runs a Minari export with a staging directory as the Minari root, then moves it in.

    Minari writes `<root>/<dataset id>`; the staging root is next to the
    final dataset directory, and only that dataset directory is renamed into
    the real root (its namespace is created there first, as Minari does).
    """
    dataset_id = os.fspath(dataset_id)
    namespace = minari_namespace(dataset_id)
    final = minari_dataset_path(dataset_id)
    names.check_disjoint(src, final, src_what="source dataset")
    if os.path.lexists(final):
        raise FileExistsError(
            f"{final}: Minari dataset {dataset_id!r} already exists; delete it "
            f"(`minari delete {dataset_id}`) or pick another id or version"
        )
    _real_namespace(namespace, final)
    stale = staging.stale_partials(final)
    with _MINARI_ROOT, staging.staging_directory(final) as root:
        before = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = os.fspath(root)
        try:
            report = run(src, dataset_id)
        finally:
            if before is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = before
        if os.path.lexists(final):
            raise FileExistsError(f"{final}: appeared during the export; pick another id")
        os.rename(root / dataset_id, final)
        file_io.fsync_directory(final.parent)
    staging.relabel(report, os.fspath(root), os.fspath(minari_root()))
    report.destination = dataset_id
    staging.note_stale(report, stale)
    return report


def minari_namespace(dataset_id: str) -> str | None:
    """The namespace of a Minari dataset id; refuses what Minari cannot parse."""
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        namespace, _, version = parse_dataset_id(dataset_id)
    except (ValueError, TypeError):  # TypeError: Minari's int(None) for a missing version
        version = None
    if version is not None:
        return namespace
    raise ValueError(
        f"{dataset_id!r} is not a Minari dataset id: expected (namespace/)name-v<version>, "
        "e.g. cartpole/random-v0"
    )


def _real_namespace(namespace: str | None, final: Path) -> None:
    """Creates the dataset's namespace in the real Minari root if it is missing."""
    from minari.namespace import create_namespace, list_local_namespaces

    if namespace is not None and namespace not in list_local_namespaces():
        create_namespace(namespace)
    final.parent.mkdir(parents=True, exist_ok=True)


def source_directory(src: str) -> str:
    """The directory `convert --from minari` reads: SRC itself, or a local dataset id's."""
    return src if os.path.exists(src) else os.fspath(minari_root() / src)
