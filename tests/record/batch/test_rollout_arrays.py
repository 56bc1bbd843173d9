"""Rollouts of (T, N, ...) arrays: episodes across calls, both autoresets, any array library."""

from __future__ import annotations

import os

import numpy as np
import pytest
from batch_envs import records

from rlds_writer.errors import SpecError, StepValueError
from rlds_writer.record.batch.rollout import RolloutRecorder

N = 6


def _rollout(seed: int, steps: int, start: np.ndarray, t0: np.ndarray, lengths: np.ndarray):
    """A same-step-autoreset rollout in numpy: each sub-env's episodes end after `lengths[i]`."""
    rng = np.random.default_rng(seed)
    x, t = start.copy(), t0.copy()
    out = {k: [] for k in ("observation", "final_observation", "action", "reward", "terminated")}
    out["truncated"] = []
    for _ in range(steps):
        a = rng.uniform(-1, 1, (N, 2)).astype(np.float32)
        x = (x + 0.1 * a).astype(np.float32)
        t = t + 1
        done = t >= lengths
        out["final_observation"].append(x.copy())
        out["action"].append(a)
        out["reward"].append(x.sum(1))
        out["terminated"].append(done & (np.arange(N) % 2 == 0))
        out["truncated"].append(done & (np.arange(N) % 2 == 1))
        x = np.where(done[:, None], rng.standard_normal((N, 2)).astype(np.float32), x)
        t = np.where(done, 0, t)
        out["observation"].append(x.copy())
    return {k: np.stack(v) for k, v in out.items()}, x, t


def _reference(first: np.ndarray, rollouts: list[dict]) -> list[tuple]:
    """Each sub-env's episodes from the arrays: (observations, actions, rewards, end reason)."""
    eps = []
    for i in range(N):
        ep = {"obs": [first[i]], "act": [], "rew": []}
        for r in rollouts:
            for t in range(len(r["action"])):
                ep["act"].append(r["action"][t, i])
                ep["rew"].append(np.float32(r["reward"][t, i]))
                te, tr = r["terminated"][t, i], r["truncated"][t, i]
                if te or tr:
                    ep["obs"].append(r["final_observation"][t, i])
                    eps.append((ep, "terminated" if te else "truncated"))
                    ep = {"obs": [r["observation"][t, i]], "act": [], "rew": []}
                else:
                    ep["obs"].append(r["observation"][t, i])
        eps.append((ep, "cut_short"))
    return eps


def _load(path) -> list[dict]:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(path))
    return list(tfds.as_numpy(builder.as_dataset(split="train")))


def _check(path, want: list[tuple]) -> None:
    got = _load(path)
    assert len(got) == len(want)
    by_key = {(np.asarray(w["obs"][0]).tobytes(), len(w["obs"])): (w, r) for w, r in want}
    for episode in got:
        steps = list(episode["steps"])
        w, reason = by_key.pop((steps[0]["observation"].tobytes(), len(steps)))
        np.testing.assert_array_equal(np.stack([s["observation"] for s in steps]), w["obs"])
        actions = [s["action"] for s in steps[:-1]]
        np.testing.assert_array_equal(np.reshape(actions, (-1, 2)), np.reshape(w["act"], (-1, 2)))
        np.testing.assert_array_equal([s["reward"] for s in steps[:-1]], w["rew"])
        assert episode["end_reason"] == reason.encode()
    assert not by_key


def _two_rollouts():
    rng = np.random.default_rng(5)
    lengths = np.array([1, 2, 3, 7, 40, 5])
    first = rng.standard_normal((N, 2)).astype(np.float32)
    r1, x, t = _rollout(1, 30, first, np.zeros(N, np.int64), lengths)
    r2, _, _ = _rollout(2, 25, x, t, lengths)
    return first, [r1, r2]


def test_rollouts_split_across_calls_record_each_sub_env_episode(tmp_path):
    first, rollouts = _two_rollouts()
    with RolloutRecorder(tmp_path / "ds", ring_bytes=2048) as rec:
        rec.write(first_observation=first, **rollouts[0])
        rec.write(**rollouts[1])  # episodes open at the end of the first go on
    _check(tmp_path / "ds", _reference(first, rollouts))
    # The 40-step episode spans both calls: one of 41 steps.
    assert 41 in {len(list(e["steps"])) for e in _load(tmp_path / "ds")}


def test_next_step_rollouts_begin_episodes_on_the_step_after_an_end(tmp_path):
    # EnvPool's layout: the step after an episode's end is its reset, whose
    # action the env ignored.
    rng = np.random.default_rng(7)
    lengths = np.array([1, 2, 3, 7, 40, 5])
    first = rng.standard_normal((N, 2)).astype(np.float32)
    x, t, pending = first.copy(), np.zeros(N, np.int64), np.zeros(N, bool)
    eps = {i: {"obs": [first[i]], "act": [], "rew": []} for i in range(N)}
    want, arrays = [], {k: [] for k in ("observation", "action", "reward", "terminated")}
    for _ in range(60):
        a = rng.uniform(-1, 1, (N, 2)).astype(np.float32)
        reset_x = rng.standard_normal((N, 2)).astype(np.float32)
        x = np.where(pending[:, None], reset_x, (x + 0.1 * a).astype(np.float32))
        t = np.where(pending, 0, t + 1)
        done = ~pending & (t >= lengths)
        r = x.sum(1)
        for i in range(N):
            if pending[i]:
                eps[i] = {"obs": [x[i]], "act": [], "rew": []}
                continue
            eps[i]["obs"].append(x[i])
            eps[i]["act"].append(a[i])
            eps[i]["rew"].append(np.float32(r[i]))
            if done[i]:
                want.append((eps.pop(i), "terminated"))
        for key, value in zip(arrays, (x, a, r, done)):
            arrays[key].append(value)
        pending = done
    want += [(ep, "cut_short") for ep in eps.values()]
    with RolloutRecorder(tmp_path / "ds", autoreset="next_step") as rec:
        rollout = {k: np.stack(v) for k, v in arrays.items()}
        rec.write(first_observation=first, **{k: v[:33] for k, v in rollout.items()})
        rec.write(**{k: v[33:] for k, v in rollout.items()})
    _check(tmp_path / "ds", want)


def test_same_step_rollouts_without_final_observations_are_refused_by_name(tmp_path):
    first, rollouts = _two_rollouts()
    rec = RolloutRecorder(tmp_path / "ds")
    without = {k: v for k, v in rollouts[0].items() if k != "final_observation"}
    with pytest.raises(StepValueError, match="final_observation.*same_step"):
        rec.write(first_observation=first, **without)
    rec.close()


def test_object_and_ragged_rollouts_are_refused_by_field(tmp_path):
    first, rollouts = _two_rollouts()
    bad = dict(rollouts[0], action=np.empty((30, N), dtype=object))
    rec = RolloutRecorder(tmp_path / "ds")
    with pytest.raises(SpecError, match="steps/action.*NoneType.*declare its feature"):
        rec.write(first_observation=first, **bad)
    ragged = dict(rollouts[0], reward=[[1.0, 2.0], [3.0]])
    with pytest.raises(StepValueError, match="steps/reward.*ragged"):
        rec.write(first_observation=first, **ragged)
    rec.close()


def test_text_step_metadata_of_a_rollout_is_recorded_per_sub_env(tmp_path):
    # Numpy text arrays (T, N) are kept per sub-env, as RecordRLDSVector keeps
    # Gymnasium's text infos; they were refused before.
    steps, n = 5, 3
    term = np.zeros((steps, n), bool)
    term[1, 0] = term[3, 2] = True
    notes = np.array([[f"t{t}e{i}" for i in range(n)] for t in range(steps)])
    with RolloutRecorder(tmp_path / "ds", autoreset="next_step") as rec:
        rec.write(
            first_observation=np.zeros((n, 2), np.float32),
            observation=np.ones((steps, n, 2), np.float32),
            action=np.zeros((steps, n), np.int64),
            reward=np.ones((steps, n), np.float32),
            terminated=term,
            step_metadata={"note": notes},
            first_step_metadata={"note": np.array([f"r{i}" for i in range(n)])},
        )
    got = sorted([s["note"].decode() for s in ep["steps"]] for ep in _load(tmp_path / "ds"))
    assert got == [
        ["r0", "t0e0", "t1e0"],  # terminated at step 1; step 2 is its reset
        ["r1", "t0e1", "t1e1", "t2e1", "t3e1", "t4e1"],
        ["r2", "t0e2", "t1e2", "t2e2", "t3e2"],
        ["t2e0", "t3e0", "t4e0"],
        ["t4e2"],
    ]


@pytest.mark.parametrize(
    "field, value",
    [
        ("reward", lambda r: np.concatenate([r["reward"], r["reward"][:1]])),  # T + 1 rows
        ("reward", lambda r: r["reward"][:-1]),  # T - 1 rows
        ("reward", lambda r: np.float32(1.0)),  # a scalar
        ("truncated", lambda r: np.zeros(N, bool)),  # (N,): numpy would broadcast it over T
        ("final_observation", lambda r: r["final_observation"][:2]),
    ],
)
def test_columns_of_another_length_than_t_are_refused_by_field(tmp_path, field, value):
    # Numpy would cut or broadcast them silently: the episodes would get other steps' values.
    first, rollouts = _two_rollouts()
    bad = dict(rollouts[0], **{field: value(rollouts[0])})
    rec = RolloutRecorder(tmp_path / "ds")
    with pytest.raises(StepValueError, match=field):
        rec.write(first_observation=first, **bad)
    rec.close()


def _as(kind: str, value: np.ndarray):
    if kind == "numpy":
        return value
    if kind in ("torch", "torch-cuda"):
        torch = pytest.importorskip("torch")
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if kind == "torch-cuda":
            if not torch.cuda.is_available():
                pytest.skip("no CUDA device here: the device-to-host copy is not exercised")
            tensor = tensor.cuda()
        return tensor
    if kind == "jax":
        jnp = pytest.importorskip("jax.numpy")
        return jnp.asarray(value)

    class ArrayLike:  # only the array protocol
        def __init__(self, v):
            self._v = v

        def __array__(self, dtype=None, copy=None):
            return self._v if dtype is None else self._v.astype(dtype)

    return ArrayLike(value)


@pytest.mark.parametrize("kind", ["torch", "torch-cuda", "jax", "array-protocol"])
def test_rollouts_from_any_array_library_write_the_records_numpy_writes(tmp_path, kind):
    first, rollouts = _two_rollouts()
    for name, k in (("numpy", "numpy"), (kind, kind)):
        with RolloutRecorder(tmp_path / name) as rec:
            rec.write(
                first_observation=_as(k, first), **{a: _as(k, v) for a, v in rollouts[0].items()}
            )
            rec.write(**{a: _as(k, v) for a, v in rollouts[1].items()})
    want = records(tmp_path / "numpy")
    assert sum(want.values()) > 10 and records(tmp_path / kind) == want


def test_a_jax_scan_rollout_is_recorded(tmp_path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    lengths = jnp.array([1, 2, 3, 7, 40, 5])

    def step(carry, key):
        x, t = carry
        k1, k2 = jax.random.split(key)
        a = jax.random.uniform(k1, (N, 2), minval=-1, maxval=1)
        x = x + 0.1 * a
        t = t + 1
        done = t >= lengths
        reset_x = jax.random.normal(k2, (N, 2))
        next_x = jnp.where(done[:, None], reset_x, x)
        out = {
            "observation": next_x,
            "final_observation": x,
            "action": a,
            "reward": x.sum(1),
            "terminated": done,
        }
        return (next_x, jnp.where(done, 0, t)), out

    first = jax.random.normal(jax.random.PRNGKey(0), (N, 2))
    carry = (first, jnp.zeros(N, jnp.int32))
    rollout = jax.jit(lambda c, ks: jax.lax.scan(step, c, ks))
    with RolloutRecorder(tmp_path / "ds") as rec:
        carry, r1 = rollout(carry, jax.random.split(jax.random.PRNGKey(1), 30))
        rec.write(first_observation=first, **r1)
        carry, r2 = rollout(carry, jax.random.split(jax.random.PRNGKey(2), 25))
        rec.write(**r2)
    as_np = [{k: np.asarray(v) for k, v in r.items()} for r in (r1, r2)]
    for r in as_np:
        r["truncated"] = np.zeros_like(r["terminated"])
    want = [
        (ep, "cut_short" if reason == "cut_short" else "terminated")
        for ep, reason in _reference(np.asarray(first), as_np)
    ]
    _check(tmp_path / "ds", want)
