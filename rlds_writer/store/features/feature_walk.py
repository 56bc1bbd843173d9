"""The one walk over feature specs, and checked access to `features.json` nodes.

`walk_features` yields every leaf of an RLDS feature tree (and every empty
`FeaturesDict`) with its path, per-step leaves first, descending nested dicts
and the top-level `steps` sequence. The writer runs it over TFDS's feature
objects (`field_specs.compile_fields`); the reader, statistics and `info` run
it over `features.json` (`walk_features_json`). A crafted `features.json` is
an `IncompatibleDatasetError` naming the field, never a `KeyError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from rlds_writer.errors import IncompatibleDatasetError, UnsupportedFeatureError

STEPS = "steps"
# The content keys of a feature node in features.json (its Feature proto as JSON).
_CONTENT_KEYS = ("featuresDict", "sequence", "tensor", "text", "image", "classLabel")
# Deeper than any real feature; past it a crafted file would exhaust the stack.
_MAX_DEPTH = 64


@dataclasses.dataclass(frozen=True)
class FeatureNode:
    """A leaf (or an empty `FeaturesDict`) met by `walk_features`.

    Attributes:
      path: its path inside an episode, e.g. `('steps', 'observation', 'image')`.
      in_steps: whether it is a per-step feature (under the top-level `steps`).
      spec: the feature as the caller's tree holds it (a TFDS feature object,
        or a `features.json` node).
      empty_dict: True for an empty `FeaturesDict` (no leaf; TFDS gives `{}`).
    """

    path: tuple[str, ...]
    in_steps: bool
    spec: Any
    empty_dict: bool = False

    @property
    def key(self) -> str:
        """The `tf.train.Example` key, e.g. `'steps/observation/image'`."""
        return "/".join(self.path)


def walk_features(
    top: Mapping[str, Any],
    children: Callable[[Any, tuple[str, ...]], Mapping[str, Any] | None],
    steps_feature: Callable[[Any, tuple[str, ...]], Any],
) -> Iterator[FeatureNode]:
    """The one walk over an RLDS feature tree: per-step leaves first, then the episode's.

    It descends nested `FeaturesDict`s, and the top-level `steps` sequence into
    its per-step feature; every other feature is a leaf, stored under one key.

    Args:
      top: the top-level features, by name.
      children: `children(spec, path)` gives a `FeaturesDict`'s features by
        name, or None if `spec` is not a dict.
      steps_feature: `steps_feature(spec, path)` gives the per-step feature of
        the top-level `steps` if `spec` is a sequence, else None.

    Yields:
      A `FeatureNode` per leaf and per empty `FeaturesDict`, in the features'
      own order.

    Raises:
      IncompatibleDatasetError: for features nested more than 64 levels deep.
    """
    per_step = None
    if STEPS in top:
        per_step = steps_feature(top[STEPS], (STEPS,))
    if per_step is not None:
        yield from _walk(per_step, (STEPS,), True, children)
    for name, spec in top.items():
        if name != STEPS or per_step is None:
            yield from _walk(spec, (name,), False, children)


def _walk(
    spec: Any,
    path: tuple[str, ...],
    in_steps: bool,
    children: Callable[[Any, tuple[str, ...]], Mapping[str, Any] | None],
) -> Iterator[FeatureNode]:
    if len(path) > _MAX_DEPTH:
        raise malformed(path, f"features nested more than {_MAX_DEPTH} levels deep")
    inner = children(spec, path)
    if inner is None:
        yield FeatureNode(path, in_steps, spec)
        return
    if not inner:
        yield FeatureNode(path, in_steps, spec, empty_dict=True)
    for name, sub in inner.items():
        yield from _walk(sub, path + (name,), in_steps, children)


def check_unique_keys(paths: Iterable[tuple[str, ...]], error: type[Exception]) -> None:
    """Refuses two leaves whose paths join to one `tf.train.Example` key.

    A field name holding `/` beside a dict of the same path (`{"a/b": ...,
    "a": {"b": ...}}`) would share its values with the other one, and TFDS
    refuses to load the dataset ("Try to overwrite existing key").

    Raises:
      error: naming the key and both paths.
    """
    seen: dict[str, tuple[str, ...]] = {}
    for path in paths:
        key = "/".join(path)
        other = seen.setdefault(key, path)
        if other != path:
            raise error(
                f"{key}: two fields would be stored under this one key ({list(other)} and "
                f"{list(path)}), which TFDS cannot load; rename the field whose name holds '/'"
            )


def walk_features_json(config: Mapping[str, Any]) -> Iterator[FeatureNode]:
    """`walk_features` over a decoded `features.json`; each node's `spec` is its JSON node.

    Unlike `parse_features`, it yields every leaf, also those the reader cannot
    decode (`info` describes them all); a crafted file still raises
    `IncompatibleDatasetError` naming the field.

    Args:
      config: the decoded JSON of a `features.json`.
    """
    if class_name(config, ()) != "FeaturesDict":
        raise malformed(
            (),
            "the top-level feature must be a FeaturesDict, "
            f"got {short_repr(config.get('pythonClassName', config.get('type')))}",
        )
    return walk_features(dict_children(config, ()), _json_children, json_steps)


def _json_children(node: Any, path: tuple[str, ...]) -> Mapping[str, Any] | None:
    if class_name(node, path) != "FeaturesDict":
        return None
    return dict_children(node, path)


def json_steps(node: Any, path: tuple[str, ...]) -> Any:
    if class_name(node, path) not in ("Dataset", "Sequence"):
        return None
    sequence = field(node, "sequence", Mapping, path)
    return field(sequence, "feature", Mapping, path + ("sequence",))


def short_repr(value: Any, limit: int = 60) -> str:
    """repr of a crafted value, cut so an error stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def malformed(path: tuple, message: str) -> IncompatibleDatasetError:
    where = "/".join(str(p) for p in path) or "<root>"
    if len(where) > 120:
        where = where[:120] + "..."
    return IncompatibleDatasetError(f"features.json: {where}: {message}")


def field(node: Mapping[str, Any], name: str, kind: type | tuple, path: tuple) -> Any:
    """node[name], checked to be of `kind` (a crafted file may hold anything)."""
    if name not in node:
        raise malformed(path, f"missing field {name!r}")
    value = node[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = {Mapping: "an object", list: "a list", str: "a string"}
        expected = names.get(kind, getattr(kind, "__name__", str(kind)))
        raise malformed(path, f"field {name!r} must be {expected}, got {short_repr(value)}")
    return value


def class_name(node: Any, path: tuple[str, ...]) -> str:
    if not isinstance(node, Mapping):
        raise malformed(path, f"a feature must be a JSON object, got {short_repr(node)}")
    if "type" in node and "content" in node:
        raise UnsupportedFeatureError(
            f"{'/'.join(path) or 'features.json'}: the legacy features.json format "
            "(`type`/`content`) is not supported; re-save the features with TFDS >= 4.6"
        )
    name = node.get("pythonClassName")
    if not name:
        for key in _CONTENT_KEYS:
            if key in node:
                return {"featuresDict": "FeaturesDict", "sequence": "Sequence"}.get(
                    key, key[0].upper() + key[1:]
                )
        raise malformed(path, f"feature has no pythonClassName: {short_repr(node)}")
    if not isinstance(name, str):
        raise malformed(path, f"pythonClassName must be a string, got {short_repr(name)}")
    return name.rsplit(".", 1)[-1]


def dict_children(node: Mapping[str, Any], path: tuple[str, ...]) -> Mapping[str, Any]:
    features_dict = field(node, "featuresDict", Mapping, path)
    if "features" not in features_dict:
        return {}  # an empty FeaturesDict: protobuf's JSON leaves the empty map out
    return field(features_dict, "features", Mapping, path + ("featuresDict",))
