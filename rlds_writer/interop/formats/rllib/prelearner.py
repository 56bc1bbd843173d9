"""RLlib's pre-learner for transition rows: one `SingleAgentEpisode` per run of an episode.

RLlib's `OfflinePreLearner` maps its column schema (one row per transition)
to episodes one row at a time: a batch of 1024 transitions becomes 1024
one-step `SingleAgentEpisode`s, and the learner connector then walks 1024
episodes. That, not the read, bounds the transitions per second reaching
the learner. The rows `RLDSOfflineData` reads come in episode order (a read
task holds whole episodes), so `RLDSPreLearner` cuts a batch where the
episode or the step count changes and builds one episode per run, sliced
from the columns: a few episodes per batch, the same transitions, each once.

The learner gets what it gets from RLlib's own episode input and online
sampling: runs that end their episode carry its `terminated`/`truncated`;
a run cut by the batch's edge is a fragment still going on (bootstrapped
from its last next observation by connectors that bootstrap, as MARWIL's
`AddOneTsToEpisodesAndTruncate` does for sampled fragments). So BC's batch
holds the same rows as RLlib's per-row mapping; MARWIL's advantages are
computed along each run instead of over one-step episodes.

Batches it cannot map by columns go to RLlib's per-row mapping unchanged:
multi-agent configs, packed (compressed) or object columns,
`ignore_final_observation`, rows without episode ids or steps, columns
beyond the transition's (infos, extra model outputs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_writer.errors import optional_dependencies

with optional_dependencies("rlds_writer.interop.formats.rllib.prelearner (RLlib offline training)"):
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.offline.offline_prelearner import SCHEMA, OfflinePreLearner

__all__ = ["RLDSPreLearner", "episode_runs"]

_REQUIRED = (
    Columns.EPS_ID,
    Columns.T,
    Columns.OBS,
    Columns.NEXT_OBS,
    Columns.ACTIONS,
    Columns.REWARDS,
    Columns.TERMINATEDS,
    Columns.TRUNCATEDS,
)


def episode_runs(episode_ids: Any, steps: Any) -> tuple[np.ndarray, np.ndarray]:
    """Where runs of consecutive steps of one episode start and end (exclusive) in a batch.

    Args:
      episode_ids: the rows' episode ids.
      steps: the rows' steps within their episode.

    Returns:
      `(starts, ends)`, index arrays: row `i` of run `k` is `starts[k] <= i < ends[k]`.
    """
    ids = np.asarray(episode_ids)
    steps = np.asarray(steps)
    if len(ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cuts = np.flatnonzero((ids[1:] != ids[:-1]) | (steps[1:] != steps[:-1] + 1)) + 1
    return np.concatenate([[0], cuts]), np.concatenate([cuts, [len(ids)]])


class RLDSPreLearner(OfflinePreLearner):
    """An `OfflinePreLearner` that maps transition rows to one episode per run (module doc).

    `RLDSOfflineData` uses it unless `config.offline_data(prelearner_class=...)`
    names another; subclass it as RLlib's docs subclass `OfflinePreLearner`.
    """

    def _map_to_episodes(self, batch: dict[str, Any], to_numpy: bool = False, **kwargs: Any):
        names = SCHEMA | dict(self.config.input_read_schema or {})
        columns = {name: names[name] for name in _REQUIRED}
        if (
            kwargs
            or self.config.is_multi_agent
            or self.config.ignore_final_observation
            or set(batch) != set(columns.values())
            # Packed (compressed) values or objects: RLlib unpacks them row by row.
            or any(np.asarray(batch[name]).dtype.kind in "OSUV" for name in columns.values())
        ):
            return super()._map_to_episodes(batch, to_numpy=to_numpy, **kwargs)
        ids = np.asarray(batch[columns[Columns.EPS_ID]])
        starts, ends = episode_runs(ids, batch[columns[Columns.T]])
        obs = np.asarray(batch[columns[Columns.OBS]])
        next_obs = np.asarray(batch[columns[Columns.NEXT_OBS]])
        actions = np.asarray(batch[columns[Columns.ACTIONS]])
        rewards = np.asarray(batch[columns[Columns.REWARDS]])
        terminated = np.asarray(batch[columns[Columns.TERMINATEDS]])
        truncated = np.asarray(batch[columns[Columns.TRUNCATEDS]])
        episodes = []
        for start, end in zip(starts.tolist(), ends.tolist()):
            # A run's observations: each row's, then the last row's next one.
            observations = list(obs[start:end]) + [next_obs[end - 1]]
            episode = SingleAgentEpisode(
                id_=str(ids[start]),
                observations=observations,
                infos=[{}] * len(observations),
                actions=list(actions[start:end]),
                rewards=list(rewards[start:end]),
                terminated=bool(terminated[end - 1]),
                truncated=bool(truncated[end - 1]),
                len_lookback_buffer=0,
            )
            if to_numpy:
                episode.to_numpy()
            episodes.append(episode)
        return {"episodes": episodes}
