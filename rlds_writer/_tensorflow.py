"""How TensorFlow loads in a process that imported rlds_writer: quietly, and RTLD_LOCAL.

`rlds_writer/__init__.py` calls `install()` first thing, before anything can
import TensorFlow; both finders only act on TensorFlow's own import, so they
cost nothing when it is never imported. They are plain classes (the protocol
`sys.meta_path` asks for) that import what they use only then: `importlib.abc`
alone pulls in `importlib.resources` and `tempfile`, 3-4 ms of every process.

- Quiet: `TF_CPP_MIN_LOG_LEVEL=2` unless the user set it, and TensorFlow's
  import runs with file descriptor 2 held back, written out afterwards minus
  the log lines below that level (TF prints its oneDNN and CPU notices before
  it reads the variable). `rlds-writer --verbose` takes our default back
  (`show_tensorflow_logs`).
- RTLD_LOCAL: TensorFlow 2.20-2.21 loads its runtime RTLD_GLOBAL, and its LLVM
  then makes triton (which PyPI's CUDA torch imports at its first optimizer)
  abort the process (tests/package/test_tensorflow_loading.py). Where
  TensorFlow came first (`import ray.rllib` imports it), triton's library is
  loaded RTLD_DEEPBIND instead, bound to its own LLVM.

This module is never reloaded by `importlib.reload(rlds_writer)`, so its state
(whether the log level is ours) and its finders stay installed exactly once.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

_TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# Whether the level in the environment is our default (so --verbose may take it back).
_level_is_ours = False


class _TensorFlowLocalRuntime:
    """Makes TensorFlow load its runtime RTLD_LOCAL, as its releases other than 2.20-2.21 do.

    TensorFlow 2.20-2.21's PyPI wheels load their runtime with RTLD_GLOBAL, which
    puts its statically linked LLVM in the process's symbol table; triton (which
    PyPI's CUDA build of torch brings, and which torch imports at its first
    optimizer) then binds to that LLVM and aborts the process (SIGSEGV/SIGABRT).
    TensorFlow's own fix (tensorflow#124205) leaves out the module that asks for
    RTLD_GLOBAL; this finder makes importing it fail the same way. It has effect
    only if installed before TensorFlow loads.
    """

    _NAME = "tensorflow.python.pywrap_dlopen_global_flags"

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self._NAME:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


class _TritonOwnLLVM:
    """Loads triton's library RTLD_DEEPBIND when TensorFlow's LLVM is already global.

    TensorFlow imported before rlds_writer (`import ray.rllib` does it, through
    RLlib's `try_import_tf`) has put its LLVM in the global table, and
    `_TensorFlowLocalRuntime` came too late. triton's library, bound to its own
    symbols first (RTLD_DEEPBIND), then registers its own LLVM's options, not
    TensorFlow's a second time (which aborts the process). Acts only then, and
    only on that one import.
    """

    _NAME = "triton._C.libtriton"
    _TF_GLOBAL = "tensorflow.python.pywrap_dlopen_global_flags"

    def find_spec(self, fullname: str, path: Any = None, target: object = None) -> Any:
        if fullname != self._NAME or self._TF_GLOBAL not in sys.modules:
            return None
        if not hasattr(os, "RTLD_DEEPBIND") or not hasattr(sys, "setdlopenflags"):
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _DeepBindLoader(spec.loader)
        return spec


class _DeepBindLoader:
    """Runs an extension module's loader with RTLD_DEEPBIND added to the dlopen flags."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
        try:
            return self._loader.create_module(spec)
        finally:
            sys.setdlopenflags(flags)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)


# The notices TensorFlow writes to stderr while it is imported, before it reads
# TF_CPP_MIN_LOG_LEVEL: absl-format lines ("I0000 00:00:... port.cc:153] oneDNN
# custom operations are on...") and absl's own preamble. TF 2.21 prints them
# whatever the variable says; only TF_ENABLE_ONEDNN_OPTS=0 (which changes
# numerics) stops the oneDNN one. We apply the variable to them ourselves.
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called"
# The second line of TF's cpu_feature_guard notice.
_CONTINUATION = b"To enable the following instructions"
_SEVERITIES = b"IWEF"


def _min_log_level() -> int:
    try:
        return int(os.environ.get(_TF_LOG_LEVEL, "0"))
    except ValueError:
        return 0


def below_level(output: bytes, level: int) -> bytes:
    """`output` without the absl lines whose severity is below `level`."""
    kept = []
    dropped = False
    for line in output.splitlines(keepends=True):
        match = _ABSL_LINE.match(line)
        if match:
            dropped = _SEVERITIES.index(match.group(1)) < level
        elif line.startswith(_ABSL_PREAMBLE):
            dropped = level >= 1
        elif not (dropped and line.startswith(_CONTINUATION)):
            dropped = False
        if not dropped:
            kept.append(line)
    return b"".join(kept)


@contextlib.contextmanager
def _stderr_filtered(level: int) -> Iterator[None]:
    """Holds back what is written to file descriptor 2, then writes it minus the notices.

    Everything else written meanwhile (other threads, Python warnings, an
    error while importing) is written out afterwards, in order.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):  # no usable stderr: nothing to filter
        yield
        return
    import tempfile

    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            rest = below_level(held.read(), level)
            if rest:
                os.write(2, rest)


class _QuietTensorFlowLoader:
    """Runs TensorFlow's own loader with its import notices filtered (`below_level`)."""

    def __init__(self, loader: Any, level: int):
        self._loader = loader
        self._level = level

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps TensorFlow's loader (resources, reloads): we only wrap this call.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with _stderr_filtered(self._level):
            self._loader.exec_module(module)


class _QuietTensorFlowFinder:
    """Finds `tensorflow` as the other finders do, with `_QuietTensorFlowLoader` around it."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "tensorflow" or self._finding:
            return None
        level = _min_log_level()
        if level < 1:  # the user asked for everything
            return None
        import importlib.util

        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _QuietTensorFlowLoader(spec.loader, level)
        return spec


def install() -> None:
    """Sets our default log level and installs both finders; a second call does nothing."""
    global _level_is_ours
    if any(isinstance(f, (_TensorFlowLocalRuntime, _QuietTensorFlowFinder)) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TritonOwnLLVM())
    # TensorFlow's C++ start-up and tf.data info lines drown a recorder's own
    # output; a user who wants them sets the variable before importing us.
    if _TF_LOG_LEVEL not in os.environ:
        os.environ[_TF_LOG_LEVEL] = "2"
        _level_is_ours = True
    sys.meta_path.insert(0, _QuietTensorFlowFinder())
    sys.meta_path.insert(0, _TensorFlowLocalRuntime())


def show_tensorflow_logs() -> None:
    """Lets TensorFlow log as it would without us (`rlds-writer --verbose`).

    A level the user set stays; only our default is taken back.
    """
    if _level_is_ours:
        os.environ.pop(_TF_LOG_LEVEL, None)
