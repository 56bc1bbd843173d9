"""Layers: imports run one way (docs/architecture.md), and no module imports in a loop."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlds_writer"

# Layer -> the layers its modules may import (itself included).
ALLOWED = {
    "errors": {"errors"},
    # The package's own machinery: lazy public names, how TensorFlow loads.
    "_exports": {"_exports", "errors"},
    "_tensorflow": {"_tensorflow"},
    "envs": {"envs"},
    "store": {"_exports", "errors", "store"},
    "read": {"_exports", "errors", "store", "read"},
    "record": {"_exports", "errors", "store", "record"},
    "maintain": {"_exports", "errors", "store", "read", "maintain"},
    "interop": {"_exports", "errors", "store", "read", "record", "interop"},
    "cli": {"errors", "store", "read", "record", "maintain", "interop", "cli", "envs"},
    "__main__": {"cli"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every `rlds_writer...` module a file imports, at any depth (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("rlds_writer"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlds_writer"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py")
                is_package = PACKAGE.parent / candidate.replace(".", "/") / "__init__.py"
                out.add(candidate if is_module.exists() or is_package.exists() else node.module)
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    return {
        _module_name(p): _imports(p)
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or p.parent != PACKAGE
    }


def test_imports_run_one_way_between_layers():
    wrong = []
    for module, imported in sorted(_graph().items()):
        layer = _layer(module)
        for target in sorted(imported):
            if _layer(target) not in ALLOWED[layer] and target != "rlds_writer":
                wrong.append(f"{module} imports {target}")
            if target == "rlds_writer" and layer != "cli":
                wrong.append(f"{module} imports the package root (lazy re-exports) from below")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_itself_through_a_loop():
    graph = _graph()
    state: dict[str, int] = {}
    loops = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                loops.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif not state.get(nxt):
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])
    assert not loops, "\n".join(loops)


def test_every_error_class_is_defined_in_errors_and_derives_from_the_base():
    import rlds_writer.errors as errors

    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception")):
                raise AssertionError(f"{path}: {node.name} belongs in rlds_writer/errors.py")
    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, errors.RLDSWriterError), name
