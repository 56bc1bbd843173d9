"""`RecordRLDSEnvPool`: every sub-env of an EnvPool env recorded as RLDS, sync or async.

EnvPool (`envpool.make(..., env_type="gymnasium")`) steps its sub-envs in a
C++ thread pool. Its synchronous API is Gymnasium's (`reset`, `step`); its
asynchronous one is `async_reset()`, `send(action, env_id)` and `recv()`,
which returns the results of `batch_size` sub-envs, whichever finished
first, named by `info["env_id"]`. Both are recorded on the batch recorder
(`record/batch/core.py`): a batch of all sub-envs writes one row, a batch of
some (`batch_size < num_envs`) writes each sub-env's row at its own time.

EnvPool resets an ended sub-env at its next step (Gymnasium's `next_step`
autoreset): that result is the next episode's first observation, and the
action sent with it is ignored. Everything else (`info_keys`, `discount`,
the features from the spaces) is `RecordRLDSVector`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record.batch.action_range import ActionRange
from rlds_writer.record.batch.arrays import done_flags, host_array
from rlds_writer.record.batch.closing import StepGuard
from rlds_writer.record.batch.vector import NEXT_STEP, VectorRecording
from rlds_writer.record.gymnasium_recording import OPTIONS_DOC
from rlds_writer.record.values import describe


class RecordRLDSEnvPool:
    __doc__ = (
        "Records every episode of every sub-env of an EnvPool env as RLDS.\n\n"
        "    Wraps an env made with `envpool.make(task, env_type='gymnasium', ...)`;\n"
        "    `reset`/`step` (sync) and `async_reset`/`send`/`recv` (async) are the\n"
        "    env's own, recorded. Other attributes are the env's.\n" + OPTIONS_DOC
    )

    def __init__(self, env: Any, data_directory: Any, **kwargs: Any):
        config = getattr(env, "config", None)
        if not isinstance(config, dict) or "num_envs" not in config:
            raise TypeError(
                f"RecordRLDSEnvPool wraps an EnvPool env (envpool.make(...)), got "
                f"{type(env).__name__}; wrap a Gymnasium vector env with RecordRLDSVector"
            )
        if "gymnasium" not in type(env).__module__.lower() and not _is_gymnasium(env):
            raise TypeError(
                "RecordRLDSEnvPool records EnvPool's Gymnasium API: make the env with "
                "envpool.make(task, env_type='gymnasium', ...)"
            )
        self.env = env
        self.num_envs = int(config["num_envs"])
        self.batch_size = int(config.get("batch_size") or self.num_envs)
        metadata = {
            "source": "envpool",
            "env_id": getattr(getattr(env, "spec", None), "id", None) or config.get("task_id"),
            "num_envs": self.num_envs,
            "batch_size": self.batch_size,
            "autoreset_mode": NEXT_STEP,
            **dict(kwargs.pop("metadata", None) or {}),
        }
        metadata = {k: v for k, v in metadata.items() if v is not None}
        self._recording = VectorRecording(
            env.observation_space,
            env.action_space,
            self.num_envs,
            NEXT_STEP,
            data_directory,
            {**kwargs, "metadata": metadata},
            per_env=True,
        )
        self._actions: np.ndarray | None = None  # the last action sent to each sub-env
        # EnvPool steps a Discrete env with any int (5 for Discrete(2)): refused here.
        self._range = ActionRange.of(getattr(env, "action_space", None))
        self._pending = np.zeros(self.num_envs, np.bool_)  # its next result is a reset
        self._closed = False
        self._guard = StepGuard(f"the RecordRLDSEnvPool of {data_directory}")

    @property
    def recorder(self) -> Any:
        """The `BatchRecorder` (counters `episodes_written`, ...); None before the first reset."""
        return self._recording.core

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.env, name)

    # -------------------------------------------------------------- sync

    def reset(self, env_id: Any = None) -> tuple[Any, dict[str, Any]]:
        """Resets the sub-envs `env_id` (default: all); their episodes begin."""
        obs, info = self.env.reset(env_id) if env_id is not None else self.env.reset()
        ids = self._env_ids(info, len(_first(obs)))
        rec = self._recording
        guard = self._guard
        guard.enter()  # a close() on another thread waits for the episodes begun
        try:
            meta = rec._metadata(info, rows=len(ids))
            if rec.core is None:
                rec.core = rec._make_core(rec._inferred(meta))
            rec.core.begin(rec.convert_obs(obs), meta, env_ids=ids)
            self._pending[ids] = False
        finally:
            guard.leave()
        return obs, info

    def step(self, action: Any, env_id: Any = None) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Steps the sub-envs `env_id` (default: all) and records their results."""
        self._sent(action, env_id)
        result = self.env.step(action, env_id) if env_id is not None else self.env.step(action)
        self._record(result)
        return result

    # ------------------------------------------------------------- async

    def async_reset(self) -> None:
        """Resets every sub-env; their first observations come with the next `recv`s."""
        self.env.async_reset()
        self._pending[:] = True

    def send(self, action: Any, env_id: Any = None) -> None:
        """Sends actions to the sub-envs `env_id` (default: all)."""
        self._sent(action, env_id)
        if env_id is None:
            self.env.send(action)
        else:
            self.env.send(action, env_id)

    def recv(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Receives `batch_size` sub-envs' results and records them."""
        result = self.env.recv()
        self._record(result)
        return result

    # ----------------------------------------------------------- private

    def _sent(self, action: Any, env_id: Any) -> None:
        actions = host_array(action, "steps/action")
        # Checked before the pool sees them (EnvPool casts a float action to an int one
        # and reads a short batch past its end); a bad batch is refused, not recorded.
        kept = self._actions
        if kept is None:
            space = getattr(self.env, "action_space", None)
            shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
            if shape is None or dtype is None:  # a space without one array per sub-env
                shape, dtype = actions.shape[1:], actions.dtype
            # The sender's dtype, if it is the space's kind (no cast per send).
            same = np.can_cast(actions.dtype, dtype, "same_kind")
            kept = np.zeros((self.num_envs, *shape), actions.dtype if same else dtype)
        rows = self.num_envs if env_id is None else (len(actions) if actions.ndim else 1)
        if actions.shape != (rows, *kept.shape[1:]):
            to = "every sub-env" if env_id is None else "each sub-env in env_id"
            raise StepValueError(
                "steps/action",
                f"expected a batch {kept.dtype}[{','.join(map(str, (rows, *kept.shape[1:])))}]"
                f" (one action for {to}), got {describe(actions)}",
            )
        if actions.dtype != kept.dtype and not np.can_cast(actions.dtype, kept.dtype, "same_kind"):
            raise StepValueError(
                "steps/action",
                f"expected {kept.dtype} actions, got {describe(actions)}, which does not cast "
                f"to {kept.dtype} without changing kind; cast it first",
            )
        if self._range is not None:
            self._range.check(actions)
        ids = slice(None) if env_id is None else self._checked_ids(env_id, len(actions))
        kept[ids] = actions
        self._actions = kept

    def _checked_ids(self, env_id: Any, rows: int) -> np.ndarray:
        # EnvPool aborts the process on an id out of range and steps a repeated id twice:
        # both are refused here, before the pool sees them.
        ids = host_array(env_id, "env_id")
        if ids.dtype.kind not in "iu" or ids.shape != (rows,):
            raise StepValueError(
                "env_id",
                f"expected int[{rows}] (one id per action row, from info['env_id']), "
                f"got {ids.dtype}{list(ids.shape)}",
            )
        ids = ids.astype(np.int64, copy=False)
        if rows and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise StepValueError(
                "env_id", f"expected ids in 0..{self.num_envs - 1}, got {ids.min()}..{ids.max()}"
            )
        if len(np.unique(ids)) != rows:
            raise StepValueError("env_id", f"expected distinct ids, got {ids.tolist()[:16]}")
        return ids

    def _env_ids(self, info: Any, rows: int) -> np.ndarray:
        ids = info.get("env_id") if hasattr(info, "get") else None
        if ids is None:
            return np.arange(rows)
        return host_array(ids, "env_id").astype(np.int64, copy=False)

    def _record(self, result: Any) -> None:
        guard = self._guard
        guard.enter()  # close() on another thread waits for it (`closing.py`)
        try:
            self._record_result(result)
        finally:
            guard.leave()

    def _record_result(self, result: Any) -> None:
        obs, rewards, terminations, truncations, info = result
        rec = self._recording
        core = rec.core
        if core is None:
            if not self._pending.all():
                raise RuntimeError("RecordRLDSEnvPool: reset() or async_reset() first")
            rows = len(_first(obs))
            meta = rec._metadata(info, rows=rows)
            core = rec.core = rec._make_core(rec._inferred(meta))
        ids = self._env_ids(info, len(np.asarray(rewards)))
        reset = self._pending[ids]
        terms = done_flags(terminations, "terminated")
        done = terms | done_flags(truncations, "truncated")
        meta = rec._metadata(info, rows=len(ids))
        observation = rec.convert_obs(obs)
        if not reset.all():
            actions = self._actions[ids] if self._actions is not None else None
            discount = (~terms).astype(np.float32) if rec.discount else None
            core.add(rec.convert_action(actions), rewards, discount, observation, meta, ids)
            core.end(done & ~reset, terms, env_ids=ids)
        if reset.any():
            core.begin(observation, meta, reset, env_ids=ids)
        self._pending[ids] = done & ~reset

    def flush(self) -> None:
        """Blocks until every finished episode is on disk."""
        self._recording.flush()

    def close(self) -> None:
        """Ends open episodes (cut short), closes the dataset, then the env."""
        if self._closed:
            return
        self._closed = True
        self._guard.close()
        try:
            self._recording.close()
        finally:
            close = getattr(self.env, "close", None)
            if close is not None:
                close()


def _first(obs: Any) -> Any:
    """The first leaf of an observation nest (for its batch size)."""
    while isinstance(obs, dict | tuple | list):
        obs = next(iter(obs.values())) if isinstance(obs, dict) else obs[0]
    return obs


def _is_gymnasium(env: Any) -> bool:
    space = getattr(env, "observation_space", None)
    return type(space).__module__.startswith("gymnasium")
