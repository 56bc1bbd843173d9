"""Recording RLlib multi-agent episodes: one RLDS episode per agent, one dataset per module.

Layout under the output root (the same per-agent layout and metadata names
as the PettingZoo recorders, `record/pettingzoo/pettingzoo_wrappers.py`, with RLlib's module id
as the group):

    <root>/<module_id>/writer-00001/     one dataset per module and EnvRunner
    <root>/merged/<module_id>/           after the merge at `algo.stop()`

Every agent episode of an env episode becomes one RLDS episode of its
module's dataset, holding exactly what RLlib stored for that agent: the
observations it received, the action it took after each, the reward it got
and its own terminated/truncated flags. Episode metadata: `episode_id`
(RLlib's id of the agent's episode), `env_episode_id` (the env episode's id,
shared by its agents), `agent_id`, `module_id` and `worker_index`. The agent
episodes of an env episode are written when the env episode ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

from rlds_writer.errors import LockedError, UnsafePathError
from rlds_writer.record.rllib.rllib_chunks import ChunkWriter, extract, make_recorder
from rlds_writer.store.dataset import names
from rlds_writer.store.dataset.locking import DirectoryLock
from rlds_writer.store.repair.merge import writer_directory
from rlds_writer.store.storage.object_path import as_path

RESERVED = "merged"


def is_multi_agent(episode: Any) -> bool:
    """Whether `episode` is an RLlib `MultiAgentEpisode` (chunk)."""
    return hasattr(episode, "agent_episodes")


def module_runner_directories(output_root: epath.PathLike) -> dict[str, list[epath.Path]]:
    """Module id -> its runner dataset directories (`<root>/<module>/writer-*`), sorted."""
    root = as_path(output_root)
    if not root.exists():
        return {}
    out = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        if path.name.startswith("writer-") or not path.is_dir():
            continue
        runners = sorted(
            (p for p in path.iterdir() if p.name.startswith("writer-")), key=lambda p: p.name
        )
        runners = [p for p in runners if (p / "features.json").exists()]
        if runners:
            out[path.name] = runners
    return out


def check_module_id(module_id: Any) -> str:
    """The module id as a directory name; refuses ids that cannot be one (`store.dataset.names`)."""
    text = str(module_id)
    if not names.is_safe_name(text) or text == RESERVED or text.startswith("writer-"):
        raise UnsafePathError(
            f"module id {text!r} cannot name its dataset directory <output_root>/{text}: "
            f"expected {names.ALLOWED}, not '{RESERVED}' nor a 'writer-' prefix "
            "(rename the module in config.multi_agent(policies=...))"
        )
    return text


def extract_multi_agent(chunk: Any, model_outputs: Any) -> dict[Any, dict[str, Any]]:
    """Copies each agent's part of one `MultiAgentEpisode` chunk."""
    out = {}
    for agent_id, sa in chunk.agent_episodes.items():
        part = extract(sa, model_outputs)
        part.update(
            agent_episode_id=sa.id_,
            module_id=sa.module_id if sa.module_id is not None else chunk.module_for(agent_id),
            terminated=bool(sa.is_terminated),
            truncated=bool(sa.is_truncated),
            observation_space=sa.observation_space or _get(chunk.observation_space, agent_id),
            action_space=sa.action_space or _get(chunk.action_space, agent_id),
        )
        out[agent_id] = part
    return out


def _get(spaces: Any, agent_id: Any) -> Any:
    return spaces.get(agent_id) if isinstance(spaces, Mapping) else None


def agent_parts(chunks: list[dict[Any, dict[str, Any]]]) -> dict[Any, list[dict[str, Any]]]:
    """Each agent's parts, in chunk order, from the copies of an env episode's chunks.

    An agent is absent from the chunks before it joined and after it left,
    except one case: an agent done on the last step before a cut comes back
    in RLlib's next chunk as an empty episode starting at t=0 (`cut()` does
    not carry its clock over); that ghost is dropped. `ChunkWriter.write`
    checks that the parts join up.
    """
    out: dict[Any, list[dict[str, Any]]] = {}
    for chunk in chunks:
        for agent_id, part in chunk.items():
            earlier = out.get(agent_id)
            done = bool(earlier) and (earlier[-1]["terminated"] or earlier[-1]["truncated"])
            if done and not part["actions"]:
                continue
            out.setdefault(agent_id, []).append(part)
    return out


def free_writer_name(root: epath.Path, base: str) -> str:
    """`base`, or a numbered sibling name if a live writer holds that name in some module."""
    modules = [p for p in root.iterdir() if p.is_dir()] if root.exists() else []
    for attempt in range(100):
        name = base if attempt == 0 else f"{base}.{attempt}"
        if all(_unlocked(writer_directory(m, name)) for m in modules):
            return name
    raise RuntimeError(f"no free writer directory name for runner {base} under {root}")


def _unlocked(directory: epath.Path) -> bool:
    if not directory.exists():
        return True
    lock = DirectoryLock(directory)
    try:
        lock.acquire()
    except LockedError:
        return False
    lock.release()
    return True


class MultiAgentRecording:
    """One EnvRunner's multi-agent recording: a `ChunkWriter` per module, made on first use.

    Args:
      opts: the `RLDSRecorder` options.
      writer_name: this runner's writer name (`00001`, `eval-00000`, ...).
      worker_index: the runner's worker index (episode metadata).
      split: the split every episode is written to.
      root: where the module directories go (default: the output root; a
        staging directory when the runner ships its shards to the driver).
    """

    def __init__(
        self,
        opts: Mapping[str, Any],
        writer_name: str,
        worker_index: int,
        split: str,
        root: epath.PathLike | None = None,
    ):
        self._opts = opts
        self._root = as_path(root or opts["output_root"])
        self._name = writer_name
        self._worker_index = worker_index
        self.split = split
        self.writers: dict[str, ChunkWriter] = {}

    def _writer(self, module_id: Any, part: dict[str, Any], agent_id: Any) -> ChunkWriter:
        name = check_module_id(module_id)
        obs_space, act_space = part["observation_space"], part["action_space"]
        writer = self.writers.get(name)
        if writer is None:
            if obs_space is None or act_space is None:
                raise ValueError(
                    f"agent {agent_id!r}: RLlib's episode holds no observation/action space "
                    "for it; return it from your MultiAgentEnv's get_observation_space/"
                    "get_action_space"
                )
            directory = writer_directory(self._root / name, self._name)
            recorder = make_recorder(
                directory,
                obs_space,
                act_space,
                self._opts,
                self.split,
                _episode_metadata_info(),
                {
                    "source": "rlds_writer.record.rllib",
                    "worker_index": self._worker_index,
                    "module_id": name,
                },
            )
            writer = self.writers[name] = ChunkWriter(
                recorder, obs_space, act_space, self._opts, self.split, directory
            )
        elif obs_space != writer.obs_space or act_space != writer.act_space:
            raise ValueError(
                f"agent {agent_id!r} is mapped to module {name!r} but its spaces "
                f"(observation {obs_space}, action {act_space}) differ from the module's "
                f"dataset (observation {writer.obs_space}, action {writer.act_space}); map "
                "agents with different spaces to different modules in policy_mapping_fn"
            )
        return writer

    def write(self, env_episode_id: str, chunks: list[dict[Any, dict[str, Any]]]) -> int:
        """Writes every agent episode of one finished env episode; returns how many."""
        written = 0
        for agent_id, parts in agent_parts(chunks).items():
            if not any(p["actions"] for p in parts):
                continue  # RLlib drops an agent that never acted too
            last = parts[-1]
            writer = self._writer(parts[0]["module_id"], parts[0], agent_id)
            slot = str(parts[0]["agent_episode_id"])
            metadata = {
                "episode_id": slot,
                "env_episode_id": str(env_episode_id),
                "agent_id": str(agent_id),
                "module_id": str(parts[0]["module_id"]),
                "worker_index": self._worker_index,
            }
            fn_data = {**metadata, "id": slot}
            if writer.write(slot, parts, last["terminated"], last["truncated"], metadata, fn_data):
                written += 1
        return written

    def flush(self) -> None:
        for writer in self.writers.values():
            writer.flush()

    def datasets(self) -> dict[epath.Path, tuple[str, int]]:
        """Each module's directory -> (split, episodes finished), for `RunnerDelivery`."""
        return {k: v for w in self.writers.values() for k, v in w.datasets().items()}

    def close(self) -> None:
        errors = []
        for writer in self.writers.values():
            try:
                writer.close()
            except Exception as e:  # close every module's writer before reporting
                errors.append(e)
        if errors:
            raise errors[0]

    @property
    def unrecorded(self) -> list[str]:
        """Agent episodes RLlib finished that could not be written (`ChunkWriter`)."""
        return [slot for w in self.writers.values() for slot in w.unrecorded]

    @property
    def episodes_written(self) -> int:
        return sum(w.episodes_written for w in self.writers.values())

    @property
    def steps_written(self) -> int:
        return sum(w.steps_written for w in self.writers.values())

    @property
    def bytes_written(self) -> int:
        return sum(w.bytes_written for w in self.writers.values())


def _episode_metadata_info() -> dict[str, Any]:
    import tensorflow_datasets as tfds

    return {
        "episode_id": tfds.features.Text(),
        "env_episode_id": tfds.features.Text(),
        "agent_id": tfds.features.Text(),
        "module_id": tfds.features.Text(),
        "worker_index": tfds.features.Scalar(np.int64),
    }
