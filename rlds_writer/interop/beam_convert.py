"""`convert` as an Apache Beam pipeline, for sources too big for one process.

`convert(source_format, src, dest, pipeline_args, **options)` writes the
dataset `interop.convert(source_format, src, dest, **options)` writes, with
the same episodes in the same order, the same features, names and metadata,
but the reading and encoding run on a Beam runner chosen by Beam's standard
options (`--runner=DirectRunner --direct_running_mode=multi_processing
--direct_num_workers=8`, or `--runner=DataflowRunner`, `FlinkRunner`,
`SparkRunner` with their own options). The format's own `convert` runs on the
driver and names the dataset; `episodes.PIPELINE_WRITER` hands its
`write_episodes` call to `_write_with_pipeline` here.

The pipeline, one work item per source file or group of episodes
(`beam_sources.py` splits each format; `beam_steps.py` holds the steps):

1. `Scan`: each work item's episodes are read and their schema inferred;
2. `Plan` (one element): the schemas are merged in source order (as the
   single-process scan merges them), the features built, and each item's
   first episode numbered;
3. `Encode`: each work item's episodes are read again, aligned and encoded
   to `tf.train.Example` bytes with the recorder's own encoder, keyed by
   the shard they belong to (episode `i` goes to shard
   `i // max_episodes_per_file`);
4. `WriteShard`: each shard is written by a worker, its episodes in order,
   named as TFDS's Beam writer names them
   (`<name>-<split>.<format>-00003-of-00012`);
5. the driver writes `features.json`, `metadata.json` and, last,
   `dataset_info.json` listing the shards.

Everything is written into a private staging directory next to DEST and
moved into place when complete (one rename when DEST is new or empty): a
pipeline that dies leaves no `dataset_info.json` listing missing shards,
and nothing at DEST. `--mode overwrite` replaces a dataset at DEST once the
new one is complete; `--mode append` is not offered (convert into a new
directory, then `rlds-writer merge`).

Every source format splits (`SPLITTERS`): `npz-dir` (a work item per
episode file or `.npy` directory), `hdf5-episodes` (per episode group),
`rllib-episodes` (per Parquet file), `minari` (per 16 episodes, read by id),
`d4rl-hdf5` (per 64 episodes: row ranges of the one flat table; each item
reads the flag columns, a byte a row, to find them) and `lerobot` (per data
file; files that continue an episode of the one before go together). A new
format runs on Beam once it has an entry there.

Workers import this module from their own install of rlds_writer (never
the driver's `sys.path`): DirectRunner's processes share the driver's
environment; on Dataflow, Flink or Spark pass
`--setup_file=<rlds_writer checkout>/setup.py` (or `--extra_package` with
a wheel, or a container). SRC and the directory of DEST must be on a file
system every worker mounts.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlds_writer import errors
from rlds_writer.interop import beam_steps as steps
from rlds_writer.interop import episodes as ep
from rlds_writer.interop import source_schema
from rlds_writer.interop.beam_sources import SPLITTERS, Splitter, read_src

__all__ = ["SPLITTERS", "Splitter", "convert"]


def convert(
    source_format: str,
    src: os.PathLike | str,
    dest: os.PathLike | str,
    pipeline_args: Sequence[str] | Any = (),
    **options: Any,
) -> ep.ConversionReport:
    """Converts a source with an Apache Beam pipeline (see the module doc).

    Args:
      source_format: one of `SPLITTERS` (`npz-dir`, `hdf5-episodes`,
        `rllib-episodes`, `minari`).
      src: the source, on a file system every worker reads.
      dest: the dataset directory to write (its parent on a file system
        every worker writes).
      pipeline_args: Beam's pipeline options as command-line arguments
        (`["--runner=DirectRunner", "--direct_running_mode=multi_processing",
        "--direct_num_workers=8"]`) or a `PipelineOptions`.
      **options: the options of `interop.convert` for that format (name,
        split, version, file_format, max_episodes_per_file, mode `error` or
        `overwrite`, mapping, episodes_group, max_inflation, ...).

    Returns:
      The `ConversionReport`, as the single-process conversion's.

    Raises:
      ValueError: for a format that does not split, or `mode="append"`.
      DatasetExistsError: DEST holds a dataset and mode is `error`.
    """
    from rlds_writer import interop
    from rlds_writer.store.writing.dataset_setup import check_mode

    errors.import_optional("apache_beam", "converting with Apache Beam")  # before any work
    if source_format not in SPLITTERS:
        raise ValueError(
            f"--from {source_format} does not run as a Beam pipeline (no entry in "
            "rlds_writer.interop.beam_convert.SPLITTERS); convert it without Beam options"
        )
    mode = options.get("mode", "error")
    if mode == "append":
        raise ValueError(
            "--mode append does not run as a Beam pipeline; convert into a new directory, "
            "then add it with `rlds-writer merge`"
        )
    check_mode(dest, mode)
    options.pop("progress", None)
    write = functools.partial(
        _write_with_pipeline,
        source_format,
        read_src(source_format, src),
        dict(options),
        pipeline_args,
    )
    token = ep.PIPELINE_WRITER.set(write)
    try:
        return interop.convert(source_format, src, dest, **options)
    finally:
        ep.PIPELINE_WRITER.reset(token)


def _write_with_pipeline(
    source_format: str,
    src: str,
    options: Mapping[str, Any],
    pipeline_args: Sequence[str] | Any,
    destination: os.PathLike | str,
    *,
    name: str,
    source: str,
    metadata: Mapping[str, Any] | None,
    split: str,
    mode: str,
    file_format: str,
    max_episodes_per_file: int,
    version: str,
    config_kwargs: Mapping[str, Any] | None,
    image_encoding: str,
    jpeg_quality: int,
) -> ep.ConversionReport:
    """`write_episodes` on a Beam runner (installed as `episodes.PIPELINE_WRITER`)."""
    # Without Beam: one line naming the `beam` extra.
    beam = errors.import_optional("apache_beam", "converting with Apache Beam")
    from apache_beam.options.pipeline_options import PipelineOptions

    from rlds_writer.interop import staging
    from rlds_writer.store.dataset import json_values, layout

    if max_episodes_per_file < 1:
        raise ValueError(f"max_episodes_per_file must be >= 1, got {max_episodes_per_file}")
    layout.ShardTemplate(layout.TFDS_DEFAULT_TEMPLATE, name, split, file_format)  # checks names
    dest = Path(os.fspath(destination)).absolute()
    splitter = SPLITTERS[source_format]
    units = splitter.units(src, options)
    items = [
        (i, list(units[start : start + splitter.per_item]))
        for i, start in enumerate(range(0, len(units), splitter.per_item))
    ]
    settings = {
        "name": name,
        "source": source,
        "metadata": json_values.jsonable(dict(metadata)) if metadata is not None else None,
        "split": split,
        "file_format": file_format,
        "max_episodes_per_file": max_episodes_per_file,
        "version": version,
        "config_kwargs": dict(config_kwargs or {}),
        "image_encoding": image_encoding,
        "jpeg_quality": jpeg_quality,
        "destination": os.fspath(dest),
    }
    if isinstance(pipeline_args, PipelineOptions):
        pipeline_options = pipeline_args
    else:
        pipeline_options = PipelineOptions(list(pipeline_args))
    stale = staging.stale_partials(dest)
    with staging.staging_directory(dest) as work:
        with beam.Pipeline(options=pipeline_options) as pipeline:
            work_items = pipeline | "WorkItems" >> beam.Create(items)
            plan = beam.pvalue.AsSingleton(
                work_items
                | "Scan" >> beam.Map(steps.scan_item, source_format, src, options)
                | "Scans" >> beam.combiners.ToList()
                | "Plan" >> beam.Map(steps.make_plan, settings)
            )
            _ = (
                work_items
                | "Encode"
                >> beam.FlatMap(steps.encode_item, source_format, src, options, settings, plan)
                | "ByShard" >> beam.GroupByKey()
                | "WriteShard" >> beam.Map(steps.write_shard, os.fspath(work), settings, plan)
                | "Shards" >> beam.combiners.ToList()
                | "Result" >> beam.Map(steps.write_result, os.fspath(work), plan)
            )
        result = json.loads((work / steps.RESULT).read_text())
        (work / steps.RESULT).unlink()
        if "error" in result:
            steps.raise_error(result["error"])
        report = _finish(work, result, settings)
        _publish(work, dest, mode)
    report.destination = os.fspath(destination)
    if stale:
        report.notes.append(
            f"{errors.counted(len(stale), 'unfinished conversion')} to this destination "
            f"{'was' if len(stale) == 1 else 'were'} left by a killed run (or still running): "
            f"{', '.join(str(p) for p in stale[:3])}; delete them once no conversion is running"
        )
    return report


def _finish(work: Path, result: Mapping[str, Any], settings: Mapping[str, Any]) -> Any:
    """Checks the shards the workers wrote and adds the dataset's JSON files to them."""
    from tensorflow_datasets.core import file_adapters

    from rlds_writer.store.dataset import json_values, layout
    from rlds_writer.store.storage import file_io

    plan, written = result["plan"], result["shards"]
    per_file = settings["max_episodes_per_file"]
    got = [(w["shard"], w["first"], w["records"]) for w in written]
    want = [
        (i, i * per_file, min(per_file, plan["total"] - i * per_file))
        for i in range(plan["num_shards"])
    ]
    if got != want:
        raise RuntimeError(f"the Beam workers wrote shards {got}, expected {want}")
    info = steps.dataset_info(
        source_schema.Schema(steps.leaf_tree(plan["tree"]), plan["total"]), settings
    )
    info.set_file_format(file_adapters.FileFormat.from_value(settings["file_format"]))
    info.write_to_directory(work)
    template = layout.ShardTemplate(
        layout.TFDS_DEFAULT_TEMPLATE, settings["name"], settings["split"], settings["file_format"]
    )
    listing = layout.with_splits(
        file_io.read_json(work / layout.DATASET_INFO),
        {settings["split"]: ([w["records"] for w in written], sum(w["bytes"] for w in written))},
        {settings["split"]: template},
    )
    file_io.atomic_write_text(work / layout.DATASET_INFO, json_values.dumps_info(listing))
    terminated = sum(w["terminated"] for w in written)
    return ep.ConversionReport(
        source=settings["source"],
        destination=settings["destination"],
        episodes=plan["total"],
        steps=sum(w["steps"] for w in written),
        terminated=terminated,
        truncated=plan["total"] - terminated,
    )


def _publish(work: Path, dest: Path, mode: str) -> None:
    """Moves the finished dataset from `work` to `dest`, `dataset_info.json` last."""
    from rlds_writer.interop import staging
    from rlds_writer.store.dataset import layout
    from rlds_writer.store.dataset.locking import DirectoryLock
    from rlds_writer.store.storage import file_io
    from rlds_writer.store.writing.dataset_setup import check_mode

    if not dest.exists() or (dest.is_dir() and not any(dest.iterdir())):
        staging.move_into_place(work, dest)  # one rename: all or nothing
        return
    lock = DirectoryLock(dest)
    lock.acquire()
    try:
        if check_mode(dest, mode):  # overwrite: what lists the old shards goes first
            (dest / layout.DATASET_INFO).unlink()
            for child in dest.iterdir():
                if child.name in (layout.FEATURES, layout.METADATA) or layout.ANY_SHARD.match(
                    child.name
                ):
                    child.unlink()
        files = sorted(work.iterdir(), key=lambda p: p.name == layout.DATASET_INFO)
        for file in files:
            os.replace(file, dest / file.name)
        file_io.fsync_directory(dest)
    finally:
        lock.release()
