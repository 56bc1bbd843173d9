"""A dataset's features as a small tree of plain dicts, and as indented text (`info`)."""

from __future__ import annotations

from typing import Any


def _shape(tensor: dict[str, Any]) -> list[Any]:
    dims = tensor.get("shape", {}).get("dimensions", [])
    return [None if int(d) < 0 else int(d) for d in dims]


def _describe_feature(node: dict[str, Any]) -> dict[str, Any]:
    """Turns one node of features.json into a small tree of plain dicts."""
    cls = node.get("pythonClassName", "").rsplit(".", 1)[-1]
    if "featuresDict" in node:
        return {
            "type": "FeaturesDict",
            "features": {
                k: _describe_feature(v) for k, v in node["featuresDict"]["features"].items()
            },
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


def features_tree(features_json: dict[str, Any]) -> dict[str, Any]:
    """Returns features.json as a nested dict of `{"type", "dtype", "shape", ...}` nodes."""
    return _describe_feature(features_json)


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
