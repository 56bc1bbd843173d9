"""PettingZoo wrappers that record every agent's episodes as RLDS.

* `RecordRLDSParallel` wraps a `pettingzoo.ParallelEnv` (simultaneous moves).
* `RecordRLDSAEC` wraps a `pettingzoo.AECEnv` (agents act in turn).

Layout (one RLDS episode per agent per env episode): each agent's episode
holds exactly the observations that agent received, the action it took after
each one and the reward it got for it; `is_first`/`is_last`/`is_terminal`
are that agent's (`is_terminal` from its own `terminated`). An agent that
joins late starts its episode at its first observation; one that leaves
early ends it at its last. Episode metadata names the env episode
(`env_episode_id`, shared by every agent of one env episode, and
`env_episode_index`, counting resets of this wrapper) and the `agent_id`, so
the agents of one env episode can be regrouped.

Agents are grouped (`agent_group(agent_id) -> str`; default: the id without
a trailing `_<number>`, so `adversary_0` -> `adversary`), every group must
share one observation and one action space, and each group is one dataset in
`<data_directory>/<group>`.

`RecordRLDSParallel(..., layout="joint")` writes one RLDS episode per env
episode instead, with dict fields keyed by agent (`record/pettingzoo/pettingzoo_joint.py`).

Turn-based (AEC) envs: an agent's step t is the observation it saw at its
t-th turn, its action then, and the reward accumulated until its next turn
(what `env.last()` reports to it, PettingZoo's `_cumulative_rewards`). An
agent's last step is the turn on which `last()` reports it terminated or
truncated. An episode left open at `reset()` or `close()` is written cut
short (an action still waiting for its next observation is dropped).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper

from rlds_writer.errors import SpecError
from rlds_writer.record.gymnasium_recording import Recording, new_recording
from rlds_writer.record.pettingzoo.pettingzoo_joint import JointRecording, check_layout
from rlds_writer.record.recorder import Recorder
from rlds_writer.store.dataset import names
from rlds_writer.store.episodes import interrupts
from rlds_writer.store.features import feature_defs
from rlds_writer.store.storage.object_path import as_path

if TYPE_CHECKING:
    from etils import epath

_SUFFIX = re.compile(r"_\d+$")


def default_agent_group(agent_id: Any) -> str:
    """`adversary_0` -> `adversary`; ids without a `_<number>` suffix are their own group."""
    return _SUFFIX.sub("", str(agent_id)) or str(agent_id)


def _episode_metadata_info() -> dict[str, Any]:
    return {
        "env_episode_id": feature_defs.Text(),
        "env_episode_index": feature_defs.Scalar(np.int64),
        "agent_id": feature_defs.Text(),
    }


class _MultiAgentRecording:
    """One `Recording` (dataset) per agent group; slots are agent ids."""

    def __init__(
        self,
        env: Any,
        data_directory: epath.PathLike,
        agent_group: Callable[[Any], str] | None,
        kwargs: dict[str, Any],
    ):
        for key in ("episode_fn", "episode_metadata_info", "ds_config"):
            if kwargs.get(key) is not None:
                raise TypeError(
                    f"{key} is not supported by the PettingZoo recorders: their episode "
                    "metadata is env_episode_id, env_episode_index and agent_id"
                )
        group_of = agent_group or default_agent_group
        root = as_path(data_directory)
        members: dict[str, list[Any]] = {}
        for agent in env.possible_agents:
            group = str(group_of(agent))
            # The group names the agent's dataset directory under data_directory.
            names.check_name(
                group,
                "agent group" if group != str(agent) else "agent id",
                where=f"agent {agent!r}" if group != str(agent) else "",
                fix=f"it names the dataset directory <data_directory>/{group}; pass "
                "agent_group= mapping each agent to such a name",
            )
            members.setdefault(group, []).append(agent)
        self.group_of: dict[Any, str] = {}
        self.groups: dict[str, Recording] = {}
        self.directories: dict[str, epath.Path] = {}
        user_metadata = dict(kwargs.pop("metadata", None) or {})
        for group, agents in members.items():
            first = agents[0]
            obs_space, act_space = env.observation_space(first), env.action_space(first)
            for other in agents[1:]:
                if env.observation_space(other) != obs_space or (
                    env.action_space(other) != act_space
                ):
                    raise ValueError(
                        f"agents {first!r} and {other!r} are both in group {group!r} but "
                        f"their spaces differ (observation {obs_space} vs "
                        f"{env.observation_space(other)}, action {act_space} vs "
                        f"{env.action_space(other)}); pass agent_group= mapping agents with "
                        "different spaces to different groups"
                    )
            metadata = {
                "source": "rlds_writer.record.pettingzoo",
                "env": str(env.metadata.get("name", type(env.unwrapped).__name__)),
                "agent_group": group,
                "agents": ",".join(map(str, agents)),
                **user_metadata,
            }
            options = {
                **kwargs,
                "metadata": metadata,
                "episode_metadata_info": _episode_metadata_info(),
            }
            directory = root / group
            self.groups[group] = new_recording(obs_space, act_space, directory, options)
            self.directories[group] = directory
            for agent in agents:
                self.group_of[agent] = group
        self.run_id = uuid.uuid4().hex[:12]
        self.env_episode_index = -1
        self.step_index: dict[Any, int] = {}

    def recording(self, agent: Any) -> Recording:
        group = self.group_of.get(agent)
        if group is None:
            raise ValueError(
                f"agent {agent!r} is not in the env's possible_agents "
                f"{sorted(map(str, self.group_of))}; the recorder needs every agent's "
                "spaces up front"
            )
        return self.groups[group]

    @property
    def recorders(self) -> dict[str, Recorder]:
        return {g: r.recorder for g, r in self.groups.items()}

    def in_episode(self, agent: Any) -> bool:
        return self.recording(agent).recorder.in_episode(agent)

    def new_env_episode(self) -> None:
        self.end_open()
        self.env_episode_index += 1

    def begin(self, agent: Any, obs: Any, info: Mapping[str, Any]) -> None:
        recording = self.recording(agent)
        recording.begin(agent, obs, info)
        recording.recorder.set_episode_metadata(
            agent,
            {
                "env_episode_id": f"{self.run_id}-{self.env_episode_index:06d}",
                "env_episode_index": self.env_episode_index,
                "agent_id": str(agent),
            },
        )
        self.step_index[agent] = 0

    def add(
        self,
        agent: Any,
        action: Any,
        obs: Any,
        reward: Any,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
    ) -> None:
        self.step_index[agent] += 1
        self.recording(agent).add(
            agent, self.step_index[agent], action, obs, reward, terminated, truncated, info
        )

    def end_open(self) -> None:
        for agent, group in self.group_of.items():
            writer = self.groups[group].recorder
            if writer.in_episode(agent):
                writer.end(agent, terminated=False, cut_short=True)

    def flush(self) -> None:
        for recording in self.groups.values():
            recording.recorder.flush()

    @interrupts.held
    def close(self) -> None:
        errors = []
        for recording in self.groups.values():
            try:
                recording.recorder.close()
            except Exception as e:  # close every group before reporting
                errors.append(e)
        if errors:
            raise errors[0]


_OPTIONS_DOC = """
    Args:
      env: the PettingZoo environment to record.
      data_directory: the root directory; group `g`'s dataset is
        `<data_directory>/g`.
      agent_group: `agent_group(agent_id) -> str`, the dataset of each agent
        (default `default_agent_group`: the id without `_<number>`). Agents of
        one group must share their observation and action spaces.
      **options: as for `RecordRLDS` (`name`, `info_keys`, `info_defaults`,
        `step_fn`, `step_metadata_info`, `discount`, `observation_info`,
        `action_info`, `reward_info`, `image_encoding`, `split`, `metadata`,
        and `DatasetWriter` arguments such as `mode`), applied to every
        group's dataset; `info_keys` are read from each agent's own `info`.
        `episode_fn`, `episode_metadata_info` and `ds_config` are not
        supported.
"""


class RecordingWrapper:
    """What both PettingZoo wrappers offer over their `_MultiAgentRecording` (`_rec`)."""

    _rec: _MultiAgentRecording | JointRecording
    _closed: bool
    env: Any

    @property
    def recorders(self) -> dict[str, Recorder]:
        """Group name (`"joint"` for the joint layout) -> its `Recorder` (counters)."""
        return self._rec.recorders

    @property
    def directories(self) -> dict[str, epath.Path]:
        """Group name (`"joint"` for the joint layout) -> its dataset directory."""
        return dict(self._rec.directories)

    def flush(self) -> None:
        """Blocks until every finished agent episode is on disk."""
        self._rec.flush()

    @interrupts.held
    def close(self) -> None:
        """Writes open agent episodes (cut short), closes the datasets, then the env."""
        if self._closed:
            return
        self._closed = True
        try:
            self._rec.close()
        finally:
            self.env.close()


_PARALLEL_DOC = """      layout: `"per_agent"` (default: one episode per agent, one dataset per
        group) or `"joint"` (one episode per env episode in one dataset at
        `data_directory`, fields keyed by agent; see
        `rlds_writer.record.pettingzoo.pettingzoo_joint`).
      record_state: with `layout="joint"`, also record `env.state()` as the
        step field `state` (the env needs `state()` and `state_space`).
"""


class RecordRLDSParallel(RecordingWrapper, BaseParallelWrapper):
    __doc__ = (
        "Records each agent's episodes of a PettingZoo ParallelEnv as RLDS.\n"
        + _OPTIONS_DOC
        + _PARALLEL_DOC
    )

    def __init__(
        self,
        env: Any,
        data_directory: epath.PathLike,
        *,
        agent_group: Callable[[Any], str] | None = None,
        layout: str = "per_agent",
        record_state: bool = False,
        **options: Any,
    ):
        super().__init__(env)
        if check_layout(layout) == "joint":
            options["agent_group"] = agent_group
            self._rec = JointRecording(env, data_directory, record_state, options)
        elif record_state:
            raise SpecError(
                "record_state=True needs layout='joint' (per-agent episodes have no global "
                "state field)"
            )
        else:
            self._rec = _MultiAgentRecording(env, data_directory, agent_group, options)
        self._closed = False

    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[Any, Any], dict[Any, Any]]:
        obs, infos = self.env.reset(seed=seed, options=options)
        if isinstance(self._rec, JointRecording):
            self._rec.reset(obs, seed)
            return obs, infos
        self._rec.new_env_episode()
        for agent, agent_obs in obs.items():
            self._rec.begin(agent, agent_obs, infos.get(agent, {}))
        return obs, infos

    def step(self, actions: dict[Any, Any]) -> tuple[dict, dict, dict, dict, dict]:
        live = list(self.env.agents)
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        rec = self._rec
        if isinstance(rec, JointRecording):
            rec.step(live, actions, obs, rewards, terminations, truncations)
            return obs, rewards, terminations, truncations, infos
        for agent, action in actions.items():
            if not rec.in_episode(agent):
                continue  # an action for an agent that has no episode (already done)
            if agent not in obs:
                raise ValueError(
                    f"agent {agent!r} acted but the env returned no observation for it; "
                    "PettingZoo parallel envs return each acting agent's observation"
                )
            rec.add(
                agent,
                action,
                obs[agent],
                rewards.get(agent, 0.0),
                bool(terminations.get(agent, False)),
                bool(truncations.get(agent, False)),
                infos.get(agent, {}),
            )
        for agent, agent_obs in obs.items():
            done = terminations.get(agent, False) or truncations.get(agent, False)
            if agent not in actions and not rec.in_episode(agent) and not done:
                rec.begin(agent, agent_obs, infos.get(agent, {}))  # joined this step
        return obs, rewards, terminations, truncations, infos


class RecordRLDSAEC(RecordingWrapper, BaseWrapper):
    __doc__ = "Records each agent's episodes of a PettingZoo AECEnv as RLDS.\n" + _OPTIONS_DOC

    def __init__(
        self,
        env: Any,
        data_directory: epath.PathLike,
        *,
        agent_group: Callable[[Any], str] | None = None,
        layout: str = "per_agent",
        **options: Any,
    ):
        super().__init__(env)
        if check_layout(layout) == "joint":
            raise NotImplementedError(
                "RecordRLDSAEC has no layout='joint' (turn-based envs record one episode per "
                "agent: layout='per_agent'); for an env PettingZoo can run in parallel, record "
                "RecordRLDSParallel(pettingzoo.utils.aec_to_parallel(env), ..., layout='joint')"
            )
        self._rec = _MultiAgentRecording(env, data_directory, agent_group, options)
        self._pending: dict[Any, Any] = {}  # agent -> action awaiting its next turn
        self._done: set[Any] = set()  # agents whose episode ended in this env episode
        self._closed = False

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.env.reset(seed=seed, options=options)
        self._rec.new_env_episode()
        self._pending.clear()
        self._done.clear()

    def step(self, action: Any) -> None:
        env = self.env
        agent = env.agent_selection
        # What `env.last()` showed this agent for this turn.
        obs = env.observe(agent)
        reward = env._cumulative_rewards[agent]
        terminated = bool(env.terminations[agent])
        truncated = bool(env.truncations[agent])
        info = env.infos[agent]
        rec = self._rec
        done = terminated or truncated
        if agent in self._done:
            pass  # its episode is written; PettingZoo still gives it a turn
        elif not rec.in_episode(agent):
            rec.begin(agent, obs, info)  # its first turn
            if done:  # done at its first turn: a one-step episode
                rec.recording(agent).recorder.end(agent, terminated=terminated)
        elif agent in self._pending:
            rec.add(agent, self._pending.pop(agent), obs, reward, terminated, truncated, info)
        if done:
            self._done.add(agent)
        elif rec.in_episode(agent):
            self._pending[agent] = action
        env.step(action)
