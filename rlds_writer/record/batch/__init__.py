"""record.batch: batched rollouts recorded a whole batch per call.

Vector envs (Gymnasium, EnvPool), JAX rollouts of `(T, N, ...)` arrays and
GPU simulators' torch tensors step many sub-envs at once. Here every field
of a vector step is kept column-wise in a time-major ring (`ring.py`), one
slice assignment per field per step whatever the number of sub-envs, and
an episode is gathered once when it ends and handed to the writer as the
same `Episode` the single-env recorders make (`core.py`, `BatchRecorder`).
Inputs may be numpy, torch, JAX or anything with `__dlpack__`/`__array__`
(`arrays.py`). Adapters: `vector.py` (Gymnasium's vector envs, under
`RecordRLDSVector`), `envpool.py` (`RecordRLDSEnvPool`, sync and async),
`rollout.py` (`RolloutRecorder`: whole `(T, N, ...)` rollouts).
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "BatchRecorder": ("rlds_writer.record.batch.core", "BatchRecorder"),
        "RecordRLDSEnvPool": ("rlds_writer.record.batch.envpool", "RecordRLDSEnvPool"),
        "RolloutRecorder": ("rlds_writer.record.batch.rollout", "RolloutRecorder"),
    },
)
