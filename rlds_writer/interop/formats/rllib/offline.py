"""RLlib's offline training read straight from an RLDS dataset: no export, no second copy.

RLlib's new API stack reads offline data through Ray Data
(`AlgorithmConfig.offline_data`; `OfflineData` reads `input_` with a
`ray.data.read_*` method named by `input_read_method`, which in Ray 2.60
must be a name of `ray.data`). `RLDSOfflineData` is an `OfflineData` that
reads `input_`, an RLDS dataset directory (local, `s3://`, `gs://`), with
`rlds_writer.read.ray_data`: the read tasks run on the cluster's workers and
give rows in the schema RLlib asks for:

* `input_read_episodes=False` (RLlib's default, the column schema): one row
  per transition, `eps_id` (the episode's index in the selection), `t`,
  `obs`, `actions`, `rewards`, `new_obs`, `terminateds`, `truncateds`,
  renamed by `input_read_schema` if one is set. Array observations and
  actions only (RLlib's columns hold one array each).
* `input_read_episodes=True` (the episode schema): one row per episode, the
  column `item` holding `msgpack(SingleAgentEpisode.get_state())` as RLlib
  writes it (`output_write_episodes=True`), built on the workers as
  `rlds-writer export --to rllib-episodes` builds it (`exporter.py`): any
  spaces, infos, extra model outputs.

Transition rows reach the learner through `RLDSPreLearner` (`prelearner.py`:
one `SingleAgentEpisode` per run of an episode in a batch, not per row)
unless `prelearner_class` names another. The pre-learner actor pool is sized
to leave the read tasks a CPU (`prelearner_resources`): RLlib's default of
2 actors x 1 CPU holds every CPU of a 2-CPU Ray and training waits forever.
The actors start without the TensorFlow RLlib would import
(`prelearner_runtime_env`).

Refused, with a one-line error: `input_read_sample_batches=True` (the old
stack's `SampleBatch` rows), multi-agent configs (RLlib reads no multi-agent
offline data), several `input_` paths, and `input_filesystem` (the storage
seam reaches `s3://`/`gs://` itself, configured by the environment).

`input_read_method_kwargs` takes `read_rlds`'s options (`split`,
`cut_short`, `bytes_per_task`, `block_bytes`, `verify_checksums`,
`on_corrupt`) and `ray.data.read_datasource`'s (`concurrency`, `num_cpus`,
`override_num_blocks`, ...). Transition rows are read in tasks of up to 64 MB
on disk, one per CPU at least, yielding blocks of up to Ray's target block
size (128 MiB): the learner pays per block it iterates, so it gets a few
large ones, not the ~1 MB pieces Ray's default read parallelism makes.
`offline_config(config, path, ...)` sets all of it, and the spaces from the
dataset, in one call::

    config = offline_config(BCConfig(), "s3://bucket/cartpole", split="train[:90%]")
    algo = config.build_algo()
    algo.train()
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlds_writer.errors import SpecError, import_optional, optional_dependencies

with optional_dependencies("rlds_writer.interop.formats.rllib.offline (RLlib offline training)"):
    import ray.data
    from ray.rllib.core.columns import Columns
    from ray.rllib.offline.offline_data import OfflineData
    from ray.rllib.offline.offline_prelearner import SCHEMA

from rlds_writer.interop.formats.rllib.prelearner import RLDSPreLearner
from rlds_writer.read.ray_data import RLDSDatasource, read_rlds
from rlds_writer.read.transitions import episode_end

__all__ = ["SCHEMAS", "RLDSOfflineData", "offline_config"]

SCHEMAS = ("columns", "episodes")
# read_rlds's own options among input_read_method_kwargs; the rest go to Ray Data.
_READ_OPTIONS = (
    "split",
    "cut_short",
    "bytes_per_task",
    "block_bytes",
    "verify_checksums",
    "on_corrupt",
)
# The learner iterates its batches from the pre-learner's output, whose blocks
# are the read's: every block costs it a fetch, and a batch across two a copy.
# So transition rows are read in large tasks (on disk) yielding large blocks
# (in memory, Ray's own target size), not in the ~1 MB pieces Ray's default
# parallelism would cut them to (measured: 1.2 -> 0.6 ms of the driver's CPU
# per 1024-row batch, benchmarks/REPORT.md).
_TASK_BYTES = 64 << 20
# Transition columns -> RLlib's column names (before `input_read_schema`).
_COLUMNS = {
    "episode_index": Columns.EPS_ID,
    "step": Columns.T,
    "observation": Columns.OBS,
    "action": Columns.ACTIONS,
    "reward": Columns.REWARDS,
    "next_observation": Columns.NEXT_OBS,
    "terminated": Columns.TERMINATEDS,
    "truncated": Columns.TRUNCATEDS,
}


class EpisodeItems:
    """The rows of RLlib's episode schema: `{"item": [msgpack of SingleAgentEpisode state]}`.

    Runs on the read tasks' workers (it pickles: spaces and names only).
    """

    def __init__(self, name: str, observation_space: Any, action_space: Any, cut_short: str):
        self.name = name
        self.observation_space = observation_space
        self.action_space = action_space
        self.cut_short = cut_short

    def __call__(self, episode: dict[str, Any], index: int) -> dict[str, list[bytes]]:
        import msgpack
        import msgpack_numpy

        from rlds_writer.interop.formats.rllib.exporter import _episode

        end = episode_end(episode)
        if end == "cut_short" and self.cut_short == "drop":
            return {}
        rllib_episode = _episode(
            episode, end, index, self.name, self.observation_space, self.action_space
        )
        state = rllib_episode.get_state()
        return {"item": [msgpack.packb(state, default=msgpack_numpy.encode)]}


def _refuse(config: Any) -> None:
    if config.input_read_sample_batches:
        raise SpecError(
            "input_read_sample_batches=True: an RLDS dataset is read in RLlib's column schema "
            "(the default) or its episode schema (input_read_episodes=True), not as the old "
            "stack's SampleBatches; unset input_read_sample_batches"
        )
    if config.is_multi_agent:
        raise SpecError(
            "a multi-agent config: RLlib's offline input reads single-agent episodes only; "
            "train one module per dataset (RLDSRecorder writes one dataset per module)"
        )
    if config.input_filesystem is not None:
        raise SpecError(
            f"input_filesystem={config.input_filesystem!r}: RLDS datasets are read through "
            "rlds_writer's storage seam (fsspec), configured by the environment "
            "(AWS_ENDPOINT_URL, credentials); leave input_filesystem unset"
        )


def _input_path(config: Any) -> str:
    paths = config.input_ if isinstance(config.input_, list) else [config.input_]
    if len(paths) != 1 or not isinstance(paths[0], str | os.PathLike):
        raise SpecError(
            f"input_={config.input_!r}: RLDSOfflineData reads one RLDS dataset directory; "
            "merge several with `rlds-writer merge`"
        )
    return os.fspath(paths[0])


def read_for_rllib(config: Any, observation_space: Any = None, action_space: Any = None) -> Any:
    """The `ray.data.Dataset` an RLlib config's offline input reads, in the schema it asks for.

    Args:
      config: the `AlgorithmConfig` (its `input_`, `input_read_episodes`,
        `input_read_schema`, `input_read_method_kwargs`).
      observation_space: for the episode schema; default the config's, else the dataset's.
      action_space: likewise.

    Raises:
      SpecError: for what RLDS input cannot give (see the module doc).
    """
    _refuse(config)
    path = _input_path(config)
    kwargs = dict(config.input_read_method_kwargs or {})
    options = {k: kwargs.pop(k) for k in _READ_OPTIONS if k in kwargs}
    if not config.input_read_episodes:
        schema = SCHEMA | dict(config.input_read_schema or {})
        names = {ours: schema[theirs] for ours, theirs in _COLUMNS.items()}
        options.setdefault("bytes_per_task", _TASK_BYTES)
        options.setdefault("block_bytes", _block_bytes())
        source = RLDSDatasource(
            path, rows="transitions", columns=list(names), names=names, **options
        )
        for field in ("observation", "action"):
            leaves = [
                leaf.key
                for leaf in source.dataset.features.step_leaves
                if leaf.path[:2] == ("steps", field)
            ]
            if leaves != [f"steps/{field}"]:
                raise SpecError(
                    f"steps/{field}: a dict {field} ({', '.join(leaves) or 'none'}) cannot go "
                    "in RLlib's column schema; read episodes instead "
                    "(input_read_episodes=True)"
                )
        if "override_num_blocks" not in kwargs and "parallelism" not in kwargs:
            # As many tasks as that size makes (Ray would split them to ~1 MB blocks
            # otherwise), or one per CPU, so that every node reads.
            kwargs["override_num_blocks"] = max(source.num_tasks(), _cluster_cpus())
        return ray.data.read_datasource(source, **kwargs)
    _need_msgpack()
    from rlds_writer.interop.export_spaces import export_spaces
    from rlds_writer.read.reader import open_dataset

    reader = open_dataset(path)
    observation_space = observation_space or getattr(config, "observation_space", None)
    action_space = action_space or getattr(config, "action_space", None)
    observation_space, action_space, _ = export_spaces(reader, observation_space, action_space)
    items = EpisodeItems(
        reader.name, observation_space, action_space, options.get("cut_short", "truncated")
    )
    return read_rlds(path, rows=items, **options, **kwargs)


def _block_bytes() -> int:
    """Ray Data's target block size (128 MiB unless the user's `DataContext` says)."""
    return int(ray.data.DataContext.get_current().target_max_block_size or 128 << 20)


def _cluster_cpus() -> int:
    import ray

    if not ray.is_initialized():
        return 1
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _read_cpus(read_kwargs: Mapping[str, Any]) -> float:
    """The CPUs a read task asks for (Ray Data's default: 1)."""
    cpus = read_kwargs.get("num_cpus")
    if cpus is None:
        cpus = (read_kwargs.get("ray_remote_args") or {}).get("num_cpus", 1)
    return float(cpus)


def prelearner_resources(
    config: Any, read_cpus: float = 1.0, cpus: float | None = None
) -> dict[str, Any]:
    """`map_batches` resources for the pre-learner actors that leave the read tasks a CPU.

    RLlib starts `max(2, num_learners)` pre-learner actors of 1 CPU each; on a
    Ray with that few CPUs (2, less the learners' and env runners') they hold
    every CPU, and the read tasks feeding them never start: training waits
    forever. The pool is cut to what the CPUs left after one read task can
    hold (at least one actor, given the CPUs left if less than a whole one).
    A `concurrency` the user set in `map_batches_kwargs` is kept as it is.

    Args:
      config: the `AlgorithmConfig` (its learners, env runners, `map_batches_kwargs`).
      read_cpus: the CPUs one read task asks for.
      cpus: the cluster's CPUs (default: Ray's, if it is running).

    Returns:
      `concurrency` (and `num_cpus` if cut below the actor's) to merge into
      `map_batches_kwargs`; empty if Ray is not running or the user chose.
    """
    import ray

    asked = dict(config.map_batches_kwargs or {})
    if "concurrency" in asked:
        return {}
    if cpus is None:
        if not ray.is_initialized():
            return {}
        cpus = float(ray.cluster_resources().get("CPU", 0))
    if config.num_learners > 0:
        per_learner = config.num_cpus_per_learner
        if per_learner == "auto":
            per_learner = 1 if config.num_gpus_per_learner == 0 else 0
        cpus -= config.num_learners * float(per_learner)
    cpus -= config.num_env_runners * float(config.num_cpus_per_env_runner or 0)
    per_actor = float(asked.get("num_cpus", 1))
    room = cpus - read_cpus
    wanted = max(2, config.num_learners)
    if per_actor <= 0:
        return {}
    if room >= per_actor:
        return {"concurrency": max(1, min(wanted, int(room // per_actor)))}
    # Not one whole actor's CPUs left beside a read task: one actor, on what is left.
    return {"concurrency": 1, "num_cpus": max(room, 0.0)}


def prelearner_runtime_env(config: Any) -> dict[str, Any]:
    """`map_batches` settings that start the pre-learner actors without TensorFlow.

    RLlib's modules import TensorFlow wherever it is installed (`try_import_tf`,
    at import): in every pre-learner actor that is ~4 s of CPU and ~0.6 GB
    taken beside the read tasks, and again each epoch when the mapped data is
    not kept in memory (RLlib makes the actors anew). The new API stack maps
    and learns with torch only, so the actors get RLlib's own switch,
    `RLLIB_TEST_NO_TF_IMPORT` (Ray merges it into the job's environment).
    Kept as the user set it: a `runtime_env` in `map_batches_kwargs`, or a
    framework other than torch.

    Returns:
      `{"runtime_env": {"env_vars": ...}}` to merge into `map_batches_kwargs`, or `{}`.
    """
    if "runtime_env" in (config.map_batches_kwargs or {}) or config.framework_str != "torch":
        return {}
    return {"runtime_env": {"env_vars": {"RLLIB_TEST_NO_TF_IMPORT": "1"}}}


def _is_cql(config: Any) -> bool:
    from ray.rllib.algorithms.cql import CQLConfig

    return isinstance(config, CQLConfig)


def _need_msgpack() -> None:
    """The episode schema's packers, checked on the driver: a read task's ImportError
    comes late, buried in Ray's traceback."""
    for module in ("msgpack", "msgpack_numpy"):
        import_optional(
            module,
            "reading RLlib's episode schema (offline_config(schema='episodes'))",
            "rllib",
        )


class RLDSOfflineData(OfflineData):
    """RLlib's `OfflineData`, reading `config.input_` as an RLDS dataset (see the module doc).

    Pass it as `config.offline_data(offline_data_class=RLDSOfflineData)`, or
    let `offline_config` set it.
    """

    def __init__(self, config: Any):
        # OfflineData.__init__ reads input_ with ray.data.<input_read_method>; this one
        # sets what its sample() uses, as RLlib's own custom OfflineData examples do.
        self.config = config
        self.is_multi_agent = config.is_multi_agent
        self.path = config.input_
        self.data_read_method = read_rlds
        self.data_read_method_kwargs = dict(config.input_read_method_kwargs or {})
        self.data_read_batch_size = config.input_read_batch_size
        self.materialize_data = config.materialize_data
        self.materialize_mapped_data = config.materialize_mapped_data
        self.data_is_mapped = False
        self.filesystem = None
        self.filesystem_kwargs = {}
        self.filesystem_object = None
        self.data = read_for_rllib(config)
        if self.materialize_data:
            self.data = self.data.materialize()
        self.batch_iterators = None
        self.map_batches_kwargs = self.default_map_batches_kwargs | config.map_batches_kwargs
        self.map_batches_kwargs |= prelearner_resources(
            config, _read_cpus(self.data_read_method_kwargs)
        )
        self.map_batches_kwargs |= prelearner_runtime_env(config)
        self.iter_batches_kwargs = self.default_iter_batches_kwargs | config.iter_batches_kwargs
        self.returned_streaming_split = False
        self.prelearner_class = config.prelearner_class or RLDSPreLearner
        self.locality_hints = None
        self.learner_handles = None
        self.module_spec = None


def offline_config(
    config: Any,
    path: str | os.PathLike,
    *,
    split: str = "train",
    schema: str = "columns",
    observation_space: Any = None,
    action_space: Any = None,
    read_options: Mapping[str, Any] | None = None,
    **offline_data: Any,
) -> Any:
    """Sets an RLlib `AlgorithmConfig` to train offline on an RLDS dataset, read where it lies.

    Args:
      config: an `AlgorithmConfig` (`BCConfig()`, `MARWILConfig()`, `CQLConfig()`, ...).
      path: the RLDS dataset directory (local, `s3://...`, `gs://...`).
      split: a TFDS split spec (`"train[:90%]"`).
      schema: `"columns"` (one row per transition, RLlib's default input) or
        `"episodes"` (whole `SingleAgentEpisode`s, `input_read_episodes=True`).
      observation_space: the observation space; default the config's, else
        the dataset's (recorded, or built from its features).
      action_space: likewise.
      read_options: more `read_rlds` / `ray.data.read_datasource` options
        (`bytes_per_task`, `cut_short`, `concurrency`, ...).
      **offline_data: more `config.offline_data(...)` settings
        (`dataset_num_iters_per_learner` is 1 by default with a local learner,
        as RLlib requires one; 2 for CQL, whose local learner cannot take 1).

    Returns:
      `config`, set (`environment(observation_space=..., action_space=...)` and
      `offline_data(input_=[path], offline_data_class=RLDSOfflineData, ...)`);
      a config that would sample an env (SAC's, so CQL's) and names none is
      marked offline, to train from the dataset alone.
    """
    if schema not in SCHEMAS:
        raise ValueError(
            f"schema must be one of {SCHEMAS}, got {schema!r}: 'columns' for RLlib's column "
            "input, 'episodes' for input_read_episodes=True"
        )
    if schema == "episodes":
        _need_msgpack()
    from rlds_writer.interop.export_spaces import export_spaces
    from rlds_writer.read.reader import open_dataset

    reader = open_dataset(path)
    reader.episodes(split)  # the split spec, checked here
    observation_space = observation_space or config.observation_space
    action_space = action_space or config.action_space
    observation_space, action_space, _ = export_spaces(reader, observation_space, action_space)
    dtype = getattr(action_space, "dtype", None)
    if type(action_space).__name__ == "Box" and dtype is not None and dtype.kind in "iu":
        raise SpecError(
            f"steps/action: integer actions with no recorded space read as {action_space}, "
            "which RLlib's models refuse; pass action_space=gymnasium.spaces.Discrete(n) "
            "(or MultiDiscrete)"
        )
    config = config.environment(observation_space=observation_space, action_space=action_space)
    # RLlib 2.60's CQL hands a local learner its one batch as if it were an iterator
    # (`KeyError: 0` in `Learner.update`): with a local learner it needs 2+ updates a call.
    cql = _is_cql(config) and config.num_learners == 0
    if config.num_learners == 0 and config.dataset_num_iters_per_learner is None:
        # RLlib requires it with a local learner; one batch per train() call is its usual value.
        offline_data.setdefault("dataset_num_iters_per_learner", 2 if cql else 1)
    iters = offline_data.get("dataset_num_iters_per_learner", config.dataset_num_iters_per_learner)
    if cql and iters == 1:
        raise SpecError(
            "dataset_num_iters_per_learner: 1 with CQL and a local learner, which RLlib's "
            "CQL cannot train (it passes the one batch on as an iterator: KeyError 0); "
            "set it to 2 or more, or use num_learners=1"
        )
    config = config.offline_data(
        input_=[os.fspath(path)],
        offline_data_class=RLDSOfflineData,
        input_read_episodes=schema == "episodes",
        input_read_method_kwargs={"split": split, **(read_options or {})},
        **offline_data,
    )
    if config.is_online and not config.env:
        # SAC's config (so CQL's) counts as online and builds an env runner, which
        # asks for an env; with none given it trains from the dataset alone (its
        # new-stack training step reads only offline data), as BC's and MARWIL's do.
        config._is_online = False
    return config
