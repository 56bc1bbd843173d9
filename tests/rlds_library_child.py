"""Runs rlds's own transformations on a recorded dataset; prints the results as JSON.

Run by tests/interop/test_rlds_library.py in a fresh interpreter of the project's
venv (`python rlds_library_child.py <dataset dir>`), so `import rlds` is a
user's first import, with nothing of the test process loaded.
"""

from __future__ import annotations

import json
import sys

import rlds  # noqa: I001 - the import under test comes first
import tensorflow as tf
import tensorflow_datasets as tfds


def main(path: str) -> None:
    episodes = tfds.builder_from_directory(path).as_dataset(split="train")
    steps = episodes.flat_map(lambda e: e[rlds.STEPS])
    lengths = [
        int(rlds.transformations.episode_length(e[rlds.STEPS], optimization_batch_size=1))
        for e in episodes
    ]
    # episode_length's own batched path (unknown cardinality after a filter).
    lengths_batched = [
        int(
            rlds.transformations.episode_length(
                e[rlds.STEPS].filter(lambda s: True), optimization_batch_size=4
            )
        )
        for e in episodes
    ]
    reward_sum = rlds.transformations.sum_dataset(
        steps, lambda s: tf.cast(s[rlds.REWARD], tf.float64)
    )
    nested = rlds.transformations.sum_nested_steps(
        episodes,
        lambda s: {
            "obs": tf.cast(s[rlds.OBSERVATION], tf.float64),
            "terminal": tf.cast(s[rlds.IS_TERMINAL], tf.int64),
        },
    )
    batches = [
        b[rlds.OBSERVATION].numpy().tolist()
        for b in rlds.transformations.batch(steps, size=3, shift=2, drop_remainder=True)
    ]
    mean, std = rlds.transformations.mean_and_std(
        episodes,
        lambda s: ({"obs": s[rlds.OBSERVATION]}, {"obs": tf.constant(True)}),
    )
    # Per-episode returns through map_nested_steps ... apply_nested_steps.
    returns = [
        float(
            rlds.transformations.sum_dataset(
                e[rlds.STEPS], lambda s: tf.cast(s[rlds.REWARD], tf.float64)
            )
        )
        for e in episodes
    ]
    truncated = rlds.transformations.truncate_after_condition(steps, lambda s: s[rlds.IS_LAST])
    result = {
        "rlds_file": rlds.__file__,
        "lengths": lengths,
        "lengths_batched": lengths_batched,
        "reward_sum": float(reward_sum),
        "obs_sum": nested["obs"].numpy().tolist(),
        "terminal_sum": int(nested["terminal"]),
        "batches": batches,
        "mean": tf.convert_to_tensor(mean["obs"]).numpy().tolist(),
        "std": tf.convert_to_tensor(std["obs"]).numpy().tolist(),
        "returns": returns,
        "truncated_length": sum(1 for _ in truncated),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
