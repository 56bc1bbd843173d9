"""The opt-in joint layout of `RecordRLDSParallel`: one RLDS episode per env episode.

`RecordRLDSParallel(env, directory, layout="joint")` writes one dataset in
`directory`; each env episode is one RLDS episode and each env step one RLDS
step whose fields are dicts keyed by agent id (every id in
`env.possible_agents`, so the feature spec is fixed; agents may have
different spaces):

* `observation[a]`: what the env returned to `a` (zeros from `a`'s space when
  it returned nothing: before `a` joined, after it left);
* `action[a]`: `a`'s action at this step (zeros when `a` did not act);
* `reward[a]`: the reward the env returned for `a` at this step (0 if none);
* `acted[a]`: `a` was live (in `env.agents`) and was given an action;
* `alive[a]`: `a` is in `env.agents` at this step's observation (it acts next);
* `terminated[a]` / `truncated[a]`: this step holds `a`'s last observation
  and the env reported it terminated / truncated (True on that step only);
* `state` (with `record_state=True`): `env.state()` at this step's
  observation.

RLDS alignment is that of every other recorder: the final step holds the
last observations with zero actions and rewards and `acted` all False.
`is_terminal` is set when every agent that took part terminated (none
truncated). Episode metadata: `env_episode_id`, `env_episode_index` (as in
the per-agent layout), `agents` (the ids that took part, comma-separated, in
`possible_agents` order) and `seed` (the reset seed, -1 when none was given).

Because `acted` must sit on the step of the action it describes while the
recorder's step metadata arrives with the observation, each step is handed
to the `Recorder` one env step late (or at the episode's end).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_writer.errors import SpecError, StepValueError
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.record.gymnasium_recording import action_caster
from rlds_writer.record.recorder import Recorder
from rlds_writer.store.dataset import names
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.features import feature_defs, field_specs
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

LAYOUTS = ("per_agent", "joint")
MASKS = ("acted", "alive", "terminated", "truncated")
# Options of the per-agent layout the joint layout does not offer (yet).
_UNSUPPORTED = (
    "agent_group",
    "info_keys",
    "info_defaults",
    "step_fn",
    "episode_fn",
    "step_metadata_info",
    "episode_metadata_info",
    "ds_config",
    "discount",
    "observation_info",
    "action_info",
    "reward_info",
)
_SLOT = 0


def check_layout(layout: Any) -> str:
    """Returns `layout` if it is one of `LAYOUTS`, else raises a one-line `SpecError`."""
    if layout not in LAYOUTS:
        raise SpecError(
            f"layout: expected 'per_agent' (one episode per agent, the default) or 'joint' "
            f"(one episode per env episode, dicts keyed by agent), got {layout!r}"
        )
    return layout


def _has_state(env: Any) -> bool:
    return callable(getattr(env, "state", None)) and getattr(env, "state_space", None) is not None


class JointRecording:
    """One dataset; one `Recorder` slot holds the env episode in progress.

    Args:
      env: the PettingZoo `ParallelEnv`.
      data_directory: the dataset directory.
      record_state: also record `env.state()` as the step field `state`.
      options: `name`, `image_encoding`, `jpeg_quality`, `split`, `metadata`
        and `DatasetWriter` arguments (`mode`, ...).
    """

    def __init__(
        self,
        env: Any,
        data_directory: epath.PathLike,
        record_state: bool,
        options: dict[str, Any],
    ):
        import gymnasium

        given = sorted(k for k in _UNSUPPORTED if options.get(k) not in (None, False, ()))
        if given:
            raise NotImplementedError(
                f"layout='joint' does not support {', '.join(given)} (the joint layout records "
                "observation, action, reward, the per-agent masks and optionally state); drop "
                "them or use layout='per_agent'"
            )
        for key in _UNSUPPORTED:
            options.pop(key, None)
        if not isinstance(record_state, bool):
            raise SpecError(f"record_state: expected True or False, got {record_state!r}")
        if record_state and not _has_state(env):
            raise SpecError(
                f"record_state=True: {type(env.unwrapped).__name__} has no state() and "
                "state_space (PettingZoo's global state); pass record_state=False"
            )
        self.env = env
        self.agents = list(env.possible_agents)
        self.keys = [str(a) for a in self.agents]
        for key in self.keys:
            # Field names become file names when exported (LeRobot videos, ...).
            names.check_name(
                key,
                "agent id",
                where="possible_agents",
                fix="the joint layout names fields by str(agent_id); rename the agent",
            )
        if len(set(self.keys)) != len(self.keys):
            raise SpecError(
                f"possible_agents: the joint layout keys fields by str(agent_id), which must be "
                f"distinct; got {self.keys}"
            )
        obs_spaces = {k: env.observation_space(a) for k, a in zip(self.keys, self.agents)}
        act_spaces = {k: env.action_space(a) for k, a in zip(self.keys, self.agents)}
        self.convert_obs = {k: spaces_lib.space_converter(s) for k, s in obs_spaces.items()}
        self.convert_action = {k: action_caster(s) for k, s in act_spaces.items()}
        self.record_state = record_state
        image_encoding = options.pop("image_encoding", spaces_lib.DEFAULT_IMAGE_ENCODING)
        jpeg_quality = options.pop("jpeg_quality", spaces_lib.DEFAULT_JPEG_QUALITY)
        name = options.pop("name", "rlds_dataset")
        flag = {k: feature_defs.Scalar(np.bool_) for k in self.keys}
        step_info: dict[str, Any] = {m: dict(flag) for m in MASKS}
        if record_state:
            step_info["state"] = spaces_lib.space_def(
                env.state_space, "state", image_encoding, jpeg_quality
            )
        episode_info = {
            "env_episode_id": feature_defs.Text(),
            "env_episode_index": feature_defs.Scalar(np.int64),
            "agents": feature_defs.Text(),
            "seed": feature_defs.Scalar(np.int64),
        }

        def make_config(step_info: dict, episode_info: dict) -> Any:
            return spaces_lib.spaces_config(
                gymnasium.spaces.Dict(obs_spaces),
                gymnasium.spaces.Dict(act_spaces),
                name,
                reward_info={k: spaces_lib.reward_feature() for k in self.keys},
                step_metadata_info=step_info,
                episode_metadata_info=episode_info,
                image_encoding=image_encoding,
                jpeg_quality=jpeg_quality,
            )

        metadata = {
            "source": "rlds_writer.record.pettingzoo_joint",
            "layout": "joint",
            "env": str(env.metadata.get("name", type(env.unwrapped).__name__)),
            "agents": ",".join(self.keys),
            **dict(options.pop("metadata", None) or {}),
        }
        self.recorder = Recorder(
            data_directory,
            make_config,
            step_metadata_info=step_info,
            episode_metadata_info=episode_info,
            infer=False,
            image_encoding=image_encoding,
            jpeg_quality=jpeg_quality,
            metadata=metadata,
            **options,
        )
        self.directory = as_path(data_directory)
        steps = self.recorder.writer.features[field_specs.STEPS].feature
        self.zero_obs = {k: field_specs.zero_value(steps["observation"][k]) for k in self.keys}
        self.zero_action = {k: field_specs.zero_value(steps["action"][k]) for k in self.keys}
        self.run_id = uuid.uuid4().hex[:12]
        self.env_episode_index = -1
        self._seed = -1
        # The step waiting for its action: (observation, step metadata) or None.
        self._waiting: tuple[dict, dict] | None = None
        self._last: tuple[dict, dict] | None = None  # previous step's (action, reward)
        self._took_part: set[str] = set()
        self._ended: dict[str, bool] = {}  # agent -> terminated (else truncated)

    # ----------------------------------------------------------------- env calls

    def reset(self, obs: Mapping[Any, Any], seed: int | None) -> None:
        """Ends an open episode (cut short) and waits for the first action."""
        self.end_open()
        self.env_episode_index += 1
        self._seed = -1 if seed is None else int(seed)
        self._took_part.clear()
        self._ended.clear()
        self._waiting = (self._observation(obs), self._masks(obs, {}, set()))

    def step(
        self,
        live: list[Any],
        actions: Mapping[Any, Any],
        obs: Mapping[Any, Any],
        rewards: Mapping[Any, Any],
        terminations: Mapping[Any, Any],
        truncations: Mapping[Any, Any],
    ) -> None:
        """Records one env step; `live` is `env.agents` before it."""
        if self._waiting is None:
            return  # no episode (reset not called through the wrapper, or cut by a bad value)
        acted = {str(a) for a in actions if a in live}
        action = {
            k: self.convert_action[k](actions[a]) if k in acted else self.zero_action[k]
            for k, a in zip(self.keys, self.agents)
        }
        reward = {k: float(rewards.get(a, 0.0)) for k, a in zip(self.keys, self.agents)}
        self._emit({k: k in acted for k in self.keys})
        self._last = (action, reward)
        ended = set()
        for a in live:
            if terminations.get(a) or truncations.get(a):
                ended.add(str(a))
                self._ended[str(a)] = bool(terminations.get(a))
        self._waiting = (
            self._observation(obs),
            self._masks(obs, {k: k in ended and self._ended[k] for k in self.keys}, ended),
        )
        if not self.env.agents:  # the env episode is over
            self._emit(dict.fromkeys(self.keys, False))
            terminated = bool(self._took_part) and all(
                self._ended.get(k, False) for k in self._took_part
            )
            self._waiting = self._last = None
            self._set_episode_metadata()
            self.recorder.end(_SLOT, terminated=terminated)

    def end_open(self) -> None:
        """Writes an episode left open (at reset or close) cut short."""
        if self._waiting is None:
            return
        self._emit(dict.fromkeys(self.keys, False))
        self._waiting = self._last = None
        if self.recorder.in_episode(_SLOT):
            self._set_episode_metadata()
            self.recorder.end(_SLOT, terminated=False, cut_short=True)

    # ------------------------------------------------------------------ helpers

    def _observation(self, obs: Mapping[Any, Any]) -> dict[str, Any]:
        return {
            k: self.convert_obs[k](obs[a]) if a in obs else self.zero_obs[k]
            for k, a in zip(self.keys, self.agents)
        }

    def _masks(
        self, obs: Mapping[Any, Any], terminated: Mapping[str, bool], ended: set[str]
    ) -> dict[str, Any]:
        live = {str(a) for a in self.env.agents}
        self._took_part |= live
        masks = {
            "alive": {k: k in live for k in self.keys},
            "terminated": {k: terminated.get(k, False) for k in self.keys},
            "truncated": {k: k in ended and not terminated.get(k, False) for k in self.keys},
        }
        if self.record_state:
            masks["state"] = np.array(self.env.state(), copy=True)
        return masks

    def _emit(self, acted: dict[str, bool]) -> None:
        """Hands the waiting step, now that its action is known, to the recorder."""
        observation, meta = self._waiting
        meta = {**meta, "acted": acted}
        try:
            if self._last is None:
                self.recorder.begin(_SLOT, observation, meta)
                self._set_episode_metadata()
            else:
                action, reward = self._last
                self.recorder.add(_SLOT, action, reward, None, observation, meta)
        except StepValueError as e:
            self._waiting = self._last = None  # the env has moved on: resume at reset
            raise self.recorder.cut_short(_SLOT, e) from e

    def _set_episode_metadata(self) -> None:
        self.recorder.set_episode_metadata(
            _SLOT,
            {
                "env_episode_id": f"{self.run_id}-{self.env_episode_index:06d}",
                "env_episode_index": self.env_episode_index,
                "agents": ",".join(k for k in self.keys if k in self._took_part),
                "seed": self._seed,
            },
        )

    # ----------------------------------------------------------- wrapper API

    @property
    def recorders(self) -> dict[str, Recorder]:
        return {"joint": self.recorder}

    @property
    def directories(self) -> dict[str, epath.Path]:
        return {"joint": self.directory}

    def flush(self) -> None:
        self.recorder.flush()

    @interrupts.held
    def close(self) -> None:
        try:
            self.end_open()
        finally:
            self.recorder.close()
