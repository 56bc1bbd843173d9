"""The steps of the Beam `convert` pipeline that run on workers (`beam_convert`).

`scan_item` (a work item's schema), `make_plan` (the merged schema and each
item's first episode number: one element), `encode_item` (a work item's
episodes as records keyed by shard), `write_shard` (one shard, its episodes
in order) and `write_result` (what the driver reads back). Workers import
this module from their install of rlds_writer; everything they are given is
plain data. A worker's error travels as data and is raised on the driver as
its own class (`raise_error`), so it reads as in the single-process run.
"""

from __future__ import annotations

import builtins
import functools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer import errors
from rlds_writer.interop import episodes as ep
from rlds_writer.interop import source_schema
from rlds_writer.interop.beam_sources import SPLITTERS

RESULT = ".beam-result.json"


def _error(e: BaseException) -> dict[str, str]:
    return {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": str(e)}


def raise_error(record: Mapping[str, str]) -> None:
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


def leaf_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = leaf_tree(value)
        else:
            dtype, shape, text = value
            out[key] = source_schema._Leaf(np.dtype(dtype), tuple(shape), text)  # noqa: SLF001
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
                f"{sub}: {source_schema._describe_leaf(value)} in {where}, "  # noqa: SLF001
                f"{source_schema._describe_leaf(known)} before"  # noqa: SLF001
            )


def scan_item(
    item: tuple[int, list[Any]], source_format: str, src: str, options: Mapping[str, Any]
) -> dict[str, Any]:
    """Work item, pass 1: the schema of its episodes (runs on a worker)."""
    index, units = item
    try:
        schema = source_schema.Schema()
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
            part = leaf_tree(scan["tree"])
            episode_part = part.pop("<episode>", {})
            where = f"episodes {total}-{total + scan['episodes'] - 1}"
            _merge_trees(tree, part, "steps", where)
            episode_tree = tree.setdefault("<episode>", {})
            _merge_trees(episode_tree, episode_part, "<episode metadata>", where)
            firsts.append(total)
            total += scan["episodes"]
        if not total:
            raise ValueError(f"{settings['source']}: no episodes found")
        dataset_info(source_schema.Schema(tree, total), settings)  # refuses what has no features
        per_file = settings["max_episodes_per_file"]
        return {
            "tree": _leaf_json(tree),
            "total": total,
            "firsts": firsts,
            "num_shards": -(-total // per_file),
        }
    except Exception as e:  # noqa: BLE001
        return {"error": _error(e)}


def dataset_info(schema: source_schema.Schema, settings: Mapping[str, Any]) -> Any:
    """The `tfds.core.DatasetInfo` the single-process writer builds for this schema."""
    from rlds_writer.store.dataset import json_values
    from rlds_writer.store.writing.dataset_setup import build_dataset_info

    cfg = source_schema.dataset_config(
        schema,
        settings["name"],
        image_encoding=settings["image_encoding"],
        jpeg_quality=settings["jpeg_quality"],
        **dict(settings["config_kwargs"] or {}),
    )
    metadata = settings["metadata"]
    metadata = json_values.jsonable(dict(metadata)) if metadata is not None else None
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
    from rlds_writer.store.writing import encoding

    tree = leaf_tree(json.loads(tree_json))
    info = dataset_info(source_schema.Schema(tree, 0), json.loads(settings_json))
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

    from rlds_writer.store.dataset import layout
    from rlds_writer.store.formats import shards
    from rlds_writer.store.storage import file_io

    shard, values = keyed
    values = sorted(values, key=lambda v: v[0])
    if shard < 0:
        return {"shard": -1, "error": json.loads(values[0][1]), "item": values[0][0]}
    template = layout.ShardTemplate(
        layout.TFDS_DEFAULT_TEMPLATE, settings["name"], settings["split"], settings["file_format"]
    )
    path = epath.Path(work) / template.filename(shard, plan["num_shards"])
    # A runner may retry the bundle: write aside, then replace.
    temp = file_io.temp_path(path)
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
    from rlds_writer.store.storage import file_io

    failed = sorted((w for w in written if w["shard"] < 0), key=lambda w: w["item"])
    result = {"plan": dict(plan), "shards": sorted(written, key=lambda w: w["shard"])}
    if "error" in plan:
        result["error"] = plan["error"]
    elif failed:
        result["error"] = failed[0]["error"]
    file_io.atomic_write_text(os.path.join(work, RESULT), json.dumps(result))
