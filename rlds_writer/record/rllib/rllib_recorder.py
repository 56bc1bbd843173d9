"""Record the episodes RLlib's EnvRunners play (new API stack) as an RLDS dataset.

    from rlds_writer.record.rllib import RLDSRecorder, finish_recording

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .callbacks(RLDSRecorder.with_options(
            output_root="/data/cartpole_run",       # the driver's disk, or NFS
            info_keys=["station"],                  # env `info` entries -> step metadata
            model_outputs=["action_dist_inputs", "action_logp"],
        ))
    )
    algo = config.build_algo()
    algo.train()
    algo.stop()   # closes every runner's writer and merges into <root>/merged

How it works (details in the modules named):

* Every EnvRunner (training and evaluation) writes one dataset on its own
  subdirectory of `output_root` (`rlds_writer.store.writer_directory`:
  `writer-00001`, `writer-eval-00000`, ...;
  splits `train` and `eval`); multi-agent runs one per module
  (`<root>/<module_id>/writer-00001`, `rllib_multiagent.py`).
* An episode is written once, whole, in `on_episode_end`, joined from the
  copies of its chunks (`rllib_chunks.py`); episodes still running when a
  runner dies or the algorithm stops are not recorded. Its metadata holds
  RLlib's `episode_id` and the runner's `worker_index`.
* At the end of each `sample()` the writer is flushed and its counters are
  logged as lifetime sums (`env_runners/rlds_writer/...` in the results).
  A runner whose node does not see the driver's output root (a Ray cluster
  without a shared file system) then ships its closed shards through Ray to
  an actor on the driver's node (`rllib_delivery.py`, `rllib_sink.py`), and
  every runner reports the episodes it finished. With an object-store
  output root (`s3://`, `gs://`) and Ray, every runner ships: only that
  actor writes the bucket (`<root>/writer-00001`, ...), shards uploaded
  whole and JSON last, and the driver merges in place in the bucket.
* `algo.stop()` closes every runner's writer, checks that the runner
  directories hold every reported episode, merges them into
  `<output_root>/merged` (`rllib_directories.py`) and checks the merged
  dataset; a missing episode raises `EpisodesLostError` naming the runner
  and its node. So does an episode RLlib finished that a runner could not
  write (its chunks did not join up), after the others are merged. With
  `merge=False` read the runner directories with
  `tfds.builder_from_directories`.
* A restarted runner (`restart_failed_env_runners`) reopens its
  subdirectory in append mode (or, shipping, starts a new one); the killed
  runner loses only the episodes it had not finished.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from rlds_writer.record.rllib import rllib_delivery as delivery_lib
from rlds_writer.record.rllib import rllib_multiagent as multi
from rlds_writer.record.rllib import rllib_sink
from rlds_writer.record.rllib.rllib_chunks import (
    ChunkWriter,
    extract,
    log_lifetime_sum,
    make_recorder,
)
from rlds_writer.record.rllib.rllib_directories import (
    free_directory,
    merge_runner_datasets,
    merged_directory,
    prepare_output_root,
    recorded_episode_counts,
    runner_directories,
)
from rlds_writer.record.rllib.rllib_options import DEFAULTS, checked_options
from rlds_writer.record.rllib.rllib_tf import keep_tf2_behavior
from rlds_writer.store.storage.object_path import as_path

module_runner_directories = multi.module_runner_directories
keep_tf2_behavior()

from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402

_log = logging.getLogger(__name__)

METRICS_KEY = "rlds_writer"


class RLDSRecorder(RLlibCallback):
    """An `RLlibCallback` recording every EnvRunner's episodes as RLDS.

    Configure it with `RLDSRecorder.with_options(...)` (or a subclass setting
    `options`) and pass the result to `config.callbacks(...)`. The options are
    listed in `record/rllib/rllib_options.py`.

    Multi-agent runs record one episode per agent into one dataset per
    module (`record/rllib/rllib_multiagent.py`); every option applies per agent
    (`info_keys` read from the agent's own info).
    """

    options: Mapping[str, Any] = {}

    @classmethod
    def with_options(cls, output_root: epath.PathLike, **options: Any) -> type[RLDSRecorder]:
        """Returns a subclass configured with `options` (see the class doc)."""
        merged = checked_options(cls.options, output_root, options)
        return type(cls.__name__, (cls,), {"options": merged, "__module__": cls.__module__})

    def __init__(self) -> None:
        super().__init__()
        self._opts = {**DEFAULTS, **dict(self.options)}
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
        self._sink: Any = None  # driver: the EpisodeSink actor
        self._closed = False  # runner: writer closed, record no more
        self._delivery: delivery_lib.RunnerDelivery | None = None  # runner

    # -------------------------------------------------- algorithm (driver)

    def on_algorithm_init(
        self, *, algorithm: Any, metrics_logger: Any = None, **kwargs: Any
    ) -> None:
        config = getattr(algorithm, "config", None)
        if config is not None and getattr(config, "is_multi_agent", False):
            for module_id in config.policies or {}:
                multi.check_module_id(module_id)  # before any runner records
        root = as_path(self._opts["output_root"])
        prepare_output_root(self._opts)
        self._sink = rllib_sink.start_driver_sink(root, self._opts)
        # Close the runners' writers, check and merge when the algorithm stops.
        original_cleanup = algorithm.cleanup

        def cleanup() -> None:
            original_cleanup()
            try:
                if not self._stopped:
                    self._stopped = True
                    self._finish(self._opts["merge"])
            finally:
                self._stop_sink()

        algorithm.cleanup = cleanup

    def _reports(self) -> dict[str, dict[str, Any]]:
        """Every runner's report (episodes finished per directory), from the sink."""
        if self._sink is None:
            return {}
        import ray

        return ray.get(self._sink.finish.remote())

    def _finish(self, merge: bool) -> Any:
        """Checks every runner's episodes reached the driver's node, then merges (and checks)."""
        reports = self._reports()
        delivery_lib.check_delivered(self._opts["output_root"], reports)
        result = None
        if merge:
            result = merge_runner_datasets(self._opts)
            if result is not None:
                delivery_lib.check_merged(
                    merged_directory(self._opts), reports, per_module=isinstance(result, dict)
                )
        # Last: what was recorded is merged and checked before this raises.
        delivery_lib.check_recorded(reports)
        return result

    def _stop_sink(self) -> None:
        sink, self._sink = self._sink, None
        if sink is not None:
            import ray

            ray.kill(sink)

    def merge_runner_datasets(self) -> Any:
        """Checks the runners' episodes and merges their directories into the merged one.

        Multi-agent recordings merge each module's runner directories into
        `<merged directory>/<module_id>`.

        Returns:
          The `rlds_writer.store.MergeReport` (multi-agent: module id ->
          report), or None if nothing was recorded.

        Raises:
          EpisodesLostError: a runner directory (before the merge) or the
            merged dataset (after it) lacks episodes the runners finished.
        """
        return self._finish(True)

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
        # Straight into the output root, or staged here and shipped to the driver's node.
        self._delivery = delivery_lib.RunnerDelivery.connect(
            self._opts["output_root"], index, self._split
        )
        root = self._delivery.local_root
        if multi_agent:
            if getattr(env_runner.config, "episode_lookback_horizon", 1) < 1:
                # RLlib's own chunks then lose the step of an action still waiting
                # for its agent's next observation (turn-based envs).
                _log.warning(
                    "episode_lookback_horizon=0: agents that act in turn may be recorded "
                    "without the step cut at a chunk boundary; keep RLlib's default of 1"
                )
            # One directory per module, made when its first agent episode ends.
            name = multi.free_writer_name(root, base)
            self._writer = multi.MultiAgentRecording(self._opts, name, index, self._split, root)
        else:
            directory = free_directory(root, base)
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
        return ChunkWriter(recorder, obs_space, act_space, self._opts, self._split, directory)

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
            self._deliver()
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
            self._deliver(final=True)

    def _deliver(self, final: bool = False) -> None:
        """Ships what the last flush closed (if this node ships) and reports the count."""
        if self._delivery is not None and self._writer is not None:
            self._delivery.deliver(
                self._writer.datasets(), final=final, unrecorded=self._writer.unrecorded
            )


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

    Raises:
      EpisodesLostError: episodes the runners finished are missing.
    """
    callbacks = algorithm.callbacks
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    recorder = next((c for c in callbacks if isinstance(c, RLDSRecorder)), None)
    if recorder is None:
        raise ValueError("the algorithm has no RLDSRecorder callback")
    for group in (
        getattr(algorithm, "env_runner_group", None),
        getattr(algorithm, "eval_env_runner_group", None),
    ):
        if group is not None:
            group.foreach_env_runner(_close_runner_recorders, local_env_runner=True)
    do_merge = recorder._opts["merge"] if merge is None else merge
    recorder._stopped = True  # algo.stop() will not merge again
    result = recorder._finish(do_merge)
    if do_merge:
        return result
    modules = multi.module_runner_directories(recorder._opts["output_root"])
    return modules or runner_directories(recorder._opts["output_root"])


__all__ = [
    "RLDSRecorder",
    "finish_recording",
    "runner_directories",
    "recorded_episode_counts",
    "module_runner_directories",
]
