"""RLlib episode chunks -> one RLDS episode: the part shared by single- and multi-agent recording.

RLlib hands an episode to the learner in chunks (`SingleAgentEpisode`s, or a
`MultiAgentEpisode` holding one per agent). `extract` copies what is recorded
out of one single-agent chunk; `ChunkWriter.write` joins an episode's copies
(each chunk starts with its predecessor's last observation) and writes them
as one RLDS episode to a `Recorder`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

from rlds_writer.errors import StepValueError
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.record.recorder import ZERO, Recorder
from rlds_writer.record.values import user_fn_result

_log = logging.getLogger(__name__)

# Model outputs RLlib produces whose type is known up front (others are inferred).
KNOWN_OUTPUTS = {"action_logp": np.float32, "vf_preds": np.float32, "weights_seq_no": np.int64}


def items(chunk: Any, data: Any) -> list[Any]:
    """Per-timestep items of episode data (numpy'ized chunks hold batched structs)."""
    if not chunk.is_numpy:
        return list(data)
    if isinstance(data, np.ndarray):
        return list(data)
    from ray.rllib.utils.spaces.space_utils import unbatch

    return unbatch(data)


def extract(chunk: Any, model_outputs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """Copies what is recorded out of one `SingleAgentEpisode` chunk."""
    n = len(chunk)
    outputs = {}
    for key in model_outputs:
        if n and key in chunk.extra_model_outputs:
            outputs[key] = items(chunk, chunk.get_extra_model_outputs(key))
        else:
            outputs[key] = [ZERO] * n
    return {
        "span": (chunk.t_started, chunk.t),
        "observations": items(chunk, chunk.get_observations()),
        "infos": list(chunk.get_infos()),
        "actions": items(chunk, chunk.get_actions()) if n else [],
        "rewards": [float(r) for r in chunk.get_rewards()] if n else [],
        "outputs": outputs,
    }


def parts_join(parts: list[dict[str, Any]]) -> bool:
    """Whether copied chunks start at t=0 and each starts where the previous ended."""
    if not parts or parts[0]["span"][0] != 0:
        return False
    return all(b["span"][0] == a["span"][1] for a, b in zip(parts, parts[1:]))


def make_recorder(
    directory: epath.Path,
    obs_space: Any,
    act_space: Any,
    opts: Mapping[str, Any],
    split: str,
    declared_episode: Mapping[str, Any],
    metadata: Mapping[str, Any],
) -> Recorder:
    """A `Recorder` (append mode, metadata features inferred) for RLlib episodes."""
    import tensorflow_datasets as tfds

    declared_step = {
        key: tfds.features.Scalar(dtype)
        for key, dtype in KNOWN_OUTPUTS.items()
        if key in opts["model_outputs"]
    }
    declared_step.update(opts["step_metadata_info"] or {})
    episode_info = dict(declared_episode)
    episode_info.update(opts["episode_metadata_info"] or {})

    def make_config(step_info: dict, episode_info: dict) -> Any:
        return spaces_lib.config_from_spaces(
            obs_space,
            act_space,
            opts["name"],
            observation_info=opts["observation_info"],
            action_info=opts["action_info"],
            reward_info=opts["reward_info"],
            discount=opts["discount"],
            step_metadata_info=step_info,
            episode_metadata_info=episode_info,
            image_encoding=opts["image_encoding"],
            jpeg_quality=opts["jpeg_quality"],
        )

    return Recorder(
        directory,
        make_config,
        step_metadata_info=declared_step,
        episode_metadata_info=episode_info,
        infer=True,
        image_encoding=opts["image_encoding"],
        jpeg_quality=opts["jpeg_quality"],
        split=split,
        mode="append",
        metadata={
            **metadata,
            "split": split,
            "observation_space": str(obs_space),
            "action_space": str(act_space),
        },
        **(opts["writer_kwargs"] or {}),
    )


def join(slot: str, parts: list[dict[str, Any]], model_outputs: Any) -> dict[str, Any] | None:
    """One episode's columns from the copies of its consecutive chunks (None: they do not join).

    Each chunk starts with its predecessor's last observation and info.
    """
    if not parts_join(parts):
        _log.warning(
            "episode %s: its chunks do not start at t=0 or do not join up (%s); not recorded",
            slot,
            [p["span"] for p in parts],
        )
        return None
    out: dict[str, Any] = {
        "observations": [],
        "infos": [],
        "actions": [],
        "rewards": [],
        "outputs": {k: [] for k in model_outputs},
    }
    for i, part in enumerate(parts):
        skip = 0 if i == 0 else 1
        out["observations"].extend(part["observations"][skip:])
        out["infos"].extend(part["infos"][skip:])
        out["actions"].extend(part["actions"])
        out["rewards"].extend(part["rewards"])
        for key in out["outputs"]:
            out["outputs"][key].extend(part["outputs"][key])
    num = len(out["actions"])
    if len(out["observations"]) != num + 1 or len(out["infos"]) != num + 1:
        _log.warning(
            "episode %s: %d observations, %d infos for %d actions; not recorded",
            slot,
            len(out["observations"]),
            len(out["infos"]),
            num,
        )
        return None
    return out


class ChunkWriter:
    """Writes joined RLlib episode chunks as RLDS episodes into one dataset.

    Args:
      recorder: the dataset's `Recorder` (see `make_recorder`).
      obs_space: the observation space (values are converted as the features).
      act_space: the action space.
      opts: the `RLDSRecorder` options.
      split: the split every episode is written to.
      directory: the dataset's directory (for delivery reports).

    Attributes:
      episodes_finished: episodes this writer was handed whole and wrote
        (what the runner reports to the driver's check).
      unrecorded: ids of the episodes RLlib finished whose chunks did not
        join up, so were not written (reported too: the driver raises).
    """

    def __init__(
        self,
        recorder: Recorder,
        obs_space: Any,
        act_space: Any,
        opts: Mapping[str, Any],
        split: str,
        directory: epath.PathLike | None = None,
    ):
        self.recorder = recorder
        self.directory = None if directory is None else epath.Path(directory)
        self.episodes_finished = 0
        self.unrecorded: list[str] = []
        self.obs_space = obs_space
        self.act_space = act_space
        self._convert_obs = spaces_lib.space_converter(obs_space)
        self._convert_action = spaces_lib.space_converter(act_space)
        self._opts = opts
        self.split = split

    def write(
        self,
        slot: str,
        parts: list[dict[str, Any]],
        terminated: bool,
        truncated: bool,
        episode_metadata: dict[str, Any],
        episode_fn_data: Mapping[str, Any],
    ) -> bool:
        """Joins `parts` (copies of consecutive chunks) and writes them as one episode.

        Returns:
          Whether the episode was written (False, with a warning, if the
          chunks do not join up; its id is then kept in `unrecorded`).
        """
        opts = self._opts
        joined = join(slot, parts, opts["model_outputs"])
        if joined is None:
            self.unrecorded.append(str(slot))
            return False
        observations, infos = joined["observations"], joined["infos"]
        actions, rewards, outputs = joined["actions"], joined["rewards"], joined["outputs"]
        num = len(actions)

        def meta(t: int) -> dict[str, Any] | None:
            out: dict[str, Any] = {}
            info = infos[t] or {}
            for key in opts["info_keys"]:
                if key in info:
                    out[key] = info[key]
                elif key in (opts["info_defaults"] or {}):
                    out[key] = opts["info_defaults"][key]
                else:
                    raise StepValueError(
                        f"steps/{key}",
                        f"info key {key!r} is missing at step {t} of episode {slot} (info has "
                        f"keys {sorted(map(str, info))}); return it on every step including "
                        "reset, or pass info_defaults",
                    )
            for key, values in outputs.items():
                out[key] = values[t] if t < num else ZERO
            return out

        writer = self.recorder
        discount_on = bool(opts["discount"])
        writer.begin(slot, self._convert_obs(observations[0]), meta(0))
        for t in range(num):
            discount = (0.0 if (terminated and t == num - 1) else 1.0) if discount_on else None
            writer.add(
                slot,
                self._convert_action(actions[t]),
                float(rewards[t]),
                discount,
                self._convert_obs(observations[t + 1]),
                meta(t + 1),
            )
        if opts["episode_fn"] is not None:
            extra = opts["episode_fn"](
                {
                    **episode_fn_data,
                    "observations": observations,
                    "actions": actions,
                    "rewards": rewards,
                    "infos": infos,
                    "terminated": terminated,
                    "truncated": truncated,
                }
            )
            if user_fn_result("episode_fn", extra, "<episode metadata>"):
                episode_metadata = {**episode_metadata, **extra}
        writer.set_episode_metadata(slot, episode_metadata)
        writer.end(slot, terminated=terminated, split=self.split)
        self.episodes_finished += 1
        return True

    def flush(self) -> None:
        self.recorder.flush()

    def datasets(self) -> dict[epath.Path, tuple[str, int]]:
        """This writer's directory -> (split, episodes finished), for `RunnerDelivery`."""
        return {self.directory: (self.split, self.episodes_finished)} if self.directory else {}

    def close(self) -> None:
        self.recorder.close()

    @property
    def episodes_written(self) -> int:
        return self.recorder.episodes_written

    @property
    def steps_written(self) -> int:
        return self.recorder.steps_written

    @property
    def bytes_written(self) -> int:
        return self.recorder.bytes_written


def log_lifetime_sum(metrics_logger: Any, key: tuple[str, ...], value: int) -> None:
    """Logs a lifetime counter with throughput, on old and new MetricsLogger APIs."""
    from ray.rllib.utils.metrics import metrics_logger as ml

    if "lifetime_sum" in getattr(ml, "DEFAULT_STATS_CLS_LOOKUP", {}):
        metrics_logger.log_value(key, value, reduce="lifetime_sum", with_throughput=True)
    else:  # Ray < 2.50: a sum never cleared is a lifetime counter.
        metrics_logger.log_value(
            key, value, reduce="sum", clear_on_reduce=False, with_throughput=True
        )
