"""`RolloutRecorder`: whole rollouts of `(T, N, ...)` arrays written as RLDS episodes.

JAX envs (Brax, MJX, gymnax; PureJaxRL's training loop) produce a rollout of
`T` steps of `N` sub-envs in one `scan`: arrays with a time axis and an env
axis. `RolloutRecorder.write` takes such a rollout as it is (JAX, torch,
numpy or anything `record.batch.arrays` takes: one transfer to the host per
array, not per step) and feeds the batch recorder one vector step at a time;
episodes continue across consecutive calls, and those open at `close()` are
written cut short.

The arrays are the results of each step, as a vector env returns them:
`observation[t]` is what step `t` returned after `action[t]`, and
`terminated[t]`/`truncated[t]` say whether it ended the episode. The first
call also takes `first_observation`, the reset's. Two autoreset conventions:

* `same_step` (Brax, gymnax, PureJaxRL): where an episode ended,
  `observation[t]` is already the next episode's first observation; the
  final one comes in `final_observation[t]` (rows elsewhere are not read).
* `next_step` (EnvPool, Gymnasium's default): the step after an episode's
  end is its reset: its `observation` begins the next episode and its action
  is ignored.

Features come from `ds_config`, from Gymnasium spaces, or from the first
rollout's arrays (a sub-env's row of each: its shape and dtype).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError, WriterClosedError
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.record.batch import vector_step
from rlds_writer.record.batch.action_range import ActionRange
from rlds_writer.record.batch.arrays import done_flags, host_array, host_batch
from rlds_writer.record.batch.closing import StepGuard
from rlds_writer.record.batch.core import BatchRecorder
from rlds_writer.record.config import recording_config

SAME_STEP, NEXT_STEP = "same_step", "next_step"


def _host(nest: Any, path: str) -> Any:
    if isinstance(nest, Mapping):
        return {k: _host(v, f"{path}/{k}") for k, v in nest.items()}
    if isinstance(nest, tuple | list) and not _is_numbers(nest):
        return {str(i): _host(v, f"{path}/{i}") for i, v in enumerate(nest)}
    return host_batch(nest, path)


def _is_numbers(value: Any) -> bool:
    return not value or not isinstance(value[0], Mapping | tuple | list | np.ndarray)


def _at(nest: Any, t: Any) -> Any:
    if isinstance(nest, dict):
        return {k: _at(v, t) for k, v in nest.items()}
    return nest[t]


def _where(mask: np.ndarray, a: Any, b: Any) -> Any:
    """`a` where `mask` (over the leading axis), else `b`, leaf by leaf."""
    if isinstance(a, dict):
        return {k: _where(mask, a[k], b[k]) for k in a}
    return np.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)


def _steps(nest: Any) -> int:
    while isinstance(nest, dict):
        nest = next(iter(nest.values()))
    return nest.shape[0] if nest.ndim else 0


def _check_steps(nest: Any, path: str, steps: int) -> None:
    """Every leaf of a `(T, N, ...)` input has the rollout's `T` steps (never broadcast or cut)."""
    if isinstance(nest, dict):
        for k, v in nest.items():
            _check_steps(v, f"{path}/{k}", steps)
        return
    if nest.ndim < 2 or nest.shape[0] != steps:
        raise StepValueError(
            path, f"expected (T={steps}, N, ...) like terminated, got shape {tuple(nest.shape)}"
        )


def _row_feature(nest: Any, path: str, image_encoding: str, jpeg_quality: int) -> Any:
    """The feature of one sub-env's value, from sub-env 0 at step 0."""
    if isinstance(nest, dict):
        return {
            k: _row_feature(v, f"{path}/{k}", image_encoding, jpeg_quality) for k, v in nest.items()
        }
    return spaces_lib.values_def([nest[0, 0]], path, image_encoding, jpeg_quality)


class RolloutRecorder:
    """Writes rollouts of `(T, N, ...)` arrays into one dataset, episodes continuing across calls.

    Args:
      data_directory: the dataset directory (local, or an fsspec URL).
      autoreset: `same_step` (the default: Brax, gymnax, PureJaxRL) or `next_step`.
      ds_config: a full `DatasetConfig`; if given, nothing is inferred.
      observation_space: a Gymnasium space of one sub-env's observation
        (with `action_space`: the features as `RecordRLDS` builds them).
      action_space: a Gymnasium space of one sub-env's action.
      discount: write a `discount` column (given to `write`, or 1.0, and
        0.0 on termination).
      name: the dataset name (used in shard file names).
      image_encoding: how image-like arrays are stored (`png`, `jpeg`, `bytes`, ...).
      jpeg_quality: JPEG quality for `image_encoding="jpeg"`.
      split: the split episodes go to.
      **writer_kwargs: `DatasetWriter` arguments (`mode`, `metadata`,
        `max_episodes_per_file`, `fsync`, ...) and `ring_bytes`.
    """

    def __init__(
        self,
        data_directory: Any,
        *,
        autoreset: str = SAME_STEP,
        ds_config: Any = None,
        observation_space: Any = None,
        action_space: Any = None,
        discount: bool = False,
        name: str = "rlds_dataset",
        image_encoding: str = spaces_lib.DEFAULT_IMAGE_ENCODING,
        jpeg_quality: int = spaces_lib.DEFAULT_JPEG_QUALITY,
        split: str = "train",
        **writer_kwargs: Any,
    ):
        if autoreset not in (SAME_STEP, NEXT_STEP):
            raise ValueError(f"autoreset must be {SAME_STEP!r} or {NEXT_STEP!r}, got {autoreset!r}")
        self.data_directory = data_directory
        self.autoreset = autoreset
        self._ds_config = ds_config
        self._spaces = (observation_space, action_space)
        self._range = ActionRange.of(action_space) if action_space is not None else None
        self.discount = discount if ds_config is None else ds_config.discount_info is not None
        self._name = name
        self._image = (image_encoding, jpeg_quality)
        self._split = split
        self._writer_kwargs = writer_kwargs
        self.core: BatchRecorder | None = None
        self._pending: np.ndarray | None = None  # next_step: reset by the next step
        self._fast: vector_step.VectorSteps | None = None
        self._closed = False
        self._guard = StepGuard(f"the RolloutRecorder of {data_directory}")

    def write(
        self,
        *,
        observation: Any,
        action: Any,
        reward: Any,
        terminated: Any,
        truncated: Any = None,
        first_observation: Any = None,
        final_observation: Any = None,
        discount: Any = None,
        step_metadata: Mapping[str, Any] | None = None,
        first_step_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Writes a rollout of `T` steps of `N` sub-envs; episodes that end are written.

        Args:
          observation: `(T, N, ...)`: what each step returned (a nest of arrays
            for dict observations).
          action: `(T, N, ...)`: the action each step took.
          reward: `(T, N)`.
          terminated: `(T, N)` bools: the step terminated the episode.
          truncated: `(T, N)` bools, or None (none truncated).
          first_observation: `(N, ...)`: the reset's observations; the first
            call needs it, later calls continue the open episodes.
          final_observation: `(T, N, ...)` (`same_step` only): the final
            observation where an episode ended; rows elsewhere are not read.
          discount: `(T, N)`, or None for 1.0 and 0.0 on termination.
          step_metadata: key -> `(T, N, ...)`: step metadata of each step
            (numbers, or a numpy array of text kept per sub-env).
          first_step_metadata: key -> `(N, ...)`: step metadata of the reset.
        """
        if self._closed:
            raise WriterClosedError(
                f"the RolloutRecorder of {self.data_directory} is closed: write() after close()"
            )
        obs = _host(observation, "steps/observation")
        actions = _host(action, "steps/action")
        rewards = host_array(reward, "steps/reward")
        terms = done_flags(terminated, "terminated")
        steps = terms.shape[0] if terms.ndim == 2 else -1
        if terms.ndim != 2:
            raise StepValueError("terminated", f"expected bool[T, N], got shape {terms.shape}")
        truncs = np.zeros_like(terms) if truncated is None else done_flags(truncated, "truncated")
        meta = _host(step_metadata, "steps") if step_metadata else None
        for label, nest in (("steps/observation", obs), ("steps/action", actions)):
            if _steps(nest) != steps:
                raise StepValueError(
                    label, f"expected {steps} steps (T, N, ...), got {_steps(nest)}"
                )
        finals = (
            _host(final_observation, "final_observation") if final_observation is not None else None
        )
        # A reward, flag or metadata column of another length would be cut or broadcast
        # silently (numpy): every column must have the rollout's T steps.
        if truncs.shape != terms.shape:
            raise StepValueError(
                "truncated", f"expected bool{list(terms.shape)} like terminated, got {truncs.shape}"
            )
        for label, nest in (
            ("steps/observation", obs),
            ("steps/action", actions),
            ("steps/reward", rewards),
            ("final_observation", finals),
            ("steps", meta),
        ):
            if nest is not None:
                _check_steps(nest, label, steps)
        if self._range is not None and isinstance(actions, np.ndarray):
            self._range.check(actions)  # before any step of the rollout is recorded
        guard = self._guard
        guard.enter()  # close() on another thread waits for the rollout (`closing.py`)
        try:
            if self.core is None:
                if first_observation is None:
                    raise StepValueError(
                        "first_observation",
                        "the first rollout needs the reset's observations (N, ...): "
                        "write(first_observation=..., ...)",
                    )
                self.core = self._make_core(obs, actions, meta)
                first_meta = _host(first_step_metadata, "steps") if first_step_metadata else None
                self.core.begin(_host(first_observation, "steps/observation"), first_meta)
                self._pending = np.zeros(self.core.num_envs, np.bool_)
                pending = self._pending if self.autoreset == NEXT_STEP else None
                # The usual step in one C call (`vector_step.py`), its discount given.
                self._fast = vector_step.make(self.core, pending, vector_step.GIVEN)
            elif first_observation is not None:
                raise StepValueError(
                    "first_observation",
                    "episodes continue across write() calls: give first_observation on the first "
                    "call only",
                )
            done_all = terms | truncs
            if self.autoreset == SAME_STEP and finals is None and done_all.any():
                t, i = np.argwhere(done_all)[0].tolist()
                raise StepValueError(
                    "final_observation",
                    f"sub-env {i} ended an episode at step {t}: with autoreset='same_step' its "
                    "final observation comes in final_observation (T, N, ...); or record with "
                    "autoreset='next_step' if the step after an end is the reset",
                )
            if discount is not None:
                discounts = host_array(discount, "steps/discount")
                _check_steps(discounts, "steps/discount", steps)
            elif self.discount:
                discounts = (~terms).astype(np.float32)
            else:
                discounts = None
            for t in range(steps):
                self._step(t, obs, actions, rewards, terms, done_all, finals, discounts, meta)
        finally:
            guard.leave()

    def _step(self, t, obs, actions, rewards, terms, done_all, finals, discounts, meta) -> None:
        core = self.core
        done = done_all[t]
        obs_t = _at(obs, t)
        meta_t = _at(meta, t) if meta is not None else None
        any_done = bool(done.any())
        row_obs = _where(done, _at(finals, t), obs_t) if any_done and finals is not None else obs_t
        if self.autoreset == NEXT_STEP:
            row_obs = obs_t
        fast = self._fast
        if fast is not None:
            discount = None if discounts is None else discounts[t]
            ends = fast.step(_at(actions, t), rewards[t], row_obs, meta_t, terms[t], done, discount)
            if ends is not None:
                fast.finish(ends)
                if self.autoreset == SAME_STEP and any_done:
                    core.begin(obs_t, meta_t, done)
                return
        core.add(
            _at(actions, t),
            rewards[t],
            None if discounts is None else discounts[t],
            row_obs,
            meta_t,
        )
        if any_done:
            core.end(done, terms[t])
        if self.autoreset == SAME_STEP:
            if any_done:
                core.begin(obs_t, meta_t, done)
        else:
            if self._pending.any():
                core.begin(obs_t, meta_t, self._pending)
            self._pending[:] = done & ~self._pending  # in place: the C step holds it

    def _make_core(self, obs: Any, actions: Any, meta: Any) -> BatchRecorder:
        num_envs = _first_leaf(obs).shape[1]
        config = self._ds_config
        image_encoding, jpeg_quality = self._image
        step_info = {}
        if meta is not None:
            for key, value in meta.items():
                step_info[key] = _row_feature(value, f"steps/{key}", *self._image)
        if config is None and self._spaces[0] is not None:
            config = spaces_lib.spaces_config(
                self._spaces[0],
                self._spaces[1],
                self._name,
                discount=self.discount,
                step_metadata_info=step_info,
                episode_metadata_info={},
                image_encoding=image_encoding,
                jpeg_quality=jpeg_quality,
            )
        elif config is None:
            config = recording_config(
                name=self._name,
                observation_info=_row_feature(obs, "steps/observation", *self._image),
                action_info=_row_feature(actions, "steps/action", *self._image),
                reward_info=spaces_lib.reward_feature(),
                discount_info=spaces_lib.discount_feature() if self.discount else None,
                step_metadata_info=step_info,
                episode_metadata_info={},
            )
        kwargs = dict(self._writer_kwargs)
        metadata = {"source": "rollout", "autoreset_mode": self.autoreset, "num_envs": num_envs}
        kwargs["metadata"] = {**metadata, **dict(kwargs.get("metadata") or {})}
        return BatchRecorder(self.data_directory, config, num_envs, split=self._split, **kwargs)

    @property
    def episodes_written(self) -> int:
        return self.core.episodes_written if self.core is not None else 0

    def flush(self) -> None:
        """Blocks until every finished episode is on disk."""
        if self.core is not None:
            self.core.flush()

    def close(self) -> None:
        """Writes the open episodes, cut short, and closes the dataset."""
        if self._closed:
            return
        self._closed = True
        self._guard.close()  # a write() on another thread ends first
        if self.core is not None:
            self.core.close()

    def __enter__(self) -> RolloutRecorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _first_leaf(nest: Any) -> np.ndarray:
    while isinstance(nest, dict):
        nest = next(iter(nest.values()))
    return nest
