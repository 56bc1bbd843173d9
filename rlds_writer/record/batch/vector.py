"""A Gymnasium vector env's recording on the batch recorder, in every autoreset mode.

`VectorRecording` turns a vector env's whole-batch results into
`BatchRecorder` calls: the config from the single-env spaces (as
`RecordRLDS` builds it), step metadata from `info_keys` read as batches
(`info["_key"]` masks filled from `info_defaults`), and the three autoreset
modes:

* `next_step`: a sub-env that ended is reset by the next step, whose action
  it ignores: that row enters no episode, and begins the next one;
* `same_step`: the step that ends an episode returns the next one's first
  observation and reset info; the final ones come in `info["final_obs"]` and
  `info["final_info"]` and replace that sub-env's row;
* `disabled`: episodes begin at `reset(options={"reset_mask": ...})`.

Features of undeclared `info_keys` are inferred from the first reset's batch,
so the writer is created there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlds_writer.errors import StepValueError
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.record.batch import vector_step
from rlds_writer.record.batch.arrays import done_flags, host_batch
from rlds_writer.record.batch.core import BatchRecorder
from rlds_writer.record.gymnasium_recording import OPTIONS, action_caster, take_options
from rlds_writer.store.writing.dataset_setup import check_mode

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"

# The wrappers' options less the per-sub-env functions it does not take
# (`split_options`), plus the ring's size.
_OPTIONS = {
    **{k: v for k, v in OPTIONS.items() if k not in ("step_fn", "episode_fn")},
    "ring_bytes": None,
}


class VectorRecording:
    """The batch recording of one vector env.

    Args:
      observation_space: the single-env observation space.
      action_space: the single-env action space.
      num_envs: the number of sub-envs.
      autoreset_mode: `NextStep`, `SameStep` or `Disabled`.
      data_directory: the dataset directory.
      kwargs: `RecordRLDSVector`'s options (see `OPTIONS_DOC`) and the
        `DatasetWriter`'s arguments.
      per_env: the sub-envs are stepped apart (`BatchRecorder`'s `per_env`).
    """

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        num_envs: int,
        autoreset_mode: str,
        data_directory: Any,
        kwargs: dict[str, Any],
        per_env: bool = False,
    ):
        options = take_options(kwargs, _OPTIONS)
        self.num_envs = num_envs
        self.mode = autoreset_mode
        self._path = data_directory
        self._writer_kwargs = kwargs
        info_keys = options["info_keys"]
        self.info_keys = [info_keys] if isinstance(info_keys, str) else list(info_keys)
        self.info_defaults = dict(options["info_defaults"] or {})
        unknown = sorted(set(self.info_defaults) - set(self.info_keys))
        if unknown:
            raise ValueError(f"info_defaults names keys that are not in info_keys: {unknown}")
        self._options = options
        self.convert_obs = spaces_lib.space_converter(observation_space)
        self.convert_action = action_caster(action_space)
        self._spaces = (observation_space, action_space)
        ds_config = options["ds_config"]
        self.discount = options["discount"]
        declared = dict(options["step_metadata_info"] or {})
        if ds_config is not None:
            self.discount = ds_config.discount_info is not None
            declared = dict(ds_config.step_metadata_info or {})
        self._declared = declared
        self._pending = np.zeros(num_envs, np.bool_)  # next_step: reset by the next step
        self.per_env = per_env
        self.core: BatchRecorder | None = None
        # The usual steps in one C call (`vector_step.py`), made with the core.
        self._fast: vector_step.VectorSteps | None = None
        if ds_config is not None or all(k in declared for k in self.info_keys):
            self.core = self._make_core(declared)
        else:  # the writer comes at the first reset: refuse a taken directory now
            check_mode(data_directory, kwargs.get("mode", "error"))

    def _make_core(self, step_info: dict[str, Any]) -> BatchRecorder:
        o = self._options
        observation_space, action_space = self._spaces
        config = o["ds_config"]
        if config is None:
            config = spaces_lib.spaces_config(
                observation_space,
                action_space,
                o["name"],
                observation_info=o["observation_info"],
                action_info=o["action_info"],
                reward_info=o["reward_info"],
                discount=o["discount"],
                step_metadata_info=step_info,
                episode_metadata_info=dict(o["episode_metadata_info"] or {}),
                image_encoding=o["image_encoding"],
                jpeg_quality=o["jpeg_quality"],
            )
        metadata = {
            "observation_space": str(observation_space),
            "action_space": str(action_space),
            **dict(o["metadata"] or {}),
        }
        extra = {"ring_bytes": o["ring_bytes"]} if o["ring_bytes"] else {}
        core = BatchRecorder(
            self._path,
            config,
            self.num_envs,
            split=o["split"],
            per_env=self.per_env,
            metadata=metadata,
            **extra,
            **self._writer_kwargs,
        )
        pending = self._pending if self.mode == NEXT_STEP else None
        self._fast = vector_step.make(core, pending, self.discount)
        return core

    # ------------------------------------------------------------- calls

    def reset(self, obs: Any, infos: Mapping[str, Any], mask: Any = None) -> None:
        """Episodes begin in the sub-envs reset (`mask`: a `reset_mask`, or all)."""
        mask = None if mask is None else np.asarray(mask, np.bool_)
        meta = self._metadata(infos, mask)
        if self.core is None:
            self.core = self._make_core(self._inferred(meta))
        self.core.begin(self.convert_obs(obs), meta, mask)
        if mask is None:
            self._pending[:] = False
        else:
            self._pending[mask] = False

    def step(
        self,
        actions: Any,
        obs: Any,
        rewards: Any,
        terminations: Any,
        truncations: Any,
        infos: Mapping[str, Any],
    ) -> None:
        """Records the vector step's results for every sub-env in an episode."""
        core = self.core
        if core is None:
            raise RuntimeError("RecordRLDSVector.step called before reset()")
        if self._fast is not None:
            meta = self._metadata(infos)
            observation = self.convert_obs(obs)
            fast = self._fast
            ends = fast.step(
                self.convert_action(actions), rewards, observation, meta, terminations, truncations
            )
            if ends is not None:
                if self.mode != SAME_STEP:
                    fast.finish(ends)
                    return
                ended = fast.ended(ends)
                if ended is not None:
                    try:
                        self._replace_finals(ended, infos)
                    except BaseException:
                        # As the general path leaves them (its `end` never ran): open.
                        core._ring.open[ended] = True
                        raise
                    fast.finish(ends)
                    core.begin(observation, meta, ended)
                return
        terms = done_flags(terminations, "terminated")
        done = terms | done_flags(truncations, "truncated")
        discount = (~terms).astype(np.float32) if self.discount else None
        meta = self._metadata(infos)
        observation = self.convert_obs(obs)
        core.add(self.convert_action(actions), rewards, discount, observation, meta)
        ended = done & core.open
        if self.mode == SAME_STEP and ended.any():
            self._replace_finals(ended, infos)
        core.end(ended, terms)
        if self.mode == NEXT_STEP:
            reset = self._pending
            if reset.any():
                core.begin(observation, meta, reset)
            self._pending[:] = ended  # in place: the C step holds it
        elif self.mode == SAME_STEP and ended.any():
            core.begin(observation, meta, ended)

    def _replace_finals(self, ended: np.ndarray, infos: Mapping[str, Any]) -> None:
        final_obs = infos["final_obs"]
        final_info = infos.get("final_info", {})
        envs = np.flatnonzero(ended)
        rows = _final_rows(final_obs, envs)
        # One write per field where the final values make one numeric batch.
        obs_done = rows is not None and self.core.replace_rows(envs, self.convert_obs(rows))
        meta_done = not self.info_keys
        if not meta_done:
            batch = self._final_batch(final_info, envs)
            meta_done = batch is not None and self.core.replace_rows(envs, None, batch)
        if obs_done and meta_done:
            return
        for i in envs.tolist():
            meta = None
            if not meta_done:
                meta = {key: self._final_value(final_info, key, i) for key in self.info_keys}
            self.core.replace(i, None if obs_done else self.convert_obs(final_obs[i]), meta)

    def _final_batch(self, info: Mapping[str, Any], envs: np.ndarray) -> dict[str, Any] | None:
        """The final infos of `envs` as numeric batches, or None (one is missing or not one)."""
        out = {}
        for key in self.info_keys:
            value, mask = info.get(key), info.get(f"_{key}")
            if type(value) is not np.ndarray or value.dtype == object:
                return None
            if mask is not None and not np.asarray(mask)[envs].all():
                return None  # the defaults' casts are `_final_value`'s, one at a time
            out[key] = value[envs]
        return out

    def _final_value(self, info: Mapping[str, Any], key: str, i: int) -> Any:
        mask = info.get(f"_{key}")
        if key in info and (mask is None or mask[i]):
            return info[key][i]
        if key in self.info_defaults:
            return self.info_defaults[key]
        raise StepValueError(
            f"steps/{key}", f"info key {key!r} is missing in final_info of sub-env {i}"
        )

    def _metadata(
        self, infos: Mapping[str, Any], need: Any = None, rows: int | None = None
    ) -> dict[str, Any] | None:
        """Step metadata batches (of `rows`) from `info_keys`; rows outside `need` are not read."""
        if not self.info_keys:
            return None
        rows = self.num_envs if rows is None else rows
        out = {}
        for key in self.info_keys:
            mask = infos.get(f"_{key}")
            if key in infos:
                value = infos[key]
                if mask is not None and not np.all(mask):
                    value = self._filled(key, value, mask, need)
            elif key in self.info_defaults:
                default = np.asarray(self.info_defaults[key])
                value = np.broadcast_to(default, (rows, *default.shape))
            else:
                raise StepValueError(
                    f"steps/{key}",
                    f"info key {key!r} is missing from the vector env's info (it has keys "
                    f"{sorted(k for k in map(str, infos) if not k.startswith('_'))}); return it "
                    f"on every step including reset, or pass info_defaults={{{key!r}: <value>}}",
                )
            out[key] = value
        return out

    def _filled(self, key: str, value: Any, mask: Any, need: Any) -> Any:
        absent = ~np.asarray(mask, np.bool_)
        if need is not None:
            absent &= need
        arr = np.array(host_batch(value, f"steps/{key}"))
        if not absent.any():
            return arr
        if key not in self.info_defaults:
            missing = np.flatnonzero(absent)[:5].tolist()
            raise StepValueError(
                f"steps/{key}",
                f"info key {key!r} is missing for sub-envs {missing}; return it on every step "
                f"including reset, or pass info_defaults={{{key!r}: <value>}}",
            )
        arr[absent] = self.info_defaults[key]
        return arr

    def _inferred(self, meta: Mapping[str, Any] | None) -> dict[str, Any]:
        """Declared step metadata features, and those of the other `info_keys` from this batch."""
        step_info = dict(self._declared)
        o = self._options
        for key, value in (meta or {}).items():
            if key not in step_info:
                rows = list(host_batch(value, f"steps/{key}"))
                step_info[key] = spaces_lib.values_def(
                    rows, f"steps/{key}", o["image_encoding"], o["jpeg_quality"]
                )
        return step_info

    def flush(self) -> None:
        if self.core is not None:
            self.core.flush()

    def close(self) -> None:
        if self.core is not None:
            self.core.close()


def _final_rows(final_obs: Any, envs: np.ndarray) -> np.ndarray | None:
    """The final observations of `envs` as one numeric batch, or None (not one).

    A vector env may give them as a numeric `[N, ...]` array; Gymnasium's
    `SyncVectorEnv`/`AsyncVectorEnv` give an object array of per-sub-env values,
    stacked here when they are arrays of one shape and dtype.
    """
    if type(final_obs) is not np.ndarray:
        return None
    if final_obs.dtype != object:
        return final_obs[envs]
    items = final_obs[envs].tolist()
    if set(map(type, items)) != {np.ndarray} or items[0].dtype == object:
        return None
    if len({(item.dtype, item.shape) for item in items}) != 1:
        return None
    return np.array(items)


def split_options(kwargs: Mapping[str, Any]) -> Sequence[str]:
    """The per-sub-env options the batch recording does not take (`step_fn`, `episode_fn`)."""
    return [k for k in ("step_fn", "episode_fn") if kwargs.get(k) is not None]
