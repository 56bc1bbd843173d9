"""The optional C extensions: each loaded only if it was built from this package's sources.

setup.py builds optional extensions (the recorders' C step, the batched
recorder's vector step, the CRC-32C, the zeros written ahead, the batch
encoder, the NaN scan); where one is not
built, its caller does the same in Python or numpy. An extension built from
older sources than the Python beside it (an in-place or editable build not
rebuilt after `git pull`) would be called with arguments it does not know,
deep inside a recording (`TypeError: function missing required argument`).

So each C module carries `ABI`: a number its source defines
(`#define RLDS_ABI n`) and bumps, with `ABI` below, whenever anything Python
calls or reads of it changes (a function's arguments, a method, a constant).
`load` takes a module only if its number is the one listed here; otherwise it
logs one warning naming the file and the command that rebuilds it, and
returns None: the caller's Python path records instead, as where the
extension is not built (tests/package/test_c_extensions.py builds a stale
one and records with it).
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from types import ModuleType

_log = logging.getLogger(__name__)

# Module -> the ABI its Python callers were written for (its source's RLDS_ABI).
ABI = {
    "rlds_writer.record._step_kernel": 1,
    "rlds_writer.record.batch._vector_step": 3,
    "rlds_writer.record.batch._frame_rows": 1,
    "rlds_writer.store.formats.tfrecord._crc32c": 2,
    "rlds_writer.store.formats.tfrecord._zero_ahead": 3,
    "rlds_writer.store.writing._batch_records": 3,
    "rlds_writer.store.features._float_bits": 1,
}

_warned: set[str] = set()


def load(name: str) -> ModuleType | None:
    """The C extension `name` (a key of `ABI`), or None: not built, or built from other sources.

    A stale build is logged once per process, at warning level, with the
    command that rebuilds it; not built at all is the normal case without a
    C compiler (logged at debug level).
    """
    try:
        module = importlib.import_module(name)
    except ImportError as e:  # not built (no compiler), or built against another numpy/CPU
        _log.debug("%s is not loaded (%s): its Python path is used", name, e)
        return None
    built = getattr(module, "ABI", None)
    if built == ABI[name]:
        return module
    if name not in _warned:
        _warned.add(name)
        _log.warning(
            "%s was built from other sources than this rlds_writer (its ABI %s, %d expected): "
            "recording without it, on the slower Python path. Rebuild it: %s",
            getattr(module, "__file__", name),
            "missing (older than the check)" if built is None else built,
            ABI[name],
            rebuild_command(module),
        )
    return None


def rebuild_command(module: ModuleType) -> str:
    """The command that rebuilds `module` where it is: in place in a checkout, else a reinstall."""
    depth = module.__name__.count(".")
    root = Path(getattr(module, "__file__", "") or ".").resolve().parents[depth]
    if (root / "setup.py").is_file():  # a checkout built in place, or an editable install
        return f"cd {root} && {sys.executable} setup.py build_ext --inplace"
    return f"{sys.executable} -m pip install --force-reinstall --no-deps rlds_writer"
