"""`EnvLogger`: a `dm_env.Environment` wrapper that records every episode.

It keeps envlogger's interface (`step_fn`, `episode_fn`, `metadata`, a
`backend`), so its users can switch by changing an import.
"""

from __future__ import annotations

import _thread
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import dm_env
import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record import appender, step_kernel
from rlds_writer.record.appender import StepBody, compile_source
from rlds_writer.record.config import env_config
from rlds_writer.record.dm_env.backend import TFDSBackendWriter
from rlds_writer.record.episode import other_thread_error
from rlds_writer.record.values import user_fn_result
from rlds_writer.store.dataset import json_values
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.features import end_reasons, feature_defs

_FIRST = dm_env.StepType.FIRST
_LAST = dm_env.StepType.LAST
_MID = dm_env.StepType.MID

StepFn = Callable[[dm_env.TimeStep, Any, dm_env.Environment], Any]


class EnvLogger(dm_env.Environment):
    """Wraps a dm_env environment and records its episodes.

    Args:
      env: the environment to record.
      backend: a `TFDSBackendWriter` (or anything with its recorder methods).
      data_directory: if no backend is given, record here with a config built
        from the env's specs (`env_config`, plus the `end_reason` episode
        field).
      step_fn: `step_fn(timestep, action, env) -> dict`, called at every reset
        (with `action=None`) and step; its dict is stored as that timestep's
        step metadata (it belongs to the step whose observation came with it).
      episode_fn: `episode_fn(timestep, action, env) -> dict | None`, called at
        every reset and step; the last non-None value is the episode metadata.
      metadata: dataset-level metadata, stored in `metadata.json` together with
        the env's specs.
      name: dataset name when the backend is built here.
      **backend_kwargs: `TFDSBackendWriter` arguments when it is built here.
    """

    def __init__(
        self,
        env: dm_env.Environment,
        backend: TFDSBackendWriter | None = None,
        *,
        data_directory: str | None = None,
        step_fn: StepFn | None = None,
        episode_fn: StepFn | None = None,
        metadata: Mapping[str, Any] | None = None,
        name: str = "rlds_dataset",
        **backend_kwargs: Any,
    ):
        specs = {
            "observation_spec": env.observation_spec(),
            "action_spec": env.action_spec(),
            "reward_spec": env.reward_spec(),
            "discount_spec": env.discount_spec(),
        }
        metadata = {**dict(metadata or {}), "env_specs": json_values.jsonable(specs)}
        if backend is None:
            if data_directory is None:
                raise ValueError("EnvLogger needs a backend or a data_directory")
            # The config is ours to build: it says why each episode ended.
            config = env_config(
                env, name, episode_metadata_info={end_reasons.END_REASON: feature_defs.Text()}
            )
            # The metadata goes in with the dataset's first files, not as a rewrite after.
            ds_metadata = {**dict(backend_kwargs.pop("ds_metadata", None) or {}), **metadata}
            backend = TFDSBackendWriter(
                data_directory, config, ds_metadata=ds_metadata, **backend_kwargs
            )
        elif data_directory is not None or backend_kwargs:
            raise ValueError("pass either a backend or data_directory/backend arguments, not both")
        else:
            backend.update_metadata(metadata)
        self._env = env
        self._backend = backend
        self._step_fn = step_fn
        self._episode_fn = episode_fn
        # No user function to call: the step is one call to the recorder.
        self._plain = step_fn is None and episode_fn is None
        self._closed = False
        self._owner = 0
        # Compiled mid-episode steps, by the episode buffer's adder (`_fused_step`).
        self._fused: dict[Callable[..., None], Callable[[Any], dm_env.TimeStep]] = {}
        # Until the first reset: the backend's own call, which refuses a step
        # outside an episode with the advice to reset.
        self._add = backend.add_step
        if self._plain and type(self).step is EnvLogger.step:
            # The first episode's step is made now, not at the first reset, which
            # would pay making it (the C step, or the Python step's compile).
            for add in backend.recorder.prepared_adders():
                self._mid_episode_step(add)

    @property
    def backend(self) -> TFDSBackendWriter:
        return self._backend

    def _step_metadata(self, timestep: dm_env.TimeStep, action: Any) -> Any:
        if self._step_fn is None:
            return None
        meta = self._step_fn(timestep, action, self._env)
        return user_fn_result("step_fn", meta, "steps/<step metadata>")

    def _episode_metadata(self, timestep: dm_env.TimeStep, action: Any) -> None:
        if self._episode_fn is None:
            return
        meta = self._episode_fn(timestep, action, self._env)
        if user_fn_result("episode_fn", meta, "<episode metadata>") is None:
            return
        self._backend.set_episode_metadata(meta)

    def _begin(self, timestep: dm_env.TimeStep) -> None:
        self._unbind()
        if self._plain:
            self._backend.begin_episode(timestep.observation)
        else:
            meta = self._step_metadata(timestep, None)
            self._backend.begin_episode(timestep.observation, meta)
            self._episode_metadata(timestep, None)
        self._owner = _thread.get_ident()  # the episode's thread; another's steps are refused
        # Bound to this episode: one call per step instead of three.
        self._add = self._backend.step_adder()
        if self._plain and type(self).step is EnvLogger.step:
            # The instance attribute shadows the method until the episode ends.
            self.step = self._mid_episode_step(self._add)

    def _unbind(self) -> None:
        """Back to the checked per-step path: outside an episode, or after it ended."""
        self._add = self._backend.add_step
        self.__dict__.pop("step", None)

    def _mid_episode_step(self, add: Callable[..., None]) -> Callable[[Any], dm_env.TimeStep]:
        """`step` for an episode of a logger without user functions.

        A closure over the env's `step` and the episode's adder: a mid-episode
        step costs two calls and no attribute lookups on `self`; other steps go
        to `_record`. It pays: without it (`step` as the plain method) the env
        thread spends 1.01-1.10x the CPU per Catch step in three runs of
        `benchmarks/step_paths.py` ("no closure"; a small gain, but in every
        run). It is installed only where nothing else is called per step (no
        `step_fn`/`episode_fn`) and `step` is not overridden. Where the adder
        is a compiled one (`record.appender.compile_step_add`), its test and
        appends are compiled into this function itself (`_fused_step`): with
        that, the plain method costs 1.15-1.20x the env thread's CPU per Catch
        step in two runs of `step_paths.py`.
        """
        fused = self._fused.get(add)
        if fused is not None:  # compiled for this buffer at an earlier reset
            return fused
        env_step = self._env.step
        # Weakly: the logger holds this function, which must not keep it alive.
        logger = weakref.ref(self)

        def checked(action: Any, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
            try:
                add(action, timestep.reward, timestep.discount, timestep.observation)
            except StepValueError as e:
                logger()._unbind()
                raise logger()._backend.cut_short(e) from e
            return timestep

        def other(timestep: dm_env.TimeStep, action: Any) -> dm_env.TimeStep:
            return logger()._record(timestep, action)

        body = getattr(add, "step_body", None)
        if body is not None and not body.takes_metadata:
            return self._fused_step(add, body, env_step, checked, other)

        def step(action: Any) -> dm_env.TimeStep:
            timestep = env_step(action)
            if timestep.step_type is not _MID:
                return logger()._record(timestep, action)
            try:
                add(action, timestep.reward, timestep.discount, timestep.observation)
            except StepValueError as e:
                logger()._unbind()
                raise logger()._backend.cut_short(e) from e
            return timestep

        step.__doc__ = EnvLogger.step.__doc__
        return step

    def _fused_step(
        self,
        add: Callable[..., None],
        body: StepBody,
        env_step: Callable[[Any], dm_env.TimeStep],
        checked: Callable[[Any, dm_env.TimeStep], dm_env.TimeStep],
        other: Callable[[dm_env.TimeStep, Any], dm_env.TimeStep],
    ) -> Callable[[Any], dm_env.TimeStep]:
        """The mid-episode step with the episode buffer's compiled add inlined.

        One Python call less per step than calling the adder (about 10% of
        what recording adds to a Catch step). Where the C step is built and
        every column has a C form (`record.step_kernel`), it steps the env
        and takes the common case; what it leaves (another step type, a
        value to cast or refuse) goes the checked way. Made once per episode
        buffer (the recorder reuses its buffers) and kept.
        """
        fused = None
        if body.kernel_leaves is not None and step_kernel.available():
            # Not compiled: the C step leaves this only the rare steps (~0.2 ms saved).
            def rest(action: Any, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
                if timestep.step_type is not _MID:
                    return other(timestep, action)
                return checked(action, timestep)

            fused = step_kernel.step_kernel(
                env_step,
                (dm_env.TimeStep, 4),
                ((0, _MID),),  # step_type
                (1, 2, 3),  # reward, discount, observation
                rest,
                add.buffer,
                body.kernel_leaves,
            )
        if fused is None:
            text = (
                "def step(action):\n"
                f"    if not {appender.OWNER_TEST}:\n"
                "        _buffer.refuse_thread()  # before the env is touched\n"
                "    timestep = _env_step(action)\n"
                "    if timestep.step_type is not _MID:\n"
                "        return _other(timestep, action)\n"
                "    reward = timestep.reward\n"
                "    discount = timestep.discount\n"
                "    next_observation = timestep.observation\n"
                "    n = _buffer.num_steps\n"
                f"    if n and {body.test}:\n"
                f"{body.guarded_appends('        ')}"
                "        return timestep\n"
                "    return _checked(action, timestep)\n"
            )
            names = dict(
                body.names,
                _env_step=env_step,
                _MID=_MID,
                _other=other,
                _checked=checked,
                _buffer=add.buffer,
            )
            fused = compile_source(text, names, "step")
            fused.__doc__ = EnvLogger.step.__doc__
        if len(self._fused) >= 8:  # the recorder reuses one or two buffers
            self._fused.clear()
        self._fused[add] = fused
        return fused

    def reset(self) -> dm_env.TimeStep:
        timestep = self._env.reset()
        self._begin(timestep)
        return timestep

    def step(self, action: Any) -> dm_env.TimeStep:
        """Steps the env and records the transition (see `dm_env.Environment.step`)."""
        if self._owner != _thread.get_ident() and self._add is not self._backend.add_step:
            raise other_thread_error()  # in another thread's episode: the env is not touched
        return self._record(self._env.step(action), action)

    def _record(self, timestep: dm_env.TimeStep, action: Any) -> dm_env.TimeStep:
        # Compare step types directly: TimeStep.first()/last() cost ~1 µs each.
        step_type = timestep.step_type
        if step_type == _FIRST:
            # dm_env envs restart on the step after the last one.
            self._begin(timestep)
            return timestep
        try:
            if self._plain:
                self._add(action, timestep.reward, timestep.discount, timestep.observation)
            else:
                self._add(
                    action,
                    timestep.reward,
                    timestep.discount,
                    timestep.observation,
                    self._step_metadata(timestep, action),
                )
                self._episode_metadata(timestep, action)
        except StepValueError as e:
            # The env has moved on: never record the next step after a missing one.
            self._unbind()
            raise self._backend.cut_short(e) from e
        if step_type == _LAST:
            discount = timestep.discount
            if type(discount) is float:  # the common case, without numpy's ~5 µs
                terminated = discount == 0.0
            else:
                terminated = discount is not None and bool(np.all(np.asarray(discount) == 0))
            self._unbind()
            self._backend.end_episode(terminated=terminated)
        return timestep

    def observation_spec(self) -> Any:
        return self._env.observation_spec()

    def action_spec(self) -> Any:
        return self._env.action_spec()

    def reward_spec(self) -> Any:
        return self._env.reward_spec()

    def discount_spec(self) -> Any:
        return self._env.discount_spec()

    def flush(self) -> None:
        """Blocks until every finished episode is on disk."""
        self._backend.flush()

    @interrupts.held
    def close(self) -> None:
        """Ends an open episode (cut short), closes the dataset and the env."""
        if self._closed:
            return
        self._closed = True
        self._unbind()
        try:
            self._backend.close()
        finally:
            self._env.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._env, name)
