"""What the Gymnasium and PettingZoo wrappers share: one env's recording.

A `Recording` turns Gymnasium-style calls (a reset observation and `info`,
then `step` results) into `Recorder.begin/add/end` calls on a slot, with the
config built from the env's spaces (`record.spaces`) and step and episode
metadata taken from `info` keys, `step_fn` and `episode_fn`. `new_recording`
picks its options out of a wrapper's keyword arguments (the rest go to the
`DatasetWriter`), and `OPTIONS_DOC` documents them for every wrapper.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.record import step_kernel
from rlds_writer.record.recorder import Recorder
from rlds_writer.record.values import user_fn_result

if TYPE_CHECKING:
    from etils import epath

StepFn = Callable[[Any, Any, Any, bool, bool, Mapping[str, Any]], Any]


def action_caster(space: Any) -> Callable[[Any], Any]:
    """Casts numeric arrays to the action space's dtype when that loses no kind.

    Gymnasium envs accept e.g. a float64 array for a float32 `Box`; the
    dataset stores the space's dtype (the caster's `dtype` attribute).
    """
    from gymnasium import spaces

    if not isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        return spaces_lib.space_converter(space)
    dtype = np.dtype(space.dtype)

    def cast(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype != dtype:
            if np.can_cast(value.dtype, dtype, "same_kind"):
                return value.astype(dtype)
        return value

    cast.dtype = dtype
    return cast


class Recording:
    """One env's recording: config, metadata from `info`/`step_fn`/`episode_fn`, recorder."""

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        data_directory: epath.PathLike,
        *,
        name: str,
        ds_config: Any,
        info_keys: Sequence[str],
        info_defaults: Mapping[str, Any] | None,
        step_fn: StepFn | None,
        episode_fn: StepFn | None,
        step_metadata_info: Mapping[str, Any] | None,
        episode_metadata_info: Mapping[str, Any] | None,
        discount: bool,
        observation_info: Any,
        action_info: Any,
        reward_info: Any,
        image_encoding: str,
        jpeg_quality: int,
        split: str,
        metadata: Mapping[str, Any] | None,
        writer_kwargs: dict[str, Any],
    ):
        if isinstance(info_keys, str):
            info_keys = [info_keys]
        self.info_keys = list(info_keys)
        self.info_defaults = dict(info_defaults or {})
        unknown = sorted(set(self.info_defaults) - set(self.info_keys))
        if unknown:
            raise ValueError(f"info_defaults names keys that are not in info_keys: {unknown}")
        self.step_fn = step_fn
        self.episode_fn = episode_fn
        self.discount = discount
        self.convert_obs = spaces_lib.space_converter(observation_space)
        self.convert_action = action_caster(action_space)
        self._kernels: dict[tuple, Any] = {}  # C steps by (buffer's add, env step, after)
        self.default_reward = reward_info is None and ds_config is None
        declared_step = dict(step_metadata_info or {})
        declared_episode = dict(episode_metadata_info or {})
        self.has_step_metadata = bool(self.info_keys or step_fn or declared_step)
        if ds_config is not None:
            infer = False
            declared_step = dict(ds_config.step_metadata_info or {})
            declared_episode = dict(ds_config.episode_metadata_info or {})
            self.discount = ds_config.discount_info is not None

            def make_config(step_info: dict, episode_info: dict) -> Any:
                return ds_config

        else:
            needs_step = bool(step_fn) or any(k not in declared_step for k in self.info_keys)
            infer = needs_step or (episode_fn is not None and not declared_episode)

            def make_config(step_info: dict, episode_info: dict) -> Any:
                return spaces_lib.spaces_config(
                    observation_space,
                    action_space,
                    name,
                    observation_info=observation_info,
                    action_info=action_info,
                    reward_info=reward_info,
                    discount=discount,
                    step_metadata_info=step_info,
                    episode_metadata_info=episode_info,
                    image_encoding=image_encoding,
                    jpeg_quality=jpeg_quality,
                )

        ds_metadata = {
            "observation_space": str(observation_space),
            "action_space": str(action_space),
            **dict(metadata or {}),
        }
        self.recorder = Recorder(
            data_directory,
            make_config,
            step_metadata_info=declared_step,
            episode_metadata_info=declared_episode,
            infer=infer,
            image_encoding=image_encoding,
            jpeg_quality=jpeg_quality,
            split=split,
            metadata=ds_metadata,
            **writer_kwargs,
        )

    def step_metadata(
        self,
        obs: Any,
        action: Any,
        reward: Any,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
        step_index: int,
    ) -> dict[str, Any] | None:
        if not self.has_step_metadata:
            return None
        out: dict[str, Any] = {}
        for key in self.info_keys:
            if key in info:
                out[key] = info[key]
            elif key in self.info_defaults:
                out[key] = self.info_defaults[key]
            else:
                raise StepValueError(
                    f"steps/{key}",
                    f"info key {key!r} is missing at step {step_index} of the episode "
                    f"(info has keys {sorted(map(str, info))}); return it on every step "
                    f"including reset, or pass info_defaults={{{key!r}: <value>}}",
                )
        if self.step_fn is not None:
            extra = self.step_fn(obs, action, reward, terminated, truncated, info)
            if user_fn_result("step_fn", extra, "steps/<step metadata>") is not None:
                clash = sorted(set(extra) & set(out))
                if clash:
                    raise StepValueError(
                        "steps/<step metadata>",
                        f"step_fn returned keys {clash} that are also recorded from info_keys",
                    )
                out.update(extra)
        return out

    def episode_metadata(
        self,
        slot: Any,
        obs: Any,
        action: Any,
        reward: Any,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
    ) -> None:
        if self.episode_fn is None:
            return
        meta = self.episode_fn(obs, action, reward, terminated, truncated, info)
        if user_fn_result("episode_fn", meta, "<episode metadata>") is None:
            return
        self.recorder.set_episode_metadata(slot, meta)

    def begin(self, slot: Any, obs: Any, info: Mapping[str, Any]) -> None:
        self.recorder.begin(
            slot, self.convert_obs(obs), self.step_metadata(obs, None, None, False, False, info, 0)
        )
        self.episode_metadata(slot, obs, None, None, False, False, info)

    def add(
        self,
        slot: Any,
        step_index: int,
        action: Any,
        obs: Any,
        reward: Any,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
    ) -> None:
        stored_reward = float(reward) if self.default_reward else reward
        discount = (0.0 if terminated else 1.0) if self.discount else None
        try:
            self.recorder.add(
                slot,
                self.convert_action(action),
                stored_reward,
                discount,
                self.convert_obs(obs),
                self.step_metadata(obs, action, reward, terminated, truncated, info, step_index),
            )
            self.episode_metadata(slot, obs, action, reward, terminated, truncated, info)
        except StepValueError as e:
            # The env has moved on: never record the next step after a missing one.
            raise self.recorder.cut_short(slot, e) from e
        if terminated or truncated:
            self.recorder.end(slot, terminated=bool(terminated))

    def step_adder(self, slot: Any) -> Callable[[int, Any, Any, Any, bool, bool, Any], None]:
        """`add` bound to the episode just begun in `slot`, for a per-step loop.

        Valid until that episode ends (the env's `terminated`/`truncated`, a
        refused value, the next `begin`). Without step or episode metadata it
        calls the episode buffer's own `add` (`Recorder.step_adder`): three
        calls a step fewer than `add`.
        """
        if self.has_step_metadata or self.episode_fn is not None:
            return functools.partial(self.add, slot)
        recorder = self.recorder
        add = recorder.step_adder(slot)
        convert_action, convert_obs = self.convert_action, self.convert_obs
        default_reward, discount = self.default_reward, self.discount
        end, cut_short = recorder.end, recorder.cut_short

        def step(
            step_index: int,
            action: Any,
            obs: Any,
            reward: Any,
            terminated: bool,
            truncated: bool,
            info: Any,
        ) -> None:
            try:
                add(
                    convert_action(action),
                    float(reward) if default_reward else reward,
                    (0.0 if terminated else 1.0) if discount else None,
                    convert_obs(obs),
                    None,
                )
            except StepValueError as e:
                # The env has moved on: never record the next step after a missing one.
                raise cut_short(slot, e) from e
            if terminated or truncated:
                end(slot, terminated=bool(terminated))

        return step

    def step_kernel(
        self,
        slot: Any,
        env_step: Callable[[Any], Any],
        after: Callable[[Any, Any], Any],
    ) -> Callable[[Any], Any] | None:
        """The C step for the episode just begun in `slot` (`record.step_kernel`), or None.

        Only where a step stores exactly what the env gives: no step or
        episode metadata, observations passed through, actions passed
        through or cast only when their dtype differs from the column's
        (which the C step then leaves to `after`), a float reward taken as
        it is. The C step takes a step whose result is a 5-tuple with
        `terminated` and `truncated` both `False`; `after(action, result)`
        records every other.
        """
        if not self._may_take_c_step:
            return None  # before `step_adder`, which makes a partial per reset here
        return self._kernel_for(self.recorder.step_adder(slot), env_step, after)

    def prepare_step_kernels(
        self, env_step: Callable[[Any], Any], after: Callable[[Any, Any], Any]
    ) -> None:
        """Makes the C steps of the episodes to come now, not at their first reset.

        For the buffers the recorder has made ahead (`Recorder.prepared_adders`):
        the first reset then does not pay the C step's load (~0.3 ms).
        """
        if self._may_take_c_step:
            for add in self.recorder.prepared_adders():
                self._kernel_for(add, env_step, after)

    @property
    def _may_take_c_step(self) -> bool:
        """No step or episode metadata: what the C step never records."""
        return not self.has_step_metadata and self.episode_fn is None

    def _kernel_for(
        self, add: Any, env_step: Callable[[Any], Any], after: Callable[[Any, Any], Any]
    ) -> Callable[[Any], Any] | None:
        key = (add, env_step, after)  # the recorder reuses its buffers, and so their steps
        if key in self._kernels:
            return self._kernels[key]
        kernel = self._new_kernel(add, env_step, after)
        if len(self._kernels) >= 8:
            self._kernels.clear()
        self._kernels[key] = kernel
        return kernel

    def _new_kernel(
        self, add: Any, env_step: Callable[[Any], Any], after: Callable[[Any, Any], Any]
    ) -> Callable[[Any], Any] | None:
        if not step_kernel.available() or not spaces_lib.passes_through(self.convert_obs):
            return None
        body = getattr(add, "step_body", None)
        if body is None or body.kernel_leaves is None:
            return None
        action, reward, discount, observation = body.kernel_leaves
        if not spaces_lib.passes_through(self.convert_action):
            # The cast leaves an array of the space's dtype alone: the C step may
            # take it only when that is the column's dtype too.
            if action[0] != "array" or action[4] != getattr(self.convert_action, "dtype", None):
                return None
        if self.default_reward and reward[0] == "scalar":
            # float(reward) is the reward itself only for a float: others go to `after`.
            if float not in (reward[2] or ()):
                return None
            reward = ("scalar", reward[1], frozenset({float}), True, *reward[4:])
        elif self.default_reward and reward[0] not in ("none", "float"):
            # A packed float column takes only what float() leaves as it is (a
            # float, np.float32/64, an int it holds exactly): the same bytes.
            return None
        return step_kernel.step_kernel(
            env_step,
            (tuple, 5),  # (obs, reward, terminated, truncated, info)
            ((2, False), (3, False)),
            (1, (1.0 if self.discount else None,), 0),  # reward, discount, observation
            after,
            add.buffer,
            (action, reward, discount, observation),
        )


# The recording options of `OPTIONS_DOC` and their defaults; the rest of a
# wrapper's keyword arguments go to the writer.
OPTIONS: Mapping[str, Any] = {
    "name": "rlds_dataset",
    "ds_config": None,
    "info_keys": (),
    "info_defaults": None,
    "step_fn": None,
    "episode_fn": None,
    "step_metadata_info": None,
    "episode_metadata_info": None,
    "discount": False,
    "observation_info": None,
    "action_info": None,
    "reward_info": None,
    "image_encoding": spaces_lib.DEFAULT_IMAGE_ENCODING,
    "jpeg_quality": spaces_lib.DEFAULT_JPEG_QUALITY,
    "split": "train",
    "metadata": None,
}


def take_options(kwargs: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`defaults` with the values given in `kwargs`, popped from it (the rest: the writer's)."""
    options = dict(defaults)
    for key in list(kwargs):
        if key in options:
            options[key] = kwargs.pop(key)
    return options


def new_recording(
    observation_space: Any, action_space: Any, data_directory: Any, kwargs: dict[str, Any]
) -> Recording:
    options = take_options(kwargs, OPTIONS)
    return Recording(
        observation_space, action_space, data_directory, writer_kwargs=kwargs, **options
    )


OPTIONS_DOC = """
    Args:
      env: the environment to record.
      data_directory: the dataset directory (a local path, or an fsspec URL
        such as `gs://...`).
      name: the dataset name (used in shard file names).
      ds_config: a full `DatasetConfig`; if given, nothing is inferred and the
        other feature arguments are ignored.
      info_keys: `info` keys to record as step metadata.
      info_defaults: key -> value stored when an `info_keys` key is missing.
      step_fn: `step_fn(obs, action, reward, terminated, truncated, info)`
        returning a dict of step metadata (at reset: `action=None`,
        `reward=None`).
      episode_fn: same arguments; the last non-None dict it returns in an
        episode is that episode's metadata.
      step_metadata_info: declared step metadata features (others inferred).
      episode_metadata_info: declared episode metadata features.
      discount: write a `discount` column (1.0, 0.0 on termination).
      observation_info: feature replacing the one inferred from the space.
      action_info: feature replacing the one inferred from the space.
      reward_info: reward feature (default float32 scalar).
      image_encoding: how images are stored: `png` (default: lossless
        `tfds.features.Image`), `jpeg` (lossy `Image`), `bytes`, `zlib` or
        `none` (`Tensor` encodings); see `record.spaces.image_feature`.
      jpeg_quality: JPEG quality 1..100 (default 95, TensorFlow's).
      split: the split episodes go to.
      metadata: dataset-level metadata (`metadata.json`).
      **writer_kwargs: `DatasetWriter` arguments: `mode` (`error`, `append`,
        `overwrite`), `max_episodes_per_file`, `file_format`, `version`,
        `fsync`, `queue_size`, `commit_interval`.
"""


def env_id(env: Any) -> dict[str, Any]:
    """The Gymnasium id and spec of a registered env (for `metadata.json`), if it has one.

    `env_spec` is `EnvSpec.to_json()` text (id, entry point, kwargs, time
    limit, wrappers), what Minari keeps for `recover_environment()`; left out
    when the spec does not serialise (a callable entry point or argument).
    Exports read it as data and never make the env.
    """
    spec = getattr(env, "spec", None)
    if spec is None or not getattr(spec, "id", None):
        return {}
    try:
        return {"env_id": spec.id, "env_spec": spec.to_json()}
    except (TypeError, ValueError, AttributeError):
        return {"env_id": spec.id}
