"""Layers: imports run one way (docs/architecture.md), and no module imports in a loop."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rlds_writer"

# Layer -> the layers its modules may import (itself included).
ALLOWED = {
    "errors": {"errors"},
    # The package's own machinery: lazy public names, how TensorFlow loads.
    "_exports": {"_exports", "errors"},
    "_tensorflow": {"_tensorflow"},
    # The optional C extensions, each taken only if built from these sources.
    "_native": {"_native"},
    "envs": {"envs"},
    "store": {"_exports", "_native", "errors", "store"},
    "read": {"_exports", "errors", "store", "read"},
    "record": {"_exports", "_native", "errors", "store", "record"},
    "maintain": {"_exports", "errors", "store", "read", "maintain"},
    "view": {"_exports", "errors", "store", "read", "maintain", "view"},
    "interop": {"_exports", "errors", "store", "read", "record", "interop"},
    "cli": {"errors", "store", "read", "record", "maintain", "view", "interop", "cli", "envs"},
    "__main__": {"cli"},
}


# Inside store/ and record/: room -> the rooms its modules may import (itself included).
# A room is a subpackage (`store.formats.tfrecord` is in `store.formats`); record's
# core is the modules at the top of record/, its adapters the subpackages.
_STORE_ROOMS = {
    "store": {"_exports"},
    "store.storage": {"errors"},
    "store.episodes": {"errors"},
    "store.features": {"_native", "errors", "store.episodes"},
    "store.images": {"errors", "store.episodes", "store.features"},
    "store.formats": {"_native", "errors", "store.storage"},
    "store.dataset": {"_exports", "errors", "store.storage", "store.formats", "store.features"},
    "store.repair": {"errors", "store.storage", "store.formats", "store.dataset"},
}
_STORE_ROOMS["store.writing"] = {"_native", "errors", *_STORE_ROOMS} - {"store"}
_ADAPTERS = ("record.dm_env", "record.gymnasium", "record.pettingzoo", "record.rllib")
ROOMS = {
    **{room: allowed | {room} for room, allowed in _STORE_ROOMS.items()},
    # The recording core imports the store, never an adapter.
    "record": {"_exports", "_native", "errors", "record", *_STORE_ROOMS} - {"store"},
    # An adapter imports the core and the store, never another adapter.
    **{a: {"_exports", "errors", "record", a, *_STORE_ROOMS} - {"store"} for a in _ADAPTERS},
}
# The recording core: the modules at the top of record/.
_RECORD_CORE = (
    "appender",
    "chunk_columns",
    "columns",
    "config",
    "episode",
    "gymnasium_recording",
    "pending",
    "recorder",
    "row_columns",
    "scalar_columns",
    "spaces",
    "step_kernel",
    "values",
)


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


def _room(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in ("store", "record"):
        return None
    if parts[1] == "record":
        sub = ".".join(parts[1:3])
        return sub if sub in _ADAPTERS else "record"
    package = PACKAGE.parent.joinpath(*parts[:3])
    return ".".join(parts[1:3]) if (package / "__init__.py").exists() else "store"


def test_imports_run_one_way_between_the_rooms_of_store_and_record():
    wrong = []
    for module, imported in sorted(_graph().items()):
        room = _room(module)
        if room is None:
            continue
        for target in sorted(imported):
            target_room = _room(target) or _layer(target)
            if target_room in ROOMS[room]:
                continue
            wrong.append(f"{module} ({room}) imports {target} ({target_room})")
    assert not wrong, "\n".join(wrong)


def test_every_store_and_record_module_is_in_a_room():
    top = [p.name for d in ("store", "record") for p in (PACKAGE / d).glob("*.py")]
    assert sorted(top) == sorted(
        ["__init__.py", "__init__.py"] + [f"{m}.py" for m in _RECORD_CORE]
    ), "store/ holds only rooms; record/ holds its core and the adapters' rooms"


def test_a_shard_format_never_imports_another_format():
    wrong = []
    for module, imported in sorted(_graph().items()):
        parts = module.split(".")
        if parts[1:3] != ["store", "formats"] or len(parts) < 5:
            continue
        for target in imported:
            other = target.split(".")
            if other[1:3] == ["store", "formats"] and len(other) >= 5 and other[3] != parts[3]:
                wrong.append(f"{module} imports {target}")
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


# Test folders that are not a layer: whole-package checks, documentation, the release.
_OTHER_TEST_FOLDERS = {
    "package": "checks of the package as a whole (layers, import-time behaviour, extras, borders)",
    "docs": "README, docs/, notebooks and examples, run as a user would",
    "release": "the built wheel, sdist and Docker image",
}


def test_every_test_folder_mirrors_a_subpackage():
    tests = Path(__file__).resolve().parents[1]
    subpackages = {p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*/__init__.py")}
    wrong = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        name = folder.relative_to(tests).as_posix()
        if "__pycache__" in name or name.split("/")[0] in _OTHER_TEST_FOLDERS:
            continue
        if name not in subpackages:
            wrong.append(
                f"tests/{name}/ names no subpackage of rlds_writer"
                f" ({', '.join(sorted(subpackages))}) nor {sorted(_OTHER_TEST_FOLDERS)}"
            )
        if (folder / "__init__.py").exists():
            wrong.append(f"tests/{name}/__init__.py: test folders are not packages")
    assert not wrong, "\n".join(wrong)
    assert not list(tests.glob("test_*.py")), "test files live in the folder of what they test"


def test_test_file_names_are_unique_across_folders():
    # Without __init__.py, pytest imports each test file by its basename.
    seen: dict[str, list[str]] = {}
    for path in Path(__file__).resolve().parents[1].rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.parent.name))
    assert not {k: v for k, v in seen.items() if len(v) > 1}
