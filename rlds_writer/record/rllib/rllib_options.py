"""The options of `RLDSRecorder`: what each does, defaults and checks.

* `output_root`: directory holding the runner subdirectories (local, NFS,
  or an fsspec URL such as `gs://bucket/run`). Required.
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
  killed runner loses only its unfinished episodes (a runner that ships its
  shards to the driver's node ships them then; without it, at close only).
* `writer_kwargs`: `DatasetWriter` arguments (`max_episodes_per_file`,
  `file_format`, `fsync`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from etils import epath

from rlds_writer.record import spaces as spaces_lib

DEFAULTS: dict[str, Any] = {
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


def checked_options(
    base: Mapping[str, Any], output_root: epath.PathLike, options: Mapping[str, Any]
) -> dict[str, Any]:
    """`options` over `base` over the defaults, with `output_root`; refuses bad ones."""
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown RLDSRecorder options {unknown}; known: {sorted(DEFAULTS)}")
    merged = {**DEFAULTS, **dict(base), **options, "output_root": str(output_root)}
    if merged["mode"] not in ("error", "overwrite", "append"):
        raise ValueError(f"mode must be error, overwrite or append, got {merged['mode']!r}")
    if merged["mode"] == "append" and merged["merge"]:
        raise ValueError(
            "mode='append' with merge=True is not supported (the merged dataset already "
            "exists); use merge=False and read the runner directories with "
            "tfds.builder_from_directories"
        )
    return merged
