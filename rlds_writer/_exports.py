"""Lazy public names of a package (PEP 562): imported on first use, not at import.

`import rlds_writer` (or `rlds_writer.maintain`, ...) stays cheap: TensorFlow,
TFDS, gymnasium or ray load only when a name that needs them is first used,
and a missing optional library is then one `MissingDependencyError` naming the
extra to install, never an error at import.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any],
    exports: Mapping[str, tuple[str, str]],
    *,
    factories: Collection[str] = (),
    submodules: Collection[str] = (),
    defined: Collection[str] = (),
    moved: Mapping[str, str] | None = None,
) -> None:
    """Gives a package's namespace a `__getattr__`, `__dir__` and `__all__` for `exports`.

    Args:
      namespace: the package's `globals()`.
      exports: public name -> (module, attribute in it).
      factories: names whose attribute is a function returning the real object
        (called once, on first use).
      submodules: subpackages imported on first use as attributes, so that
        `rlds_writer.maintain.validate` works after `import rlds_writer`.
      defined: public names the package defines itself (listed in `__all__`).
      moved: names that used to be here -> where they are now; asking for one
        raises `AttributeError` naming its new place.
    """
    package = namespace["__name__"]
    moved = dict(moved or {})

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's name
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name not in exports:
            hint = f"; it is {moved[name]}" if name in moved else ""
            raise AttributeError(f"module {package!r} has no attribute {name!r}{hint}")
        from rlds_writer.errors import optional_dependencies

        module_name, attr = exports[name]
        # RecordRLDS without gymnasium, RLDSRecorder without ray...: one clear line.
        with optional_dependencies(f"{package}.{name}"):
            value = getattr(importlib.import_module(module_name), attr)
        if name in factories:
            value = value()
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807
        # The public names and the subpackages, and the module's dunders; not what
        # the package imports for itself (`annotations`, `lazy_exports`, `os`, ...).
        loaded = {
            name
            for name, value in namespace.items()
            if isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{name}"
        }
        dunders = {name for name in namespace if name.startswith("__") and name.endswith("__")}
        return sorted({*exports, *submodules, *defined, *loaded, *dunders})

    hooks: dict[str, Callable[..., Any] | list[str]] = {
        "__getattr__": __getattr__,
        "__dir__": __dir__,
        "__all__": sorted({*exports, *defined}),
    }
    namespace.update(hooks)
