"""Gymnasium wrappers that record every episode as RLDS into a TFDS dataset.

* `RecordRLDS` (here) wraps a `gymnasium.Env`.
* `RecordRLDSVector` (`record/gymnasium/gymnasium_vector.py`) wraps a
  `gymnasium.vector.VectorEnv` (`SyncVectorEnv`, `AsyncVectorEnv`) and records
  each sub-env's episodes as separate episodes, in every autoreset mode
  (`next_step`, `same_step`, `disabled`); the autoreset step of `next_step`
  mode never enters an episode.

Both build their recording with `record/gymnasium_recording.py`.

Gymnasium -> RLDS: the reset observation is step 0 and its `info` is step 0's
metadata; each `step(a_t)` adds `a_t` and the reward `r_t` to step t and
opens step t+1 with the returned observation and `info`. `terminated` sets
`is_terminal` on the last step; `truncated` ends the episode with `is_last`
only. A `discount` column (1.0, and 0.0 on termination) is written only when
`discount=True`.

Custom env data: name `info` keys (`info_keys`) and/or pass
`step_fn(obs, action, reward, terminated, truncated, info) -> dict` to store
step metadata; `episode_fn(...)` with the same arguments is called at every
reset (`action=None`) and step, and its last non-None dict is the episode
metadata. Their features are inferred from the first episode unless
declared (`step_metadata_info`, `episode_metadata_info`). An `info` key
missing on some step raises a `StepValueError` unless `info_defaults` gives
its default.
"""

from __future__ import annotations

import _thread
import functools
import weakref
from typing import TYPE_CHECKING, Any

import gymnasium

from rlds_writer.record.episode import other_thread_error
from rlds_writer.record.gymnasium_recording import OPTIONS_DOC, env_id, new_recording
from rlds_writer.record.recorder import Recorder
from rlds_writer.store.episodes import interrupts

if TYPE_CHECKING:
    from etils import epath


class RecordRLDS(gymnasium.Wrapper):
    __doc__ = "Records every episode of a Gymnasium env as RLDS.\n" + OPTIONS_DOC

    def __init__(self, env: gymnasium.Env, data_directory: epath.PathLike, **kwargs: Any):
        super().__init__(env)
        kwargs["metadata"] = {**env_id(env), **dict(kwargs.get("metadata") or {})}
        self._recording = new_recording(
            env.observation_space, env.action_space, data_directory, kwargs
        )
        self._step_index = 0
        # The recording's add bound to the open episode (None outside one,
        # and after a refused value: the general path handles both).
        self._adder: Any = None
        self._closed = False
        self._owner = 0
        self._after_weakly = _after_of(self)
        if type(self).step is RecordRLDS.step:
            self._recording.prepare_step_kernels(self.env.step, self._after_weakly)

    @property
    def recorder(self) -> Recorder:
        """The underlying writer (counters `episodes_written`, ...)."""
        return self._recording.recorder

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._unbind()
        self._recording.begin(0, obs, info)
        self._owner = _thread.get_ident()  # the episode's thread; another's steps are refused
        self._adder = self._recording.step_adder(0)
        self._step_index = 0
        if type(self).step is RecordRLDS.step:
            # The C step, where it can take this recording's steps: the instance
            # attribute shadows the method until the episode ends (`_unbind`).
            kernel = self._recording.step_kernel(0, self.env.step, self._after_weakly)
            if kernel is not None:
                self.step = kernel
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._adder is not None and self._owner != _thread.get_ident():
            raise other_thread_error()  # before the env is touched
        if self._adder is None:
            writer = self._recording.recorder
            if not writer.in_episode(0) and not writer.stopped(0):
                raise RuntimeError(
                    "RecordRLDS.step called outside an episode: call reset() first "
                    "(also after an episode terminated or was truncated)"
                )
        return self._after(action, self.env.step(action))

    def _after(self, action: Any, result: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Records the env's `result` of `action` (the step after the env's call)."""
        obs, reward, terminated, truncated, info = result
        adder = self._adder or functools.partial(self._recording.add, 0)
        # Read by step metadata only; recordings with it never take the C step,
        # which does not count here.
        self._step_index += 1
        try:
            adder(self._step_index, action, obs, reward, terminated, truncated, info)
        except BaseException:
            self._unbind()  # the episode was cut short: steps go the general way
            raise
        if terminated or truncated:
            self._unbind()
        return obs, reward, terminated, truncated, info

    def _unbind(self) -> None:
        """Back to the checked per-step path: outside an episode, or after it ended."""
        self._adder = None
        self.__dict__.pop("step", None)

    def flush(self) -> None:
        """Blocks until every finished episode is on disk."""
        self._recording.recorder.flush()

    @interrupts.held
    def close(self) -> None:
        """Ends an open episode (cut short), closes the dataset, then the env."""
        if self._closed:
            return
        self._closed = True
        self._unbind()
        try:
            self._recording.recorder.close()
        finally:
            self.env.close()


def _after_of(wrapper: RecordRLDS) -> Any:
    """`wrapper._after`, held weakly: the C step it goes into must not keep the wrapper alive."""
    ref = weakref.ref(wrapper)

    def after(action: Any, result: Any) -> Any:
        return ref()._after(action, result)

    return after
