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

The pipeline, one work item per source file or group of episodes:

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

import builtins
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer import errors
from rlds_writer.interop import episodes as ep

_RESULT = ".beam-result.json"


# ----------------------------------------------------------------- splitting


@dataclasses.dataclass(frozen=True)
class Splitter:
    """How a source format splits into work items.

    Attributes:
      units: `(src, options) -> [unit, ...]`, run on the driver: the source's
        episode files, groups or ids, in the order the format reads them.
      read: `(src, units, options) -> episodes`, run on workers: the
        `SourceEpisode`s of some units, in order.
      per_item: units per work item.
    """

    units: Callable[[str, Mapping[str, Any]], list[Any]]
    read: Callable[[str, Sequence[Any], Mapping[str, Any]], Iterator[ep.SourceEpisode]]
    per_item: int = 1


def _npz_units(src: str, options: Mapping[str, Any]) -> list[str]:
    from rlds_writer.interop import array_episodes

    return array_episodes.npz_entries(src)


def _npz_read(
    src: str, units: Sequence[str], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop import array_episodes

    mapping = array_episodes.parse_mapping(options.get("mapping"))
    for name in units:
        yield array_episodes.read_npz_entry(src, name, mapping, options.get("max_inflation"))


def _hdf5_units(src: str, options: Mapping[str, Any]) -> list[str]:
    from rlds_writer.interop import array_episodes

    return array_episodes.hdf5_episode_names(src, options.get("episodes_group") or "data")


def _hdf5_read(
    src: str, units: Sequence[str], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop import array_episodes

    yield from array_episodes.read_hdf5_episodes(
        src,
        array_episodes.parse_mapping(options.get("mapping")),
        options.get("episodes_group") or "data",
        options.get("max_inflation"),
        names=list(units),
    )


def _rllib_units(src: str, options: Mapping[str, Any]) -> list[str]:
    from rlds_writer.interop import rllib_episodes

    return [os.fspath(f) for f in rllib_episodes.parquet_files(src)]


def _rllib_read(
    src: str, units: Sequence[str], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop import rllib_episodes

    for file in units:
        yield from rllib_episodes.read_episodes(file)


def _d4rl_units(src: str, options: Mapping[str, Any]) -> list[int]:
    from rlds_writer.interop import d4rl

    count = d4rl.count_episodes(
        src, options.get("drop_partial", False), options.get("max_inflation")
    )
    return list(range(count))


def _d4rl_read(
    src: str, units: Sequence[int], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop import d4rl

    yield from d4rl.read_episodes(
        src,
        options.get("drop_partial", False),
        max_inflation=options.get("max_inflation"),
        select=units,
    )


def _lerobot_units(src: str, options: Mapping[str, Any]) -> list[list[str]]:
    """Data files, those that share an episode grouped (LeRobot itself never splits one)."""
    from rlds_writer.interop import lerobot

    units: list[list[str]] = []
    last = None
    for name in lerobot.data_files(src):
        first, end = _first_and_last_episode(Path(src) / "data" / name)
        if units and first is not None and first == last:
            units[-1].append(name)
        else:
            units.append([name])
        last = end if end is not None else last
    return units


def _first_and_last_episode(file: Path) -> tuple[int | None, int | None]:
    """The `episode_index` of a data file's first and last frame (two row groups read)."""
    import pyarrow.parquet as pq

    from rlds_writer.interop.source_limits import check_parquet, source_errors

    check_parquet(file)
    with source_errors(file):
        parquet = pq.ParquetFile(file)
        if "episode_index" not in parquet.schema_arrow.names:
            return None, None  # the worker refuses it, naming it
        groups = [
            g
            for g in range(parquet.metadata.num_row_groups)
            if parquet.metadata.row_group(g).num_rows
        ]
        if not groups:
            return None, None
        head = parquet.read_row_group(groups[0], columns=["episode_index"]).column(0)
        tail = parquet.read_row_group(groups[-1], columns=["episode_index"]).column(0)
        return head[0].as_py(), tail[len(tail) - 1].as_py()


def _lerobot_read(
    src: str, units: Sequence[list[str]], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop import lerobot

    yield from lerobot.read_episodes(src, files=[f for unit in units for f in unit])


def _minari_units(src: str, options: Mapping[str, Any]) -> list[int]:
    from rlds_writer.interop import minari

    return minari.episode_indices(src)


def _minari_read(
    src: str, units: Sequence[int], options: Mapping[str, Any]
) -> Iterator[ep.SourceEpisode]:
    from rlds_writer.interop import minari

    yield from minari.read_episodes(src, indices=list(units))


SPLITTERS = {
    "npz-dir": Splitter(_npz_units, _npz_read),
    "hdf5-episodes": Splitter(_hdf5_units, _hdf5_read),
    "rllib-episodes": Splitter(_rllib_units, _rllib_read),
    # Episodes of one HDF5 file: a few per item pays for opening the dataset.
    "minari": Splitter(_minari_units, _minari_read, per_item=16),
    # Row ranges of one flat table: each work item reads the flag columns
    # (a byte a row) to find its episodes, and only their rows of the rest.
    "d4rl-hdf5": Splitter(_d4rl_units, _d4rl_read, per_item=64),
    # A data file each (files that continue an episode of the previous one together).
    "lerobot": Splitter(_lerobot_units, _lerobot_read),
}


def _read_src(source_format: str, src: os.PathLike | str) -> str:
    """The path workers read: a local Minari id becomes its dataset directory."""
    if source_format == "minari":
        from rlds_writer.interop import minari

        return os.fspath(minari.resolve_data_path(src).resolve())
    return os.fspath(Path(os.fspath(src)).resolve())


# ------------------------------------------------------------- worker steps


def _error(e: BaseException) -> dict[str, str]:
    return {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)}


def _raise(record: Mapping[str, str]) -> None:
    """Raises a worker's error on the driver, as its class where that is ours or builtin."""
    module, _, name = record["type"].rpartition(".")
    cls = None
    if module == "rlds_writer.errors":
        cls = getattr(errors, name, None)
    elif module == "builtins":
        cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            error = cls(record["message"])
        except TypeError:
            error = None
        if error is not None:
            raise error
    raise RuntimeError(f"a Beam worker failed: {record['type']}: {record['message']}")


def _leaf_json(tree: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _leaf_json(value)
        else:
            out[key] = [value.dtype.str, list(value.shape), value.text]
    return out


def _leaf_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _leaf_tree(value)
        else:
            dtype, shape, text = value
            out[key] = ep._Leaf(np.dtype(dtype), tuple(shape), text)  # noqa: SLF001
    return out


def _merge_trees(into: dict[str, Any], tree: Mapping[str, Any], path: str, where: str) -> None:
    """Merges a work item's schema into the schema so far (keys keep first-seen order)."""
    for key, value in tree.items():
        sub = f"{path}/{key}" if path else key
        known = into.get(key)
        if known is None:
            into[key] = value
        elif isinstance(known, dict) and isinstance(value, dict):
            _merge_trees(known, value, sub, where)
        elif isinstance(known, dict) or isinstance(value, dict):
            kinds = ("a dict", "an array")
            now, before = kinds if isinstance(value, dict) else kinds[::-1]
            raise errors.SpecError(f"{sub}: {now} in {where}, {before} before")
        elif known != value:
            raise errors.SpecError(
                f"{sub}: {ep._describe_leaf(value)} in {where}, "  # noqa: SLF001
                f"{ep._describe_leaf(known)} before"  # noqa: SLF001
            )


def scan_item(
    item: tuple[int, list[Any]], source_format: str, src: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    """Work item, pass 1: the schema of its episodes (runs on a worker)."""
    index, units = item
    try:
        schema = ep.Schema()
        for episode in SPLITTERS[source_format].read(src, units, options):
            schema.add(episode)
        return {"index": index, "episodes": schema.num_episodes, "tree": _leaf_json(schema.tree)}
    except Exception as e:  # noqa: BLE001 - raised on the driver, as in one process
        return {"index": index, "error": _error(e)}


def make_plan(scans: list[dict[str, Any]], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The merged schema, the features and each item's first episode (one element)."""
    scans = sorted(scans, key=lambda s: s["index"])
    for scan in scans:
        if "error" in scan:
            return {"error": scan["error"]}
    try:
        tree: dict[str, Any] = {}
        firsts, total = [], 0
        for scan in scans:
            part = _leaf_tree(scan["tree"])
            episode_part = part.pop("<episode>", {})
            where = f"episodes {total}-{total + scan['episodes'] - 1}"
            _merge_trees(tree, part, "steps", where)
            episode_tree = tree.setdefault("<episode>", {})
            _merge_trees(episode_tree, episode_part, "<episode metadata>", where)
            firsts.append(total)
            total += scan["episodes"]
        if not total:
            raise ValueError(f"{settings['source']}: no episodes found")
        _dataset_info(ep.Schema(tree, total), settings)  # refuses what has no features
        per_file = settings["max_episodes_per_file"]
        return {
            "tree": _leaf_json(tree),
            "total": total,
            "firsts": firsts,
            "num_shards": -(-total // per_file),
        }
    except Exception as e:  # noqa: BLE001
        return {"error": _error(e)}


def _dataset_info(schema: ep.Schema, settings: Mapping[str, Any]) -> Any:
    from rlds_writer.store import layout
    from rlds_writer.store.writer import build_dataset_info

    cfg = ep.dataset_config(
        schema,
        settings["name"],
        image_encoding=settings["image_encoding"],
        jpeg_quality=settings["jpeg_quality"],
        **dict(settings["config_kwargs"] or {}),
    )
    metadata = settings["metadata"]
    metadata = layout.jsonable(dict(metadata)) if metadata is not None else None
    return build_dataset_info(
        cfg, settings["name"], settings["version"], settings["destination"], metadata
    )


@functools.lru_cache(maxsize=2)
def _encoder(tree_json: str, settings_json: str) -> tuple[Any, Any]:
    """The encoder and step layout of the plan's schema (built once per worker).

    The features are built from the schema as the single-process run builds
    them (not read back from JSON, which orders them differently), so the
    records are the same bytes.
    """
    from rlds_writer.record.episode import StepFields
    from rlds_writer.store import encoding

    tree = _leaf_tree(json.loads(tree_json))
    info = _dataset_info(ep.Schema(tree, 0), json.loads(settings_json))
    encoder = encoding.EpisodeEncoder(info.features, image_workers=0)
    return encoder, StepFields(encoder.fields, empty_dicts=encoder.empty_dicts)


def encode_item(
    item: tuple[int, list[Any]],
    source_format: str,
    src: str,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    plan: Mapping[str, Any],
) -> Iterator[tuple[int, tuple[int, bytes, int, bool]]]:
    """Work item, pass 2: `(shard, (episode number, record, steps, terminated))` per episode.

    A failure is keyed -1 and carries the error instead (`write_shard` passes it on).
    """
    if "error" in plan:
        return
    index, units = item
    first = plan["firsts"][index]
    per_file = settings["max_episodes_per_file"]
    expected = (plan["firsts"] + [plan["total"]])[index + 1] - first
    count = 0
    try:
        encoder, fields = _encoder(json.dumps(plan["tree"]), json.dumps(settings))
        for episode in SPLITTERS[source_format].read(src, units, options):
            number = first + count
            if count >= expected:
                raise errors.SourceError(f"{src}: work item {units} changed while converting")
            rlds = ep.rlds_episode(fields, episode)
            parts, _ = encoder.encode_parts(rlds.columns, rlds.episode_values)
            record = b"".join(parts)
            steps = rlds.num_steps
            rlds.release()
            count += 1
            yield number // per_file, (number, record, steps, bool(episode.terminated))
        if count != expected:
            raise errors.SourceError(f"{src}: work item {units} changed while converting")
    except Exception as e:  # noqa: BLE001
        yield -1, (index, json.dumps(_error(e)).encode(), 0, False)


def write_shard(
    keyed: tuple[int, Sequence[tuple[int, bytes, int, bool]]],
    work: str,
    settings: Mapping[str, Any],
    plan: Mapping[str, Any],
) -> dict[str, Any]:
    """Writes one shard's episodes, in order (runs on a worker); returns what it holds."""
    from etils import epath

    from rlds_writer.store import layout, shards

    shard, values = keyed
    values = sorted(values, key=lambda v: v[0])
    if shard < 0:
        return {"shard": -1, "error": json.loads(values[0][1]), "item": values[0][0]}
    template = layout.ShardTemplate(
        layout.TFDS_DEFAULT_TEMPLATE, settings["name"], settings["split"], settings["file_format"]
    )
    path = epath.Path(work) / template.filename(shard, plan["num_shards"])
    # A runner may retry the bundle: write aside, then replace.
    temp = layout.temp_path(path)
    writer = shards.open_writer(temp, settings["file_format"])
    try:
        for _, record, _, _ in values:
            writer.write(record)
    finally:
        writer.close()
    os.replace(temp, path)
    return {
        "shard": shard,
        "first": values[0][0],
        "records": writer.num_records,
        "bytes": writer.num_bytes,
        "steps": sum(v[2] for v in values),
        "terminated": sum(v[3] for v in values),
    }


def write_result(written: list[dict[str, Any]], work: str, plan: Mapping[str, Any]) -> None:
    """Hands the driver the plan and the shards (one file in the staging directory)."""
    from rlds_writer.store import layout

    failed = sorted((w for w in written if w["shard"] < 0), key=lambda w: w["item"])
    result = {"plan": dict(plan), "shards": sorted(written, key=lambda w: w["shard"])}
    if "error" in plan:
        result["error"] = plan["error"]
    elif failed:
        result["error"] = failed[0]["error"]
    layout.atomic_write_text(os.path.join(work, _RESULT), json.dumps(result))


# -------------------------------------------------------------------- driver


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
    from rlds_writer.store.writer import check_mode

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
        _read_src(source_format, src),
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
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from rlds_writer.interop import staging
    from rlds_writer.store import layout

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
        "metadata": layout.jsonable(dict(metadata)) if metadata is not None else None,
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
    with staging.staging_directory(dest) as work:
        with beam.Pipeline(options=pipeline_options) as pipeline:
            work_items = pipeline | "WorkItems" >> beam.Create(items)
            plan = beam.pvalue.AsSingleton(
                work_items
                | "Scan" >> beam.Map(scan_item, source_format, src, options)
                | "Scans" >> beam.combiners.ToList()
                | "Plan" >> beam.Map(make_plan, settings)
            )
            _ = (
                work_items
                | "Encode" >> beam.FlatMap(encode_item, source_format, src, options, settings, plan)
                | "ByShard" >> beam.GroupByKey()
                | "WriteShard" >> beam.Map(write_shard, os.fspath(work), settings, plan)
                | "Shards" >> beam.combiners.ToList()
                | "Result" >> beam.Map(write_result, os.fspath(work), plan)
            )
        result = json.loads((work / _RESULT).read_text())
        (work / _RESULT).unlink()
        if "error" in result:
            _raise(result["error"])
        report = _finish(work, result, settings)
        _publish(work, dest, mode)
    report.destination = os.fspath(destination)
    return report


def _finish(work: Path, result: Mapping[str, Any], settings: Mapping[str, Any]) -> Any:
    """Checks the shards the workers wrote and adds the dataset's JSON files to them."""
    from tensorflow_datasets.core import file_adapters

    from rlds_writer.store import layout

    plan, written = result["plan"], result["shards"]
    per_file = settings["max_episodes_per_file"]
    got = [(w["shard"], w["first"], w["records"]) for w in written]
    want = [
        (i, i * per_file, min(per_file, plan["total"] - i * per_file))
        for i in range(plan["num_shards"])
    ]
    if got != want:
        raise RuntimeError(f"the Beam workers wrote shards {got}, expected {want}")
    info = _dataset_info(ep.Schema(_leaf_tree(plan["tree"]), plan["total"]), settings)
    info.set_file_format(file_adapters.FileFormat.from_value(settings["file_format"]))
    info.write_to_directory(work)
    template = layout.ShardTemplate(
        layout.TFDS_DEFAULT_TEMPLATE, settings["name"], settings["split"], settings["file_format"]
    )
    listing = layout.with_splits(
        layout.read_json(work / layout.DATASET_INFO),
        {settings["split"]: ([w["records"] for w in written], sum(w["bytes"] for w in written))},
        {settings["split"]: template},
    )
    layout.atomic_write_text(work / layout.DATASET_INFO, layout.dumps_info(listing))
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
    from rlds_writer.store import layout
    from rlds_writer.store.locking import DirectoryLock
    from rlds_writer.store.writer import check_mode

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
        layout.fsync_directory(dest)
    finally:
        lock.release()
