"""How each EnvRunner's episodes reach the driver's dataset, and the check that they all did.

Every EnvRunner asks the driver's `EpisodeSink` (`record/rllib/rllib_sink.py`)
whether it sees the runner's files: the runner makes a file in the output
root and the sink looks for it on the driver's node.

* **Seen** (the driver's node, or a shared file system): the runner writes
  its datasets straight into the output root, as on one machine.
* **Not seen** (another node, no shared file system): the runner writes to
  a staging directory of its own on its node (`<root>/.rlds_writer-staging/
  <incarnation>/writer-00002`) and, after every flush (the end of each
  `sample()`) and at close, ships the shards closed since the last time
  through Ray to the sink, which mirrors them into `<root>/writer-00002` on
  the driver's node. Steps are still written locally, at local speed; only
  closed shards travel, once each.
* **Object-store root** (`s3://`, `gs://`), any node: the same as *not
  seen*, with the staging directory in the node's temporary directory
  (`$TMPDIR/.rlds_writer-staging/<incarnation>`). Runners never write nor
  lock the bucket; the sink uploads each shard whole into
  `<root>/writer-00002`, and the driver merges in place in the bucket.

Either way the runner then reports how many episodes it has finished into
each directory; `check_delivered` compares those reports with what the
directories list before the merge, and `check_merged` with the merged
dataset after it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from rlds_writer.errors import EpisodesLostError, UnsupportedFeatureError, counted
from rlds_writer.record.rllib import rllib_sink
from rlds_writer.store.dataset import layout
from rlds_writer.store.storage import file_io
from rlds_writer.store.storage.object_path import as_path

STAGING = ".rlds_writer-staging"
PIECE = 16 * 1024 * 1024  # bytes of a shard per call to the sink


def _ray() -> Any:
    import ray

    return ray


def _identity(worker_index: int, split: str) -> dict[str, Any]:
    ray = _ray()
    return {
        "worker_index": worker_index,
        "split": split,
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
    }


class RunnerDelivery:
    """One EnvRunner's way to the driver: straight to disk, or shipped through Ray.

    Args:
      output_root: the recording's output root.
      sink: the driver's `EpisodeSink` actor, or None (no Ray: one process).
      shipping: write to a staging directory here and ship closed shards.
      identity: the runner's worker index, split, node and pid (for reports).
    """

    def __init__(self, output_root: str, sink: Any, shipping: bool, identity: dict[str, Any]):
        self.root = as_path(output_root)
        self.sink = sink
        self.shipping = shipping
        self.identity = identity
        self.incarnation = uuid.uuid4().hex
        if not shipping:
            self.local_root = self.root
        elif file_io.is_local(output_root):
            self.local_root = self.root / STAGING / self.incarnation
        else:
            # A bucket cannot stage: this node's temporary directory does.
            self.local_root = epath.Path(tempfile.gettempdir()) / STAGING / self.incarnation
        self._shipped: dict[str, set[str]] = {}  # dataset -> shard names shipped
        self._mirrors: dict[str, str] = {}  # dataset -> mirror directory on the driver
        self._reported: tuple[dict[str, dict[str, int]], list[str]] | None = None

    @classmethod
    def connect(cls, output_root: str, worker_index: int, split: str) -> RunnerDelivery:
        """Finds the driver's sink and whether it sees this runner's files."""
        sink = rllib_sink.find_sink(output_root)
        if sink is None:
            _refuse_a_bucket_without_sink(output_root)
            return cls(output_root, None, False, {"worker_index": worker_index, "split": split})
        root = as_path(output_root)
        # An object-store root: every runner ships (none writes or locks the bucket).
        shipping = not file_io.is_local(root) or not _seen_by(sink, root)
        return cls(output_root, sink, shipping, _identity(worker_index, split))

    def deliver(
        self,
        datasets: Mapping[epath.Path, tuple[str, int]],
        final: bool = False,
        unrecorded: Sequence[str] = (),
    ) -> None:
        """Ships what a flush closed (if shipping) and reports the episodes finished.

        Args:
          datasets: this runner's dataset directories -> (split, episodes it
            finished there), all flushed.
          final: the runner closed its writers (the last delivery).
          unrecorded: ids of episodes RLlib finished that the runner could
            not write (reported, so that the driver raises).
        """
        if self.sink is None:
            return
        ray = _ray()
        counts: dict[str, dict[str, int]] = {}
        for directory, (split, finished) in datasets.items():
            dataset = epath.Path(directory).relative_to(self.local_root).as_posix()
            target = self._ship(directory, dataset) if self.shipping else dataset
            counts.setdefault(target, {})[split] = finished
        state = (counts, list(unrecorded))
        if state != self._reported or final:  # one call per sample() only when it changed
            report = {**self.identity, "counts": counts, "shipped": self.shipping, "closed": final}
            report["unrecorded"] = state[1]
            ray.get(self.sink.report.remote(self.incarnation, report))
            self._reported = state
        if final and self.shipping:
            ray.get(self.sink.release.remote(self.incarnation))
            # Everything is on the driver's node now.
            shutil.rmtree(self.local_root, ignore_errors=True)

    def _ship(self, directory: epath.Path, dataset: str) -> str:
        ray = _ray()
        sink = self.sink
        mirror = self._mirrors.get(dataset)
        if mirror is None:
            mirror = self._mirrors[dataset] = ray.get(sink.mirror.remote(self.incarnation, dataset))
        info_path = directory / layout.DATASET_INFO
        if not info_path.exists():
            return mirror
        # The listing read first: every shard it names is closed and stays as it is.
        listing = info_path.read_bytes()
        info = file_io.read_json(info_path)
        shipped = self._shipped.setdefault(dataset, set())
        templates = layout.split_templates(info)
        for split, (lengths, _) in layout.read_splits(info).items():
            for index in range(len(lengths)):
                name = templates[split].filename(index, len(lengths))
                if name not in shipped:
                    self._ship_file(directory / name, dataset, name)
                    shipped.add(name)
                    # On the driver's node now: this node keeps one sample()'s shards at most.
                    (directory / name).unlink()
        files = {layout.DATASET_INFO: listing}
        for name in rllib_sink.METADATA_FILES:
            if (directory / name).exists():
                files[name] = (directory / name).read_bytes()
        ray.get(sink.commit.remote(self.incarnation, dataset, files))
        return mirror

    def _ship_file(self, path: epath.Path, dataset: str, name: str) -> None:
        ray = _ray()
        size = 0
        with open(path, "rb") as f:
            while True:
                piece = f.read(PIECE)
                if not piece and size:
                    break
                ray.get(self.sink.put.remote(self.incarnation, dataset, name, piece, size))
                size += len(piece)
                if not piece:
                    break
        ray.get(self.sink.seal.remote(self.incarnation, dataset, name, size))


def _refuse_a_bucket_without_sink(output_root: str) -> None:
    """Refuses to write a bucket straight from a node of a multi-node cluster.

    Without the driver's sink (the recorder's `on_algorithm_init` did not run
    in this Ray job) runners would lock the bucket themselves, and a lock
    left by a runner killed on another node cannot be taken over.
    """
    if file_io.is_local(output_root):
        return
    try:
        ray = _ray()
    except ImportError:
        return  # no Ray: one process writes
    if ray.is_initialized() and len([n for n in ray.nodes() if n.get("Alive")]) > 1:
        raise UnsupportedFeatureError(
            f"output_root {output_root}: this EnvRunner found no rlds_writer sink on the "
            "driver's node, so it would write the bucket from a node of a multi-node cluster; "
            "pass RLDSRecorder.with_options(...) to the algorithm's config.callbacks() and "
            "build it with build_algo(), whose driver starts the sink"
        )


def _seen_by(sink: Any, root: epath.Path) -> bool:
    """Whether the sink (on the driver's node) sees a file this process makes in `root`."""
    ray = _ray()
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".rlds_writer-probe-{uuid.uuid4().hex}"
    probe.write_bytes(b"")
    try:
        return bool(ray.get(sink.sees.remote(probe.name)))
    finally:
        probe.unlink(missing_ok=True)


def _runner_text(report: Mapping[str, Any]) -> str:
    node = report.get("node_ip") or "?"
    node_id = (report.get("node_id") or "")[:12]
    return (
        f"EnvRunner {report.get('worker_index')} (pid {report.get('pid')}) on node {node} "
        f"{node_id}".rstrip()
    )


def expected_counts(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Directory (relative to the root) -> split -> episodes the runners finished there."""
    out: dict[str, dict[str, int]] = {}
    for report in reports.values():
        for directory, splits in report["counts"].items():
            for split, n in splits.items():
                out.setdefault(directory, {})
                out[directory][split] = out[directory].get(split, 0) + int(n)
    return out


def listed_counts(directory: Any) -> tuple[dict[str, int], list[str]]:
    """Episodes per split a dataset directory lists, and the listed shard files it lacks."""
    directory = as_path(directory)
    if not (directory / layout.DATASET_INFO).exists():
        return {}, []
    info = file_io.read_json(directory / layout.DATASET_INFO)
    templates = layout.split_templates(info)
    counts, missing = {}, []
    for split, (lengths, _) in layout.read_splits(info).items():
        counts[split] = sum(lengths)
        for index in range(len(lengths)):
            name = templates[split].filename(index, len(lengths))
            if not (directory / name).exists():
                missing.append(name)
    return counts, missing


def check_delivered(root: epath.PathLike, reports: Mapping[str, Mapping[str, Any]]) -> None:
    """Checks that every runner directory holds the episodes its runners reported finished.

    Raises:
      EpisodesLostError: naming the runner, its node and the directory.
    """
    root = as_path(root)
    for directory, splits in sorted(expected_counts(reports).items()):
        listed, missing = listed_counts(root / directory)
        short = {s: n for s, n in splits.items() if listed.get(s, 0) < n}
        if not short and not missing:
            continue
        owners = [_runner_text(r) for r in reports.values() if directory in r["counts"]] or [
            "an EnvRunner"
        ]
        if missing:
            found = f"lacks the shard files {', '.join(sorted(missing))} it lists"
        else:
            found = ", ".join(
                f"holds {listed.get(s, 0)} of the {counted(n, 'episode')} finished in split {s!r}"
                for s, n in sorted(short.items())
            )
        raise EpisodesLostError(
            f"{' and '.join(owners)}: {root / directory} {found}; nothing was merged (the "
            "runner directories are kept): check that node's disk and logs, or record to a "
            "file system every node shares"
        )


def check_recorded(reports: Mapping[str, Mapping[str, Any]]) -> None:
    """Checks that no runner finished an episode it could not write.

    Raises:
      EpisodesLostError: naming each such runner, its node and the episode ids.
    """
    lost = [(r, r["unrecorded"]) for r in reports.values() if r.get("unrecorded")]
    if not lost:
        return
    n = sum(len(ids) for _, ids in lost)
    which = "; ".join(f"{_runner_text(r)}: {', '.join(ids)}" for r, ids in lost)
    raise EpisodesLostError(
        f"{counted(n, 'episode')} RLlib finished could not be recorded, their chunks did not "
        f"join up ({which}); every other episode was written (and merged, if merging): the "
        "runner's log names each episode's chunks, please report it with them"
    )


def check_merged(
    merged: epath.PathLike, reports: Mapping[str, Mapping[str, Any]], per_module: bool
) -> None:
    """Checks that the merged dataset(s) hold every episode the runners finished.

    Raises:
      EpisodesLostError: naming the merged directory, the split and the counts.
    """
    merged = as_path(merged)
    wanted: dict[str, dict[str, int]] = {}
    for directory, splits in expected_counts(reports).items():
        module = directory.rpartition("/")[0] if per_module else ""
        for split, n in splits.items():
            wanted.setdefault(module, {})
            wanted[module][split] = wanted[module].get(split, 0) + n
    for module, splits in sorted(wanted.items()):
        target = merged / module if module else merged
        listed, missing = listed_counts(target)
        for split, n in sorted(splits.items()):
            if listed.get(split, 0) < n or missing:
                raise EpisodesLostError(
                    f"{target}: split {split!r} holds {listed.get(split, 0)} episodes but the "
                    f"EnvRunners finished {n} (missing shard files: {missing or 'none'}); "
                    "run `rlds-writer validate` on it and merge the runner directories again"
                )
