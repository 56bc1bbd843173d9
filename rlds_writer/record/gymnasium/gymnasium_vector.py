"""`RecordRLDSVector`: every sub-env of a Gymnasium vector env recorded as RLDS.

Each sub-env's episodes are separate episodes of one dataset. The wrapper
records whole batches, one call per vector step, on the batch recorder
(`record/batch/vector.py` over `record/batch/core.py`): each episode is
byte for byte what `RecordRLDS` records for that sub-env alone. With
`step_fn` or `episode_fn`, user functions of one sub-env's step, it records
a sub-env at a time instead, through one `Recording`
(`record/gymnasium_recording.py`) with a slot per sub-env. The
autoreset mode (`next_step`, `same_step`, `disabled`) is read from
`env.metadata['autoreset_mode']`; the autoreset step of `next_step` mode never
enters an episode, and in `same_step` mode the final observation and info of
an ended episode are taken from `final_obs`/`final_info`. The mapping from
Gymnasium to RLDS is `RecordRLDS`'s (`record/gymnasium/gymnasium_wrapper.py`).
"""

from __future__ import annotations

import _thread
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import iterate

from rlds_writer.errors import StepValueError
from rlds_writer.record.batch.action_range import ActionRange
from rlds_writer.record.batch.arrays import host_array
from rlds_writer.record.batch.closing import StepGuard
from rlds_writer.record.batch.vector import VectorRecording, split_options
from rlds_writer.record.episode import other_thread_error
from rlds_writer.record.gymnasium_recording import OPTIONS_DOC, env_id, new_recording
from rlds_writer.record.recorder import Recorder
from rlds_writer.store.episodes import interrupts

if TYPE_CHECKING:
    from etils import epath

    from rlds_writer.record.batch.core import BatchRecorder


def _env_info(infos: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The `info` of sub-env `index` from a vector env's batched info dict."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        if isinstance(value, Mapping):
            out[key] = _env_info(value, index)
        else:
            out[key] = value[index]
    return out


def _items(values: Any) -> Any:
    """A batch of scalars (an array, usually) as a list of Python scalars."""
    return values.tolist() if hasattr(values, "tolist") else values


_FINAL_KEYS = ("final_obs", "final_info")


class RecordRLDSVector(gymnasium.vector.VectorWrapper):
    __doc__ = (
        "Records every episode of every sub-env of a Gymnasium vector env as RLDS.\n\n"
        "    Each sub-env's episodes are separate episodes of one dataset; the\n"
        "    autoreset mode is read from `env.metadata['autoreset_mode']`.\n" + OPTIONS_DOC
    )

    def __init__(
        self,
        env: gymnasium.vector.VectorEnv,
        data_directory: epath.PathLike,
        **kwargs: Any,
    ):
        super().__init__(env)
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self._mode = AutoresetMode(mode) if not isinstance(mode, AutoresetMode) else mode
        metadata = {
            "autoreset_mode": self._mode.value,
            "num_envs": env.num_envs,
            **env_id(env),
            **dict(kwargs.pop("metadata", None) or {}),
        }
        self._closed = False
        self._owner = 0  # the thread of the last reset; another's steps are refused
        # close() on another thread waits for a step in progress (`closing.py`).
        self._guard = StepGuard(f"the RecordRLDSVector of {data_directory}")
        # Discrete actions out of the space's range are refused before the env steps.
        self._action_range = ActionRange.of(env.single_action_space)
        # Set before anything can refuse: `close()` (gymnasium's `__del__`) of an object
        # whose constructor raised closes what was made and nothing else.
        self._recording: Any = None
        self._adders: list[Callable[..., None] | None] = []
        # Whole batches, one call per vector step, unless a user function
        # must see each sub-env's step.
        self._batch: VectorRecording | None = None
        if not split_options(kwargs):
            self._batch = VectorRecording(
                env.single_observation_space,
                env.single_action_space,
                env.num_envs,
                self._mode.value,
                data_directory,
                {**kwargs, "metadata": metadata},
            )
            return
        kwargs.pop("ring_bytes", None)
        self._recording = new_recording(
            env.single_observation_space,
            env.single_action_space,
            data_directory,
            {**kwargs, "metadata": metadata},
        )
        # Per sub-env, as Python lists: numpy's scalar reads and writes cost
        # more than the rest of a sub-env's step.
        n = env.num_envs
        self._step_index = [0] * n
        self._autoreset = [False] * n
        # Each sub-env's step adder, bound to its open episode (`Recording.step_adder`);
        # None outside one and after a refused value: the general path handles both.
        # No C step (`record.step_kernel`) here: a user function sees every step.
        self._adders: list[Callable[..., None] | None] = [None] * n
        # `iterate`'s implementations for the two spaces, looked up once, not
        # through its dispatch at every step.
        self._iterate_obs = iterate.dispatch(type(env.observation_space))
        self._iterate_actions = iterate.dispatch(type(env.action_space))

    @property
    def recorder(self) -> Recorder | BatchRecorder | None:
        """What records (counters `episodes_written`, ...): the batch recorder, or the
        per-sub-env `Recorder` with `step_fn`/`episode_fn`. None before the first
        reset of a batch recording whose `info_keys` features are inferred."""
        if self._batch is not None:
            return self._batch.core
        return self._recording.recorder

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        # Read the mask first: the vector env pops it from `options`.
        mask = (options or {}).get("reset_mask")
        obs, infos = self.env.reset(seed=seed, options=options)
        self._owner = _thread.get_ident()
        guard = self._guard
        guard.enter()  # a close() on another thread waits for the episodes begun
        try:
            if self._batch is not None:
                self._batch.reset(obs, infos, mask)
                return obs, infos
            for i, obs_i in enumerate(self._iterate_obs(self.env.observation_space, obs)):
                if mask is not None and not mask[i]:
                    continue
                self._begin(i, obs_i, _env_info(infos, i))
                self._autoreset[i] = False
            return obs, infos
        finally:
            guard.leave()

    def _begin(self, i: int, obs_i: Any, info_i: Mapping[str, Any]) -> None:
        self._unbind(i)  # until the episode has begun
        self._step_index[i] = 0
        self._recording.begin(i, obs_i, info_i)
        self._adders[i] = self._recording.step_adder(i)

    def _unbind(self, i: int) -> None:
        """Sub-env `i`'s steps go the general way: outside an episode, or after it ended."""
        self._adders[i] = None

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._owner != _thread.get_ident() and self._owner:
            raise other_thread_error()  # before the env is touched
        guard = self._guard
        guard.enter()
        try:
            return self._step(actions)
        finally:
            guard.leave()

    def _step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._action_range is not None:
            batch = actions if type(actions) is np.ndarray else host_array(actions, "steps/action")
            self._action_range.check(batch)
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        if self._batch is not None:
            self._batch.step(actions, obs, rewards, terminations, truncations, infos)
            return obs, rewards, terminations, truncations, infos
        observations = self._iterate_obs(self.env.observation_space, obs)
        action_items = self._iterate_actions(self.env.action_space, actions)
        # A value refused for one sub-env must not cost the others their step:
        # every sub-env is recorded, then the first error is raised.
        first_error = None
        # Python scalars read faster than numpy's, one sub-env at a time; the
        # caller gets the env's own arrays back. Rewards stay as the env gave
        # them: the user functions see them.
        terms, truncs = _items(terminations), _items(truncations)
        for i, (obs_i, action_i) in enumerate(zip(observations, action_items)):
            try:
                self._record_sub_env(i, obs_i, action_i, rewards[i], terms[i], truncs[i], infos)
            except StepValueError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return obs, rewards, terminations, truncations, infos

    def _record_sub_env(
        self, i: int, obs_i: Any, action_i: Any, reward: Any, term: Any, trunc: Any, infos: Any
    ) -> None:
        recording = self._recording
        info_i = _env_info(infos, i)
        if self._autoreset[i]:
            # next_step mode: this step reset sub-env i; its action was ignored.
            self._autoreset[i] = False
            self._begin(i, obs_i, info_i)
            return
        adder = self._adders[i]
        if adder is None:
            writer = recording.recorder
            if not writer.in_episode(i) and not writer.stopped(i):
                raise RuntimeError(f"sub-env {i} was stepped outside an episode: reset it first")
            adder = functools.partial(recording.add, i)
        terminated, truncated = bool(term), bool(trunc)
        done = terminated or truncated
        step_index = self._step_index[i] = self._step_index[i] + 1
        if done:
            self._unbind(i)  # the episode ends with this step
        if done and self._mode == AutoresetMode.SAME_STEP:
            final_obs = infos["final_obs"][i]
            final_info = _env_info(infos["final_info"], i)
            reset_info = {k: v for k, v in info_i.items() if k not in _FINAL_KEYS}
            try:
                adder(step_index, action_i, final_obs, reward, terminated, truncated, final_info)
            finally:
                self._begin(i, obs_i, reset_info)
            return
        if done and self._mode == AutoresetMode.NEXT_STEP:
            self._autoreset[i] = True  # set first: a refused value must not lose it
        try:
            adder(step_index, action_i, obs_i, reward, terminated, truncated, info_i)
        except BaseException:
            self._unbind(i)  # cut short: its next steps go the general way
            raise

    def flush(self) -> None:
        """Blocks until every finished episode is on disk."""
        if self._batch is not None:
            self._batch.flush()
            return
        self._recording.recorder.flush()

    @interrupts.held
    def close(self, **kwargs: Any) -> None:
        """Ends open episodes (cut short), closes the dataset, then the env."""
        if self._closed:
            return
        self._closed = True
        self._guard.close()
        try:
            if self._batch is not None:
                self._batch.close()
                return
            if self._recording is None:
                return  # the constructor refused: nothing was recorded
            for i in range(len(self._adders)):
                self._unbind(i)
            self._recording.recorder.close()
        finally:
            self.env.close(**kwargs)
