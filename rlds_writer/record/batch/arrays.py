"""A batch of values from any array library as one host numpy array, checked by field.

Batched envs hand over numpy arrays (Gymnasium, EnvPool), torch tensors (GPU
simulators: Isaac Lab, ManiSkill3), JAX arrays (Brax, MJX, gymnax) or anything
with `__dlpack__`/`__array__`. `host_array` makes one numpy array of the whole
batch: a CPU tensor is viewed without a copy, a CUDA tensor or a JAX array on
an accelerator is copied to the host once per batch (never once per
sub-env). Nothing here imports torch or JAX: a value is recognised by its type's
module (a torch tensor, subclasses included, by `torch.Tensor` once torch is loaded).

`check_batch` then holds it against the field: a leading axis of the batch's
size, the field's shape after it, and a dtype the field takes (the same, or a
cast numpy calls `same_kind`, as the single-env recorders cast a float64
reward to float32). Object arrays and ragged nests are refused at the first
step, naming the field.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record.values import describe
from rlds_writer.store.features import field_specs


def _module(value: Any) -> str:
    return type(value).__module__.split(".", 1)[0]


def _is_torch(value: Any) -> bool:
    """A torch tensor, subclasses included (torch is loaded if one exists)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def host_array(value: Any, path: str) -> np.ndarray:
    """`value` (a batch) as a numpy array on the host.

    Args:
      value: a numpy array, torch tensor, JAX array, an object with
        `__dlpack__` or `__array__`, or a (non-ragged) nest of numbers.
      path: the field, for the message.

    Raises:
      StepValueError: for object or ragged input, naming `path`.
    """
    if type(value) is np.ndarray:
        arr = value
    elif _is_torch(value):
        try:
            arr = _torch_host(value)
        except (NotImplementedError, RuntimeError, TypeError) as e:  # meta, sparse, float8, ...
            raise StepValueError(
                path,
                f"expected a dense numeric tensor, got a torch {value.dtype} {value.layout} "
                f"tensor on {value.device} that numpy cannot read ({_first_line(e)}); "
                "give a dense tensor with data (e.g. .to_dense().float())",
            ) from None
    elif _module(value) in ("jax", "jaxlib"):
        try:
            arr = np.asarray(value)  # one transfer from the device, if it is on one
        except Exception as e:  # noqa: BLE001 - a tracer (inside jit/scan) and the like
            raise StepValueError(
                path,
                f"got a {type(value).__name__} with no value on the host ({type(e).__name__}); "
                "record outside jit/scan: pass the arrays the jitted function returns",
            ) from None
        if arr.dtype.kind == "V" and arr.dtype.itemsize <= 2 and arr.dtype.names is None:
            arr = arr.astype(np.float32)  # bfloat16/float8 (ml_dtypes), as torch's bfloat16
    elif isinstance(value, np.generic) or hasattr(value, "__array__"):
        arr = np.asarray(value)
    elif hasattr(value, "__dlpack__"):
        try:
            arr = np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError) as e:
            raise StepValueError(
                path,
                f"got a {type(value).__name__} numpy cannot read through __dlpack__ ({e}); "
                "copy it to the host first",
            ) from None
    else:
        try:
            arr = np.asarray(value)
        except ValueError as e:
            raise StepValueError(
                path,
                f"expected one array for the whole batch, got a ragged {type(value).__name__} "
                f"({e}); give every sub-env a value of the same shape",
            ) from None
    if arr.dtype.kind in "OUSV":
        raise StepValueError(
            path,
            f"expected numbers for the whole batch, got {describe(arr)}; object, text and "
            "ragged batches are not recorded: give one numeric array with a leading env axis",
        )
    return arr


def _torch_host(value: Any) -> np.ndarray:
    tensor = value.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()  # the batch's one device-to-host copy
    if str(tensor.dtype) == "torch.bfloat16" or "float8" in str(tensor.dtype):
        tensor = tensor.float()  # numpy has no bfloat16 or float8
    return tensor.numpy()


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def host_batch(value: Any, path: str) -> np.ndarray:
    """A batch of one field on the host: `host_array`'s numbers, or a numpy array
    of text (Gymnasium's object arrays, numpy `str_`/`bytes_`) kept as it is,
    for the fields whose values the batch recorder keeps per sub-env
    (`record/batch/objects.py`)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
        return value
    return host_array(value, path)


def done_flags(value: Any, path: str) -> np.ndarray:
    """A batch of done flags (`terminated`, `truncated`) as a bool array.

    Bools are taken as they are; numbers only where each is exactly 0 or 1
    (an env's int or float flags): anything else (0.5, -1, NaN) is refused by
    `path`, not cast to True.
    """
    arr = host_array(value, path)
    if arr.dtype == np.bool_:
        return arr
    if arr.size and not ((arr == 0) | (arr == 1)).all():
        bad = arr[(arr != 0) & (arr != 1)].reshape(-1)[0].item()
        raise StepValueError(
            path,
            f"expected bools (or numbers that are exactly 0 or 1) per sub-env, got {bad} in "
            f"a {arr.dtype} batch; pass the env's done flags as bool",
        )
    return arr.astype(np.bool_)


def check_batch(field: field_specs.FieldSpec, arr: np.ndarray, num_envs: int) -> np.ndarray:
    """`arr` as a `(num_envs, *field.shape)` array of the field's dtype, or a `StepValueError`."""
    shape = (num_envs, *field.shape)
    if arr.shape != shape:
        if arr.shape[1:] == tuple(field.shape) or arr.ndim == len(shape):
            got = f"{describe(arr)}"
        else:
            got = f"{describe(arr)} (one value per sub-env on the leading axis?)"
        raise StepValueError(
            field.key,
            f"expected a batch {field.dtype.name}[{','.join(map(str, shape))}] "
            f"({num_envs} sub-envs of {field.describe()}), got {got}",
        )
    if arr.dtype != field.dtype:
        if not np.can_cast(arr.dtype, field.dtype, "same_kind"):
            raise StepValueError(
                field.key,
                f"expected {field.describe()} per sub-env, got {describe(arr)}, which does not "
                f"cast to {field.dtype.name} without changing kind; cast it first",
            )
    return arr
