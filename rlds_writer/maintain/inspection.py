"""Looking into a dataset directory: `info` (what it holds) and `validate` (is it sound).

The work lives in modules of one concept each: `info.py`, `validate.py`,
`shard_walk.py` (the shard scan both share), `feature_tree.py` (features as
a tree) and `tfds_episodes.py` (episodes decoded by TFDS). This module keeps
the names importable from where they have always been.
"""

from __future__ import annotations

from rlds_writer.maintain.feature_tree import features_tree, render_features
from rlds_writer.maintain.info import info, render_info
from rlds_writer.maintain.shard_walk import iter_shard_records, record_step_count
from rlds_writer.maintain.tfds_episodes import decoded_episodes
from rlds_writer.maintain.validate import describe_violation, validate

__all__ = [
    "decoded_episodes",
    "describe_violation",
    "features_tree",
    "info",
    "iter_shard_records",
    "record_step_count",
    "render_features",
    "render_info",
    "validate",
]
