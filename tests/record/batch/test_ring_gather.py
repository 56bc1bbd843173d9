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


def test_one_c_call_plans_a_vector_steps_ends_as_gather_does():
    if batch_records.native is None:
        pytest.skip("the _batch_records extension is not built here")
    fields = [
        _field("observation", (3,), np.float32, OBSERVATION_LIKE),
        _field("action", (), np.int64, TRANSITION, 7),
    ]
    num_envs, rng = 6, np.random.default_rng(1)

    def batch():
        return {f.key: rng.standard_normal((num_envs, *f.spec.shape)).astype(f.spec.dtype)
                for f in fields}  # fmt: skip

    rings = [TimeRing(fields, num_envs, chunk=8) for _ in range(2)]
    values = [batch() for _ in range(30)]
    for ring in rings:  # both the same: rows wrap, sub-env 5 closed, 2 ended before any step
        ring.begin(np.arange(5), values[0])
        for t in range(1, 30):
            ring.write(values[t])
            if t == 20:
                ring.begin(np.array([0, 3]), values[t])
        ring.begin(np.array([2]), values[29])
    mask = np.array([True, False, True, True, False, True])
    terminated = np.array([False, True, True, False, True, True])
    envs, offsets, steps, reasons, cut, oldest = rings[0].end_masked(mask, terminated)
    ids, offsets_n, steps_n, cut_n, oldest_n = rings[1].gather(np.array([0, 2, 3]), later=True)[0]
    assert envs.tolist() == ids.tolist() == [0, 2, 3]  # 5 is not open: skipped
    assert offsets.tolist() == offsets_n.tolist() and steps.tolist() == steps_n.tolist()
    assert 1 in steps.tolist() and oldest == oldest_n
    assert reasons.tolist() == [1, 0, 1]
    assert (rings[0].open == rings[1].open).all() and rings[0].open.tolist()[:2] == [False, True]
    for got, want in zip(cut, cut_n):  # where the rows are, and the first observations
        assert all((g == w).all() for g, w in zip(got, want))
    # Cut short: every reason 2; nothing left open to end: None.
    cut = rings[0].end_masked(np.ones(num_envs, np.bool_), None)
    assert cut[0].tolist() == [1, 4] and cut[3].tolist() == [2, 2]
    assert rings[0].end_masked(np.ones(num_envs, np.bool_), None) is None
    with pytest.raises(ValueError, match="mask: expected 6 bool values"):
        rings[0].end_masked(np.ones(5, np.bool_), None)
