"""The C gather of ended episodes out of the time-major ring gives the numpy gather's columns."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_writer.record.batch.ring import OBSERVATION_LIKE, TRANSITION, BatchField, TimeRing
from rlds_writer.store.features import feature_defs, features
from rlds_writer.store.features.field_specs import FieldSpec
from rlds_writer.store.writing import batch_records


def _field(key, shape, dtype, role, zero=None):
    feature = feature_defs.Tensor(shape=shape, dtype=dtype)
    kind = features.INT if np.dtype(dtype).kind in "biu" else features.FLOAT
    spec = FieldSpec(("steps", key), f"steps/{key}", feature, kind, True, shape, np.dtype(dtype))
    return BatchField(spec, role, zero)


def _gathered(ring: TimeRing, envs: np.ndarray, monkeypatch, native) -> tuple:
    with monkeypatch.context() as patch:
        patch.setattr(batch_records, "native", native)
        return ring._gather_ring(envs)


@pytest.mark.parametrize("per_env", [False, True])
def test_the_c_gather_cuts_the_same_episodes_as_numpy(monkeypatch, per_env):
    if batch_records.native is None:
        pytest.skip("the _batch_records extension is not built here")
    fields = [
        _field("observation", (2, 3), np.float64, OBSERVATION_LIKE),
        _field("action", (), np.int64, TRANSITION, 7),
        _field("flag", (2,), np.bool_, TRANSITION, np.array([True, False])),
    ]
    num_envs, rng = 5, np.random.default_rng(0)
    ring = TimeRing(fields, num_envs, chunk=8, per_env=per_env)  # 32 rows: they wrap

    def batch(n):
        return {f.key: rng.standard_normal((n, *f.spec.shape)).astype(f.spec.dtype) for f in fields}

    ring.begin(np.arange(num_envs), batch(num_envs))
    for t in range(45):  # past the ring's end: rows wrap modulo 32
        if per_env:
            ids = np.array([0, 2, 3, 4]) if t % 3 else np.arange(num_envs)
            ring.write_some(batch(len(ids)), ids)
        else:
            ring.write(batch(num_envs))
        if t == 28:  # sub-env 4's episode runs over the ring's end, back to its row 0
            ring.begin(np.array([4]), batch(num_envs))
        if t == 40:  # sub-env 3 restarts: one step; sub-env 1 none at all (cut short at once)
            ring.begin(np.array([1, 3]), batch(num_envs))
    ring.begin(np.array([1]), batch(num_envs))
    # Spilled sub-envs are gathered apart; the ring's rows here are those not spilled.
    envs = np.array([i for i in range(num_envs) if i not in ring.spilled], np.int64)
    assert {1, 3, 4} <= set(envs.tolist())
    ids_c, offsets_c, steps_c, columns_c = _gathered(ring, envs, monkeypatch, batch_records.native)
    ids_n, offsets_n, steps_n, columns_n = _gathered(ring, envs, monkeypatch, None)
    assert (ids_c == ids_n).all() and (offsets_c == offsets_n).all()
    assert (steps_c == steps_n).all() and 1 in steps_c.tolist()
    for key, column in columns_n.items():
        assert column.dtype == columns_c[key].dtype
        assert column.tobytes() == columns_c[key].tobytes(), key
