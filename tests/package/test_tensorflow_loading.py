"""TensorFlow loaded after `import rlds_writer` keeps its LLVM to itself, so torch's triton runs.

TensorFlow 2.20-2.21's PyPI wheels load their runtime with RTLD_GLOBAL; triton
(brought by PyPI's CUDA torch, imported by torch at its first optimizer) then
binds to TensorFlow's LLVM and aborts the process. `rlds_writer/__init__.py`
makes TensorFlow load RTLD_LOCAL. Each check runs in a fresh interpreter: the
order of imports is the point.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )


# Slow: a fresh interpreter importing TensorFlow and torch.
@pytest.mark.slow
def test_tensorflow_imported_after_rlds_writer_keeps_its_symbols_out_of_the_global_table():
    # dlsym over the whole process (ctypes.CDLL(None)) finds a symbol only if a
    # library put it in the global table: TensorFlow's LLVM must not be there.
    done = _python(
        "import ctypes, rlds_writer, tensorflow as tf\n"
        "assert float(tf.reduce_sum(tf.ones(3))) == 3.0\n"
        "process = ctypes.CDLL(None)\n"
        "found = [s for s in ('LLVMContextCreate', 'TF_NewStatus') if hasattr(process, s)]\n"
        "print('global:', found)\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "global: []" in done.stdout, done.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="needs torch with triton (PyPI's CUDA build of torch on Linux)",
)
@pytest.mark.slow
def test_a_torch_optimizer_after_tensorflow_does_not_crash_the_process():
    # The first optimizer imports torch._dynamo, which imports triton.
    done = _python(
        "import rlds_writer, tensorflow as tf, torch\n"
        "tf.constant(1.0)\n"
        "p = torch.zeros(2, requires_grad=True)\n"
        "torch.optim.Adam([p])\n"
        "import sys; print('triton loaded:', 'triton' in sys.modules)\n"
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert "triton loaded: True" in done.stdout, done.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="needs torch with triton (PyPI's CUDA build of torch on Linux)",
)
@pytest.mark.slow
def test_tensorflow_imported_before_rlds_writer_does_not_crash_a_torch_optimizer():
    # `from ray.rllib.algorithms.bc import BCConfig` before `import rlds_writer`
    # (the README's offline example) imports TensorFlow first, RTLD_GLOBAL.
    done = _python(
        "import tensorflow as tf, rlds_writer, torch\n"
        "p = torch.zeros(2, requires_grad=True)\n"
        "optimizer = torch.optim.Adam([p])\n"
        "p.sum().backward(); optimizer.step()\n"
        "import sys; print('triton loaded:', 'triton' in sys.modules)\n"
        "print(float(tf.reduce_sum(tf.ones(3))), [round(v, 6) for v in p.tolist()])\n"
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert "triton loaded: True" in done.stdout, done.stdout
    assert "3.0 [-0.001, -0.001]" in done.stdout, done.stdout
