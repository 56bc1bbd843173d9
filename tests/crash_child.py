"""A recorder that runs until it is killed, for the SIGKILL tests.

It records a deterministic Catch dataset: episode `i` is fully determined by
`i` (env seed, agent actions, a truncation length), so a test can rebuild
every episode's exact content from its id (`expected_episode`). Each episode
carries its id in its episode metadata.

After each `flush()` returns, the recorder appends `flushed <last id>` to a
report file with one `os.write` on an `O_APPEND` descriptor: a SIGKILL cannot
tear it, and it survives the process (no fsync: a SIGKILL is not a power
loss). The test then knows that every episode up to that id must survive.

Run by the tests through a `forkserver` process that has already imported
TensorFlow, TFDS and rlds_writer, so each new recorder starts in milliseconds;
also runnable on its own:

    python tests/crash_child.py DIR --first-id 0 --report DIR.report
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Any

import numpy as np

ROWS = 6
COLUMNS = 4
NAME = "catch_crash"


def dataset_config() -> Any:
    import tensorflow_datasets as tfds

    import rlds_writer

    return rlds_writer.DatasetConfig(
        name=NAME,
        observation_info=tfds.features.Tensor(shape=(ROWS, COLUMNS), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"t": np.int32},
        episode_metadata_info={"episode_id": np.int64},
    )


def expected_episode(episode_id: int) -> dict[str, Any]:
    """The steps of episode `episode_id`, RLDS-aligned, as numpy arrays.

    Built directly from the env, independently of the recorder: o_0..o_T,
    actions a_0..a_{T-1} then 0, rewards and discounts then 0, the flags.
    """
    from rlds_writer.envs.catch import Catch

    env = Catch(rows=ROWS, columns=COLUMNS, seed=episode_id, max_steps=1 + episode_id % ROWS)
    rng = np.random.default_rng(episode_id + 1_000_003)
    timestep = env.reset()
    observations = [timestep.observation]
    actions, rewards, discounts = [], [], []
    while not timestep.last():
        action = int(rng.integers(3))
        timestep = env.step(action)
        actions.append(action)
        rewards.append(timestep.reward)
        discounts.append(timestep.discount)
        observations.append(timestep.observation)
    n = len(observations)
    terminated = float(timestep.discount) == 0.0
    flags = np.zeros(n, dtype=bool)
    return {
        "episode_id": episode_id,
        "observation": np.stack(observations).astype(np.float32),
        "action": np.array([*actions, 0], dtype=np.int64),
        "reward": np.array([*rewards, 0.0], dtype=np.float32),
        "discount": np.array([*discounts, 0.0], dtype=np.float32),
        "t": np.arange(n, dtype=np.int32),
        "is_first": np.concatenate([[True], flags[1:]]),
        "is_last": np.concatenate([flags[:-1], [True]]),
        "is_terminal": np.concatenate([flags[:-1], [terminated]]),
    }


def record_episode(backend: Any, episode_id: int, step_pause: float = 0.0) -> None:
    """Records episode `episode_id` through the recorder API, as an adapter would."""
    from rlds_writer.envs.catch import Catch

    env = Catch(rows=ROWS, columns=COLUMNS, seed=episode_id, max_steps=1 + episode_id % ROWS)
    rng = np.random.default_rng(episode_id + 1_000_003)
    timestep = env.reset()
    backend.begin_episode(timestep.observation, {"t": 0})
    backend.set_episode_metadata({"episode_id": episode_id})
    t = 0
    while not timestep.last():
        action = int(rng.integers(3))
        timestep = env.step(action)
        t += 1
        backend.add_step(action, timestep.reward, timestep.discount, timestep.observation, {"t": t})
        if step_pause:
            time.sleep(step_pause)
    backend.end_episode(terminated=float(timestep.discount) == 0.0)


def _slow_down_io(pause: float, report_fd: int) -> None:
    """Widens the windows a crash can hit, and announces them in the report.

    `os.writev` writes half of each record, reports `torn`, pauses, and returns
    a short count (the writer then writes the rest, as after any short write);
    `os.replace` (the rename that commits dataset_info.json) reports
    `replace` and pauses first. The writer's own code runs unchanged around them.
    """
    from rlds_writer.store.formats.tfrecord import write_ahead

    write_ahead.WRITE_IN_C = False  # every record through `os.writev`, torn below
    real_writev = os.writev
    real_replace = os.replace
    torn = {"next": True}

    def slow_writev(fd: int, buffers: Any) -> int:
        data = b"".join(bytes(b) for b in buffers)
        if torn["next"] and len(data) > 1:
            torn["next"] = False
            written = os.write(fd, data[: len(data) // 2])
            os.write(report_fd, b"torn\n")
            time.sleep(pause)
            return written
        torn["next"] = True
        return real_writev(fd, buffers)

    def slow_replace(src: Any, dst: Any) -> None:
        os.write(report_fd, b"replace\n")
        time.sleep(pause)
        real_replace(src, dst)

    os.writev = slow_writev
    os.replace = slow_replace


def record_forever(
    directory: str,
    first_id: int,
    report_path: str,
    file_format: str = "tfrecord",
    max_episodes_per_file: int = 4,
    commit_interval: float = 0.02,
    seed: int = 0,
    step_pause: float = 0.0005,
    max_episodes: int | None = None,
    slow_io: float = 0.0,
    write_ahead_from: int | None = None,
) -> None:
    """Appends episodes first_id, first_id + 1, ... to `directory` until killed.

    Flushes after a random number of episodes (0-3) and reports each flush.
    With `slow_io` > 0, every record write stops half-way and every commit
    before its rename for that many seconds, announced in the report
    (`_slow_down_io`), so that kills can land inside them. `write_ahead_from`
    sets how much a tfrecord shard holds before it writes zeros ahead of its
    records, whatever the shard's size (these episodes are small: 0 makes
    every record land in zeros).
    """
    import rlds_writer
    from rlds_writer.store.formats.tfrecord import write_ahead

    if write_ahead_from is not None:
        write_ahead.WRITE_AHEAD_FROM = write_ahead_from
        write_ahead.WRITE_AHEAD_MIN_RECORDS = 0  # shards of 4 episodes write ahead too

    fd = os.open(report_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if slow_io:
        _slow_down_io(slow_io, fd)
    os.write(fd, f"start {first_id} {time.time()}\n".encode())
    backend = rlds_writer.TFDSBackendWriter(
        directory,
        dataset_config(),
        max_episodes_per_file=max_episodes_per_file,
        file_format=file_format,
        mode="append",
        ds_metadata={"recorder": "crash_child"},
        commit_interval=commit_interval,
    )
    os.write(fd, f"open {time.time()}\n".encode())
    rng = random.Random(seed)
    episode_id = first_id
    until_flush = rng.randint(0, 3)
    while max_episodes is None or episode_id < first_id + max_episodes:
        record_episode(backend, episode_id, step_pause=rng.random() * 2 * step_pause)
        if until_flush == 0:
            backend.flush()
            os.write(fd, f"flushed {episode_id}\n".encode())
            until_flush = rng.randint(0, 3)
        else:
            until_flush -= 1
        episode_id += 1
    backend.close()
    os.write(fd, f"closed {episode_id - 1} {time.time()}\n".encode())


# ------------------------------------------------- helpers for the tests


def forkserver_context() -> Any:
    """A multiprocessing context whose server has imported TF, TFDS and rlds_writer."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "crash_child",
            "tensorflow",
            "tensorflow_datasets",
            "rlds_writer.store.writing.writer",
            "rlds_writer.record.dm_env.backend",
            "rlds_writer.maintain.recover",
            "rlds_writer.envs.catch",
        ]
    )
    return ctx


def write_dataset(
    directory: Any,
    episode_ids: Any,
    *,
    max_episodes_per_file: int = 3,
    file_format: str = "tfrecord",
    mode: str = "error",
    metadata: dict[str, Any] | None = None,
    **writer_kwargs: Any,
) -> None:
    """Writes the given deterministic episodes to a dataset and closes it."""
    import rlds_writer

    backend = rlds_writer.TFDSBackendWriter(
        directory,
        dataset_config(),
        max_episodes_per_file=max_episodes_per_file,
        file_format=file_format,
        mode=mode,
        ds_metadata=metadata,
        **writer_kwargs,
    )
    for episode_id in episode_ids:
        record_episode(backend, episode_id)
    backend.close()


_EXPECTED_CACHE: dict[int, dict[str, Any]] = {}


def check_record(record: bytes) -> int:
    """Parses one episode record, checks it against the env; returns its episode id."""
    import tensorflow as tf

    feature = tf.train.Example.FromString(record).features.feature
    got = {
        key: np.array(getattr(value, value.WhichOneof("kind")).value)
        for key, value in feature.items()
    }
    (episode_id,) = got["episode_id"].tolist()
    if episode_id not in _EXPECTED_CACHE:
        _EXPECTED_CACHE[episode_id] = expected_episode(episode_id)
    want = _EXPECTED_CACHE[episode_id]
    steps = len(want["t"])
    np.testing.assert_array_equal(
        got["steps/observation"].reshape(steps, ROWS, COLUMNS), want["observation"]
    )
    for key in ("action", "reward", "discount", "t", "is_first", "is_last", "is_terminal"):
        value = got[f"steps/{key}"]
        np.testing.assert_array_equal(value, want[key].astype(value.dtype), f"{episode_id}/{key}")
    return episode_id


def check_records(directory: Any, split: str = "train") -> list[int]:
    """Reads every listed record of a split (no TFDS), checks each against the env.

    Also checks that the shard files are exactly the listed, contiguous ones
    and hold exactly the listed number of complete records.

    Returns:
      The episode ids in dataset order.
    """
    from rlds_writer.maintain.shard_walk import iter_shard_records
    from rlds_writer.store.dataset import layout
    from rlds_writer.store.storage import file_io

    info = file_io.read_json(directory / layout.DATASET_INFO)
    file_format = info.get("fileFormat", "tfrecord")
    lengths, _ = layout.read_splits(info).get(split, ([], 0))
    files = layout.list_shard_files(directory, info["name"], split, file_format)
    assert sorted(files) == list(range(len(lengths))), (sorted(files), lengths)
    ids = []
    for index, n in enumerate(lengths):
        records = list(iter_shard_records(files[index], file_format))
        assert len(records) == n, f"{files[index].name}: {len(records)} records, listed {n}"
        ids.extend(check_record(record) for record in records)
    return ids


def check_loaded(directory: Any, split: str = "train") -> list[int]:
    """Loads a split through TFDS, checks every episode against the env; returns the ids."""
    from rlds_writer.maintain.tfds_episodes import decoded_episodes

    ids = []
    for episode in decoded_episodes(directory, split):
        episode_id = int(episode["episode_id"])
        want = expected_episode(episode_id)
        for key in ("observation", "action", "reward", "discount", "t", "is_first", "is_last"):
            np.testing.assert_array_equal(episode["steps"][key], want[key], key)
        np.testing.assert_array_equal(episode["steps"]["is_terminal"], want["is_terminal"])
        ids.append(episode_id)
    return ids


def slow_merge(sources: list[str], dest: str, move: bool, pause: float) -> None:
    """Runs `merge` with every shard copy or rename slowed down, to be killed mid-way."""
    import shutil

    import rlds_writer

    real_rename = os.rename
    real_copyfile = shutil.copyfile

    def slow_rename(src: Any, dst: Any) -> None:
        time.sleep(pause)
        real_rename(src, dst)

    def slow_copyfile(src: Any, dst: Any, **kwargs: Any) -> Any:
        time.sleep(pause)
        return real_copyfile(src, dst, **kwargs)

    os.rename = slow_rename
    shutil.copyfile = slow_copyfile
    rlds_writer.merge(sources, dest, move=move)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--first-id", type=int, default=0)
    parser.add_argument("--report", required=True)
    parser.add_argument("--format", default="tfrecord")
    parser.add_argument("--max-episodes-per-file", type=int, default=4)
    parser.add_argument("--max-episodes", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    record_forever(
        args.directory,
        args.first_id,
        args.report,
        file_format=args.format,
        max_episodes_per_file=args.max_episodes_per_file,
        seed=args.seed,
        max_episodes=args.max_episodes,
    )


if __name__ == "__main__":
    main()
