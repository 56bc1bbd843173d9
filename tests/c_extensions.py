"""The C extensions setup.py builds, read from its `Extension(...)` calls (not a copy of them)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class CExtension(NamedTuple):
    module: str  # rlds_writer.record._step_kernel
    sources: list[str]  # the .c files compiled into it, relative to the checkout
    headers: list[str]  # the headers they include (`depends`)


def setup_py_extensions(setup_py: Path = ROOT / "setup.py") -> list[CExtension]:
    """Every `Extension(name, sources, depends=...)` of setup.py, in its order."""
    found = []
    for node in ast.walk(ast.parse(setup_py.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            module, sources = (ast.literal_eval(arg) for arg in node.args[:2])
            depends = [ast.literal_eval(k.value) for k in node.keywords if k.arg == "depends"]
            found.append(CExtension(module, sources, depends[0] if depends else []))
    assert found, f"{setup_py} lists no Extension"
    return found
