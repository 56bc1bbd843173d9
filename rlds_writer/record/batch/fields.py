"""The batch recorder's fields: which leaves it keeps, how a batch's nest is read.

`check_kept` refuses, by name, a per-step field the batch recorder cannot
keep (numeric or image leaves of an open shape); `leaf_paths` and `pick` walk
the step layout's nests and the batches given; `cast_single` checks one
sub-env's value (`BatchRecorder.replace`); `with_end_reason` gives a config
the episode field every recorder's dataset has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError, UnsupportedFeatureError
from rlds_writer.record.batch import objects
from rlds_writer.record.batch.arrays import host_array
from rlds_writer.store.features import end_reasons, feature_defs, field_specs

_KINDS = (field_specs.FLOAT, field_specs.INT, field_specs.BYTES, field_specs.ZLIB)
_IMAGES = (field_specs.PNG, field_specs.JPEG)


def leaf_paths(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """`(path, leaf)` of every leaf of a nest of dicts."""
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in leaf_paths(v, (*path, k))]
    return [(path, tree)]


def pick(value: Any, path: tuple[str, ...], where: str) -> Any:
    """The batch at `path` of a nest given for a step, or a `StepValueError` naming `where`."""
    for name in path:
        if not isinstance(value, Mapping) or name not in value:
            got = sorted(map(str, value)) if isinstance(value, Mapping) else type(value).__name__
            raise StepValueError(where, f"expected a batch with key {name!r}, got {got}")
        value = value[name]
    return value


def cast_single(spec: field_specs.FieldSpec, value: Any) -> np.ndarray:
    """One sub-env's value for `spec`, cast as the batch would be."""
    arr = host_array(value, spec.key)
    if arr.shape != tuple(spec.shape):
        raise StepValueError(spec.key, f"expected {spec.describe()}, got {arr.dtype}{arr.shape}")
    if arr.dtype != spec.dtype and not np.can_cast(arr.dtype, spec.dtype, "same_kind"):
        raise StepValueError(spec.key, f"expected {spec.describe()}, got {arr.dtype}")
    return arr


def check_kept(spec: field_specs.FieldSpec) -> None:
    if spec.kind in objects.KINDS:
        return
    kept = spec.kind in _KINDS or spec.kind in _IMAGES
    if not kept or any(d is None for d in spec.shape) or spec.dtype is None:
        raise UnsupportedFeatureError(
            f"{spec.key}: the batch recorder keeps numeric, image and bytes fields of a fixed "
            f"shape (and text and TFDS-encoded ones), not {spec.kind} {spec.describe()}; "
            "record this env with "
            "RecordRLDSVector(step_fn=...) (a sub-env at a time) or declare a fixed-shape feature"
        )


def with_end_reason(config: Any) -> Any:
    """`config` with the episode field `end_reason` first, as the recorders' configs have it."""
    info = dict(config.episode_metadata_info or {})
    if end_reasons.END_REASON in info:
        return config
    return dataclasses.replace(
        config, episode_metadata_info={end_reasons.END_REASON: feature_defs.Text(), **info}
    )
