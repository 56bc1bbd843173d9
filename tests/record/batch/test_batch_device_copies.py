"""Device arrays are copied to the host once per field per batch, never once per sub-env.

No GPU here: a torch tensor that says it is on a CUDA device (a subclass whose
`.cpu()` is the device-to-host copy, counted) and an object read only through
`__dlpack__` (counted) stand in for one. The records are numpy's.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from batch_envs import records

from rlds_writer.record import spaces
from rlds_writer.record.batch import BatchRecorder

N, T = 8, 12


class _DLPackOnly:
    """An array readable only through the DLPack protocol (as a CuPy or JAX array is)."""

    reads = 0

    def __init__(self, value: np.ndarray):
        self._value = value

    def __dlpack__(self, **kwargs):
        type(self).reads += 1
        return self._value.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._value.__dlpack_device__()


def _play(path, wrap) -> None:
    config = spaces.spaces_config(
        gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32), "dev"
    )
    rng = np.random.default_rng(0)
    rec = BatchRecorder(path, config, N)
    rec.begin(wrap(rng.uniform(-1, 1, (N, 3)).astype(np.float32)))
    for t in range(T):
        obs = wrap(rng.uniform(-1, 1, (N, 3)).astype(np.float32))
        action = wrap(rng.uniform(-1, 1, (N, 2)).astype(np.float32))
        rec.add(action, wrap(rng.uniform(size=N).astype(np.float32)), None, obs)
        done = np.arange(N) % 4 == t % 4
        rec.end(done, done)
        rec.begin(obs, mask=done)
    rec.close()


def test_device_batches_are_copied_to_the_host_once_per_field_not_per_sub_env(tmp_path):
    torch = pytest.importorskip("torch")
    copies = []

    class OnDevice(torch.Tensor):  # a CUDA tensor, for `host_array`'s purposes
        @property
        def device(self):
            return torch.device("cuda", 0)

        def cpu(self, *args, **kwargs):
            copies.append(tuple(self.shape))
            return torch.Tensor.cpu(self.as_subclass(torch.Tensor), *args, **kwargs)

    _play(tmp_path / "numpy", lambda a: a)
    _play(tmp_path / "torch", lambda a: torch.from_numpy(a).as_subclass(OnDevice))
    _play(tmp_path / "dlpack", _DLPackOnly)
    want = records(tmp_path / "numpy")
    assert sum(want.values()) >= N * T // 4
    assert records(tmp_path / "torch") == want and records(tmp_path / "dlpack") == want
    # begin: 1 (observation); each step: 3 (action, reward, observation) + 1 (begin's).
    expected = 1 + T * (3 + 1)
    assert len(copies) == expected and all(shape[0] == N for shape in copies)
    assert _DLPackOnly.reads == expected


def test_tensors_numpy_cannot_read_are_refused_by_field_and_low_precision_floats_widened(
    tmp_path,
):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    from rlds_writer.errors import StepValueError
    from rlds_writer.record.batch.arrays import host_array

    config = spaces.spaces_config(
        gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32), "dev"
    )
    rec = BatchRecorder(tmp_path, config, N)
    rec.begin(np.zeros((N, 3), np.float32))
    # A tensor with no data (meta device) or one numpy cannot view: the field, not torch's error.
    for bad in (torch.empty((N, 3), device="meta"), torch.zeros((N, 3)).to_sparse()):
        with pytest.raises(StepValueError, match="^steps/observation: expected a dense numeric"):
            rec.add(np.zeros((N, 2), np.float32), np.ones(N), None, bad)
    rec.add(np.zeros((N, 2), np.float32), np.ones(N), None, np.zeros((N, 3), np.float32))
    rec.close()
    assert rec.episodes_written == N  # the refused steps left nothing behind
    # JAX's bfloat16 is a float, as torch's is (both widened to float32), not "not numbers".
    for value in (jnp.full((2,), 1.5, jnp.bfloat16), torch.full((2,), 1.5, dtype=torch.bfloat16)):
        assert host_array(value, "x").tolist() == [1.5, 1.5]
