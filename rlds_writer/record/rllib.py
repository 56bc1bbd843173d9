"""Record the episodes RLlib's EnvRunners play (new API stack) as an RLDS dataset.

    from rlds_writer.record.rllib import RLDSRecorder, finish_recording

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .callbacks(RLDSRecorder.with_options(
            output_root="/data/cartpole_run",       # or gs://..., s3://..., NFS
            info_keys=["station"],                  # env `info` entries -> step metadata
            model_outputs=["action_dist_inputs", "action_logp"],
        ))
    )
    algo = config.build_algo()
    algo.train()
    algo.stop()   # closes every runner's writer and merges into <root>/merged

How it works:

* Every EnvRunner actor (training and evaluation) owns one writer on its own
  subdirectory of `output_root` (`rlds_writer.store.writer_directory`:
  `writer-00001`, `writer-eval-00000`, ...). Training runners write split
  `train`, evaluation runners split `eval`.
* An episode is written once, whole, in `on_episode_end`. An episode longer
  than `rollout_fragment_length` reaches the learner in chunks over several
  `sample()` calls; the recorder copies each unfinished chunk in
  `on_sample_end` (before a local learner's connectors can change it in
  place), checks the copies against `prev_episode_chunks`, and joins them
  with the final chunk. Episodes still running when a runner dies or the
  algorithm stops are not recorded.
* Each episode's metadata holds RLlib's episode id (`episode_id`) and the
  runner's `worker_index`.
* At the end of each `sample()` the writer is flushed (every finished episode
  is on disk and listed) and its counters are logged through the runner's
  `MetricsLogger` as lifetime sums with throughput: `algo.train()` results
  show them under `env_runners/rlds_writer/...`.
* `algo.stop()` closes every runner's writer and, if `merge=True` (default),
  merges the runner subdirectories into `<output_root>/merged`. With
  `merge=False` read them with `tfds.builder_from_directories`.
* A restarted runner (`restart_failed_env_runners`) reopens its
  subdirectory in append mode; the killed runner loses only the episodes it
  had not finished.
* Multi-agent episodes (`MultiAgentEnv`): one RLDS episode per agent per env
  episode, one dataset per RLlib module, `<root>/<module_id>/writer-00001`,
  merged into `<root>/merged/<module_id>` (see `record/rllib_multiagent.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from rlds_writer.errors import DatasetExistsError, LockedError
from rlds_writer.record import rllib_multiagent as multi
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.record.rllib_chunks import ChunkWriter, extract, log_lifetime_sum, make_recorder
from rlds_writer.store import layout
from rlds_writer.store.locking import DirectoryLock
from rlds_writer.store.merge import merge as merge_directories
from rlds_writer.store.merge import writer_directory

module_runner_directories = multi.module_runner_directories


def _keep_tf2_behavior() -> None:
    """Keeps TensorFlow in TF2 (eager) mode under RLlib.

    RLlib's `try_import_tf` switches TensorFlow to TF1 graph mode
    (`disable_v2_behavior`) when it is the first to import it, and TFDS then
    cannot read datasets in that process. Importing TensorFlow first avoids
    that; if RLlib came first, TF2 behavior is switched back on (RLlib's new
    API stack runs on torch and does not need TF1 mode).
    """
    import tensorflow as tf

    if not tf.executing_eagerly():
        tf.compat.v1.enable_v2_behavior()


_keep_tf2_behavior()

from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402

_log = logging.getLogger(__name__)

METRICS_KEY = "rlds_writer"
MERGED = "merged"

_DEFAULTS: dict[str, Any] = {
    "output_root": None,
    "name": "rlds_dataset",
    "info_keys": (),
    "info_defaults": None,
    "model_outputs": (),
    "step_metadata_info": None,
    "episode_fn": None,
    "episode_metadata_info": None,
    "discount": False,
    "observation_info": None,
    "action_info": None,
    "reward_info": None,
    "image_encoding": spaces_lib.DEFAULT_IMAGE_ENCODING,
    "jpeg_quality": spaces_lib.DEFAULT_JPEG_QUALITY,
    "train_split": "train",
    "eval_split": "eval",
    "record_evaluation": True,
    "mode": "error",
    "merge": True,
    "merged_directory": None,
    "move_on_merge": True,
    "flush_on_sample_end": True,
    "writer_kwargs": None,
}


def _is_writer_directory(path: epath.Path) -> bool:
    return path.name.startswith("writer-") and (path / "features.json").exists()


def runner_directories(output_root: epath.PathLike) -> list[epath.Path]:
    """The per-runner dataset directories under `output_root`, sorted by name."""
    root = epath.Path(output_root)
    if not root.exists():
        return []
    return sorted((p for p in root.iterdir() if _is_writer_directory(p)), key=lambda p: p.name)


class RLDSRecorder(RLlibCallback):
    """An `RLlibCallback` recording every EnvRunner's episodes as RLDS.

    Configure it with `RLDSRecorder.with_options(...)` (or a subclass setting
    `options`) and pass the result to `config.callbacks(...)`. Options:

    * `output_root`: directory holding the runner subdirectories (local, NFS,
      or any `etils.epath` path such as `gs://bucket/run`). Required.
    * `name`: dataset name.
    * `info_keys`, `info_defaults`: env `info` entries stored as step
      metadata (the reset `info` belongs to step 0); a missing key raises
      unless it has a default.
    * `model_outputs`: keys of RLlib's `extra_model_outputs` stored as step
      metadata (e.g. `action_dist_inputs`, `action_logp`, `vf_preds`). They
      belong to the step whose action they produced; the final step (and a
      step where the module did not return the key) holds zeros.
    * `step_metadata_info`, `episode_metadata_info`: declared features (the
      others are inferred from each runner's first episode).
    * `episode_fn(data) -> dict | None`: extra episode metadata computed from
      the joined episode: `data` has `id`, `observations`, `actions`,
      `rewards`, `infos`, `terminated`, `truncated`, `worker_index`.
    * `discount`, `observation_info`, `action_info`, `reward_info`,
      `image_encoding`, `jpeg_quality`: as for the Gymnasium wrappers.
    * `train_split`, `eval_split`, `record_evaluation`.
    * `mode`: `error` (refuse an output root that already holds runner
      datasets), `overwrite` (delete them first) or `append`.
    * `merge`: merge the runner subdirectories at `algo.stop()` (or
      `finish_recording`) into `merged_directory` (default
      `<output_root>/merged`); `move_on_merge` moves the shards instead of
      copying them and removes the subdirectories.
    * `flush_on_sample_end`: flush at the end of every `sample()` so that a
      killed runner loses only its unfinished episodes.
    * `writer_kwargs`: `DatasetWriter` arguments (`max_episodes_per_file`,
      `file_format`, `fsync`, ...).

    Multi-agent runs record one episode per agent into one dataset per
    module (`record/rllib_multiagent.py`); every option applies per agent
    (`info_keys` read from the agent's own info).
    """

    options: Mapping[str, Any] = {}

    @classmethod
    def with_options(cls, output_root: epath.PathLike, **options: Any) -> type[RLDSRecorder]:
        """Returns a subclass configured with `options` (see the class doc)."""
        unknown = sorted(set(options) - set(_DEFAULTS))
        if unknown:
            raise TypeError(f"unknown RLDSRecorder options {unknown}; known: {sorted(_DEFAULTS)}")
        merged = {**_DEFAULTS, **dict(cls.options), **options, "output_root": str(output_root)}
        if merged["mode"] not in ("error", "overwrite", "append"):
            raise ValueError(f"mode must be error, overwrite or append, got {merged['mode']!r}")
        if merged["mode"] == "append" and merged["merge"]:
            raise ValueError(
                "mode='append' with merge=True is not supported (the merged dataset already "
                "exists); use merge=False and read the runner directories with "
                "tfds.builder_from_directories"
            )
        return type(cls.__name__, (cls,), {"options": merged, "__module__": cls.__module__})

    def __init__(self) -> None:
        super().__init__()
        self._opts = {**_DEFAULTS, **dict(self.options)}
        if not self._opts["output_root"]:
            raise ValueError(
                "RLDSRecorder needs an output_root: pass RLDSRecorder.with_options(output_root=...)"
                " to config.callbacks()"
            )
        self._writer: Any = None
        self._split = self._opts["train_split"]
        self._disabled = False
        self._worker_index: int | None = None
        self._logged = {"episodes": 0, "steps": 0, "bytes": 0}
        self._pending: dict[str, list[dict[str, Any]]] = {}  # id -> copied chunks
        self._stopped = False  # driver: merged already
        self._closed = False  # runner: writer closed, record no more

    # -------------------------------------------------- algorithm (driver)

    def on_algorithm_init(
        self, *, algorithm: Any, metrics_logger: Any = None, **kwargs: Any
    ) -> None:
        root = epath.Path(self._opts["output_root"])
        config = getattr(algorithm, "config", None)
        if config is not None and getattr(config, "is_multi_agent", False):
            for module_id in config.policies or {}:
                multi.check_module_id(module_id)  # before any runner records
        existing = runner_directories(root) + [
            p for dirs in multi.module_runner_directories(root).values() for p in dirs
        ]
        merged = self._merged_directory()
        merged_sets = _datasets_in(merged)
        if self._opts["mode"] == "error" and (existing or merged_sets):
            names = [str(p.relative_to(root)) for p in existing] + [str(p) for p in merged_sets]
            raise DatasetExistsError(
                f"{root} already holds recorded datasets ({', '.join(names)}); pass "
                "mode='overwrite' to replace them or mode='append' (with merge=False)"
            )
        if self._opts["mode"] == "overwrite":
            for path in existing:
                path.rmtree()
            if merged.exists():
                merged.rmtree()
        root.mkdir(parents=True, exist_ok=True)
        # Close the runners' writers and merge when the algorithm stops.
        original_cleanup = algorithm.cleanup

        def cleanup() -> None:
            original_cleanup()
            if self._opts["merge"] and not self._stopped:
                self._stopped = True
                self.merge_runner_datasets()

        algorithm.cleanup = cleanup

    def _merged_directory(self) -> epath.Path:
        return epath.Path(
            self._opts["merged_directory"] or epath.Path(self._opts["output_root"]) / MERGED
        )

    def merge_runner_datasets(self) -> Any:
        """Merges the runner subdirectories into the merged directory.

        Multi-agent recordings merge each module's runner directories into
        `<merged directory>/<module_id>`.

        Returns:
          The `rlds_writer.store.MergeReport` (multi-agent: module id -> report), or
          None if nothing was recorded.
        """
        root = epath.Path(self._opts["output_root"])
        move = self._opts["move_on_merge"]
        modules = multi.module_runner_directories(root)
        if modules:
            reports = {}
            for module_id, sources in modules.items():
                reports[module_id] = merge_directories(
                    sources, self._merged_directory() / module_id, move=move
                )
                module_root = root / module_id
                if move and module_root.exists() and not any(module_root.iterdir()):
                    module_root.rmdir()
            return reports
        sources = runner_directories(root)
        if not sources:
            _log.warning("no episode was recorded under %s; nothing to merge", root)
            return None
        return merge_directories(sources, self._merged_directory(), move=move)

    # ------------------------------------------------------------ EnvRunner

    def _writer_for(self, env_runner: Any, multi_agent: bool = False) -> Any:
        if self._writer is not None or self._disabled or self._closed:
            return self._writer
        in_eval = bool(getattr(env_runner.config, "in_evaluation", False))
        if in_eval and not self._opts["record_evaluation"]:
            self._disabled = True
            return None
        index = int(env_runner.worker_index or 0)
        self._worker_index = index
        self._split = self._opts["eval_split"] if in_eval else self._opts["train_split"]
        base = f"eval-{index:05d}" if in_eval else f"{index:05d}"
        if multi_agent:
            if getattr(env_runner.config, "episode_lookback_horizon", 1) < 1:
                # RLlib's own chunks then lose the step of an action still waiting
                # for its agent's next observation (turn-based envs).
                _log.warning(
                    "episode_lookback_horizon=0: agents that act in turn may be recorded "
                    "without the step cut at a chunk boundary; keep RLlib's default of 1"
                )
            # One directory per module, made when its first agent episode ends.
            name = multi.free_writer_name(epath.Path(self._opts["output_root"]), base)
            self._writer = multi.MultiAgentRecording(self._opts, name, index, self._split)
        else:
            directory = self._free_directory(base)
            self._writer = self._make_writer(env_runner, directory, index)
        # Close the writer when RLlib stops this runner (algo.stop()).
        original_stop = env_runner.stop

        def stop() -> None:
            try:
                self.close()
            finally:
                original_stop()

        env_runner.stop = stop
        return self._writer

    def _free_directory(self, base: str) -> epath.Path:
        """The runner's directory, or a numbered sibling if a live writer holds it.

        A restarted runner reuses its predecessor's directory (the dead
        writer's lock is released by the kernel). On object stores a lock of
        a runner on another host cannot be taken over, so a new directory
        (`writer-00001.1`, ...) is used instead.
        """

        root = self._opts["output_root"]
        for attempt in range(100):
            directory = writer_directory(root, base if attempt == 0 else f"{base}.{attempt}")
            directory.mkdir(parents=True, exist_ok=True)
            lock = DirectoryLock(directory)
            try:
                lock.acquire()
            except LockedError:
                continue
            lock.release()
            return directory
        raise RuntimeError(f"no free writer directory for runner {base} under {root}")

    def _make_writer(self, env_runner: Any, directory: epath.Path, index: int) -> ChunkWriter:
        env = env_runner.env
        obs_space = getattr(env, "single_observation_space", None) or env.observation_space
        act_space = getattr(env, "single_action_space", None) or env.action_space
        import tensorflow_datasets as tfds

        recorder = make_recorder(
            directory,
            obs_space,
            act_space,
            self._opts,
            self._split,
            {"episode_id": tfds.features.Text(), "worker_index": tfds.features.Scalar(np.int64)},
            {"source": "rlds_writer.record.rllib", "worker_index": index},
        )
        return ChunkWriter(recorder, obs_space, act_space, self._opts, self._split)

    def on_episode_end(
        self,
        *,
        episode: Any,
        prev_episode_chunks: Sequence[Any] | None = None,
        env_runner: Any = None,
        metrics_logger: Any = None,
        env_index: int = 0,
        **kwargs: Any,
    ) -> None:
        if env_runner is None or self._closed:
            return
        multi_agent = multi.is_multi_agent(episode)
        writer = self._writer_for(env_runner, multi_agent)
        if writer is None:
            return
        prev = list(prev_episode_chunks or [])
        parts = self._pending.pop(episode.id_, [])
        if len(parts) != len(prev):
            # Chunks sampled before this recorder saw them (e.g. restored state):
            # read them from RLlib's list.
            parts = [self._extract(c) for c in prev]
        parts.append(self._extract(episode))
        if multi_agent:
            writer.write(episode.id_, parts)
            return
        slot = episode.id_
        writer.write(
            slot,
            parts,
            bool(episode.is_terminated),
            bool(episode.is_truncated),
            {"episode_id": str(slot), "worker_index": int(self._worker_index or 0)},
            {"id": slot, "worker_index": self._worker_index},
        )

    def _extract(self, chunk: Any) -> Any:
        if multi.is_multi_agent(chunk):
            return multi.extract_multi_agent(chunk, self._opts["model_outputs"])
        return extract(chunk, self._opts["model_outputs"])

    def on_sample_end(
        self,
        *,
        env_runner: Any = None,
        metrics_logger: Any = None,
        samples: Any = None,
        **kwargs: Any,
    ) -> None:
        if self._closed:
            return
        # Copy the unfinished episodes' chunks now: once returned, RLlib's learner
        # connectors may change them in place (they share objects with a local runner).
        pending: dict[str, list[dict[str, Any]]] = {}
        for chunk in samples or []:
            if chunk.is_done:
                continue
            pending[chunk.id_] = [*self._pending.get(chunk.id_, []), self._extract(chunk)]
        # Episodes absent from this sample were abandoned by an env reset.
        self._pending = pending
        if self._writer is None:
            return
        if self._opts["flush_on_sample_end"]:
            self._writer.flush()
        if metrics_logger is not None:
            self._log_metrics(metrics_logger)

    def _log_metrics(self, metrics_logger: Any) -> None:
        writer = self._writer
        now = {
            "episodes": writer.episodes_written,
            "steps": writer.steps_written,
            "bytes": writer.bytes_written,
        }
        for name, value in now.items():
            delta = value - self._logged[name]
            self._logged[name] = value
            log_lifetime_sum(metrics_logger, (METRICS_KEY, f"{name}_written"), delta)

    def close(self) -> None:
        """Closes this runner's writer (episodes still running are not recorded)."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()


def _close_runner_recorders(env_runner: Any) -> int:
    closed = 0
    for callback in getattr(env_runner, "_callbacks", None) or []:
        if isinstance(callback, RLDSRecorder):
            callback.close()
            closed += 1
    return closed


def finish_recording(algorithm: Any, *, merge: bool | None = None) -> Any:
    """Closes every EnvRunner's writer and (optionally) merges their datasets.

    Call it instead of waiting for `algo.stop()`, e.g. to read the dataset
    while the algorithm object is still alive. Recording stops on every
    runner (later episodes are not recorded).

    Args:
      algorithm: the RLlib `Algorithm`.
      merge: merge into the merged directory; defaults to the `merge` option.

    Returns:
      The `MergeReport` if merged, else the list of runner directories
      (multi-agent: module id -> `MergeReport` or -> runner directories).
    """
    recorders = [
        c
        for c in (
            algorithm.callbacks if isinstance(algorithm.callbacks, list) else [algorithm.callbacks]
        )
        if isinstance(c, RLDSRecorder)
    ]
    if not recorders:
        raise ValueError("the algorithm has no RLDSRecorder callback")
    recorder = recorders[0]
    for group in (
        getattr(algorithm, "env_runner_group", None),
        getattr(algorithm, "eval_env_runner_group", None),
    ):
        if group is not None:
            group.foreach_env_runner(_close_runner_recorders, local_env_runner=True)
    do_merge = recorder._opts["merge"] if merge is None else merge
    recorder._stopped = True  # algo.stop() will not merge again
    if do_merge:
        return recorder.merge_runner_datasets()
    modules = multi.module_runner_directories(recorder._opts["output_root"])
    return modules or runner_directories(recorder._opts["output_root"])


def recorded_episode_counts(output_root: epath.PathLike) -> dict[str, int]:
    """Episodes per split over every runner directory (from `dataset_info.json`)."""

    counts: dict[str, int] = {}
    paths = runner_directories(output_root) + [
        p for dirs in multi.module_runner_directories(output_root).values() for p in dirs
    ]
    for path in paths:
        info = layout.read_json(path / layout.DATASET_INFO)
        for split, (lengths, _) in layout.read_splits(info).items():
            counts[split] = counts.get(split, 0) + sum(lengths)
    return counts


def _datasets_in(merged: epath.Path) -> list[str]:
    """The merged datasets in `merged` (itself, or one per module)."""
    if (merged / "features.json").exists():
        return [merged.name]
    if not merged.exists():
        return []
    return sorted(
        f"{merged.name}/{p.name}" for p in merged.iterdir() if (p / "features.json").exists()
    )


__all__ = [
    "RLDSRecorder",
    "finish_recording",
    "runner_directories",
    "recorded_episode_counts",
    "module_runner_directories",
]
