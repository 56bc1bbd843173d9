"""TensorFlow kept in TF2 (eager) mode in processes that run RLlib."""

from __future__ import annotations


def keep_tf2_behavior() -> None:
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
