"""A dataset's features as a small tree of plain dicts, and as indented text (`info`)."""

from __future__ import annotations

from typing import Any

from rlds_writer.store.features.features import STEPS, walk_features_json


def _shape(tensor: dict[str, Any]) -> list[Any]:
    dims = tensor.get("shape", {}).get("dimensions", [])
    return [None if int(d) < 0 else int(d) for d in dims]


def _describe_feature(node: dict[str, Any]) -> dict[str, Any]:
    """Describes one leaf of features.json (a nested `Sequence` is described whole)."""
    cls = node.get("pythonClassName", "").rsplit(".", 1)[-1]
    if "featuresDict" in node:
        inner = node["featuresDict"].get("features", {})
        return {
            "type": "FeaturesDict",
            "features": {k: _describe_feature(v) for k, v in inner.items()},
        }
    if "sequence" in node:
        seq = node["sequence"]
        out = {"type": cls or "Sequence", "feature": _describe_feature(seq["feature"])}
        if seq.get("length") not in (None, "-1", -1):
            out["length"] = int(seq["length"])
        return out
    if "tensor" in node:
        t = node["tensor"]
        out = {"type": cls or "Tensor", "dtype": t.get("dtype"), "shape": _shape(t)}
        if t.get("encoding", "none") != "none":
            out["encoding"] = t["encoding"]
        return out
    if "image" in node:
        img = node["image"]
        return {
            "type": "Image",
            "dtype": img.get("dtype"),
            "shape": _shape(img),
            "encoding": img.get("encodingFormat", "png"),
        }
    if "text" in node:
        return {"type": "Text"}
    if "classLabel" in node:
        return {"type": "ClassLabel", "num_classes": int(node["classLabel"].get("numClasses", 0))}
    return {"type": cls or "unknown"}


def _dict_node() -> dict[str, Any]:
    return {"type": "FeaturesDict", "features": {}}


def features_tree(features_json: dict[str, Any]) -> dict[str, Any]:
    """Returns features.json as a nested dict of `{"type", "dtype", "shape", ...}` nodes.

    The leaves come from the one walk over feature specs
    (`store.features.features.walk_features_json`, which also checks the file's shape);
    the dicts around them and the `steps` sequence are rebuilt from their paths.
    """
    root = _dict_node()
    top = features_json["featuresDict"].get("features", {})
    for name in top:  # the features' own order, though the walk yields steps first
        root["features"][name] = None
    for node in walk_features_json(features_json):
        parent, rest = root, node.path
        if node.in_steps:
            steps = root["features"][STEPS]
            if steps is None:
                cls = top[STEPS].get("pythonClassName", "").rsplit(".", 1)[-1]
                steps = {"type": cls or "Dataset", "feature": _dict_node()}
                root["features"][STEPS] = steps
            parent, rest = steps["feature"], node.path[1:]
        if not rest:
            continue  # an empty per-step FeaturesDict: the dict is already there
        for name in rest[:-1]:
            child = parent["features"].get(name)
            if child is None:
                child = parent["features"][name] = _dict_node()
            parent = child
        leaf = _dict_node() if node.empty_dict else _describe_feature(node.spec)
        parent["features"][rest[-1]] = leaf
    return root


def render_features(tree: dict[str, Any], indent: str = "") -> list[str]:
    """Renders a `features_tree` as indented lines, one per feature."""
    lines = []
    children = tree.get("features")
    if children is None and "feature" in tree:
        return render_features(tree["feature"], indent)
    for name, node in (children or {}).items():
        kind = node["type"]
        if kind in ("FeaturesDict",) or "feature" in node:
            suffix = f" ({kind})" if kind != "FeaturesDict" else ""
            lines.append(f"{indent}{name}{suffix}")
            lines.extend(render_features(node, indent + "  "))
            continue
        text = f"{indent}{name}: {kind}"
        if "dtype" in node:
            shape = ", ".join("None" if d is None else str(d) for d in node["shape"])
            text += f" {node['dtype']}[{shape}]"
        if "encoding" in node:
            text += f" encoding={node['encoding']}"
        if "num_classes" in node:
            text += f" classes={node['num_classes']}"
        lines.append(text)
    return lines
