"""A batched recording that runs until it is killed, for the SIGKILL test.

Records `N` CartPole sub-envs of Gymnasium's native vector env with
`RecordRLDSVector`, seeded and with seeded actions, so a run's records come
in the same order every time. After each `flush()` returns it appends
`flushed <episodes written>` to the report file with one `os.write` on an
`O_APPEND` descriptor (a SIGKILL cannot tear it).

    python batch_crash_child.py DIR REPORT STEPS [envpool]

With `BATCH_LANE_INTERVAL` in the environment, the writer thread wakes on
that clock (seconds): a long one leaves every batch on the lane between
flushes, for `flush()` alone to write.

With `envpool`, EnvPool's async API records instead (`RecordRLDSEnvPool`,
`N` envs, `recv()` of `N // 4`): its threads order the episodes differently
from run to run.
"""

from __future__ import annotations

import os
import sys

N = 16
SEED = 5


def record(directory: str, report: str | None, steps: int) -> None:
    import gymnasium as gym
    import numpy as np

    from rlds_writer import RecordRLDSVector

    venv = gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="vector_entry_point")
    # Small shards and frequent commits: kills land in rotations and commits too.
    env = RecordRLDSVector(venv, directory, max_episodes_per_file=7, commit_interval=0.01)
    actions = np.random.default_rng(SEED).integers(0, 2, (steps, N))
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if report else None
    env.reset(seed=SEED)
    for t in range(steps):
        env.step(actions[t])
        if fd is not None and t % 5 == 4:
            env.flush()
            os.write(fd, f"flushed {env.recorder.episodes_written}\n".encode())
    env.close()


def record_envpool(directory: str, report: str, steps: int) -> None:
    import envpool
    import numpy as np

    from rlds_writer.record.batch import RecordRLDSEnvPool

    batch = N // 4
    pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=N, batch_size=batch, seed=5)
    env = RecordRLDSEnvPool(pool, directory, max_episodes_per_file=7, commit_interval=0.01)
    actions = np.random.default_rng(SEED).integers(0, 2, (steps, batch)).astype(np.int32)
    fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    env.async_reset()
    for t in range(steps):
        info = env.recv()[4]
        env.send(actions[t], info["env_id"])
        if t % 5 == 4:
            env.flush()
            os.write(fd, f"flushed {env.recorder.episodes_written}\n".encode())
    env.close()


if __name__ == "__main__":
    if "BATCH_LANE_INTERVAL" in os.environ:
        from rlds_writer.store.writing import batch_lane

        batch_lane.INTERVAL = float(os.environ["BATCH_LANE_INTERVAL"])
    if sys.argv[4:] == ["envpool"]:
        record_envpool(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    else:
        record(sys.argv[1], sys.argv[2], int(sys.argv[3]))
