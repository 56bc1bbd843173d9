"""`rlds-writer record`: record the built-in Catch env with a random agent."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

from rlds_writer.store.formats import shards


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "record",
        help="record episodes of the built-in Catch env with a random agent",
        description="Record episodes of the built-in Catch env (dm_env API) with a "
        "uniformly random agent into an RLDS dataset in TFDS format.",
    )
    p.add_argument("--output", required=True, help="dataset directory to write")
    p.add_argument("--episodes", type=int, default=100, help="episodes to record (default 100)")
    p.add_argument(
        "--max-episodes-per-file",
        type=int,
        default=1000,
        help="episodes per shard file (default 1000)",
    )
    p.add_argument(
        "--format",
        choices=shards.names(),
        default=shards.DEFAULT_FILE_FORMAT,
        help=f"shard file format (default {shards.DEFAULT_FILE_FORMAT})",
    )
    p.add_argument(
        "--mode",
        choices=("error", "append", "overwrite"),
        default="error",
        help="what to do if OUTPUT already holds a dataset (default error)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the env and the agent; with --mode append, episodes continue the "
        "seeded sequence after the ones already recorded instead of repeating them",
    )
    p.add_argument("--rows", type=int, default=10, help="Catch grid rows (episode length + 1)")
    p.add_argument("--columns", type=int, default=5, help="Catch grid columns")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--no-load-back",
        action="store_true",
        help="skip loading the dataset back with tfds.builder_from_directory",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import tensorflow_datasets as tfds
    from tqdm import tqdm

    import rlds_writer
    from rlds_writer.envs.catch import Catch
    from rlds_writer.errors import counted

    if args.episodes < 1:
        raise ValueError(f"--episodes: expected at least 1, got {args.episodes}")
    if args.rows < 2 or args.columns < 1:
        raise ValueError(
            f"--rows/--columns: expected rows >= 2 and columns >= 1, got {args.rows}x{args.columns}"
        )
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise ValueError(
            f"--output {args.output}: expected a directory (new or holding a dataset), "
            "got an existing file; choose another path"
        )
    already = _episodes_on_disk(args.output) if args.mode == "append" else 0
    # Episode i of the dataset (counting earlier runs) always gets the same
    # seed, so an appended run continues the sequence instead of repeating it.
    seeds = np.random.SeedSequence([args.seed, already])
    env_seed, agent_seed = seeds.spawn(2)
    env = Catch(rows=args.rows, columns=args.columns, seed=env_seed.generate_state(1)[0])
    config = rlds_writer.DatasetConfig(
        name="catch",
        observation_info=tfds.features.Tensor(shape=(args.rows, args.columns), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        step_metadata_info={"timestamp_ns": np.int64},
        episode_metadata_info={
            "seed": np.int64,
            "episode_return": np.float32,
            "end_reason": tfds.features.Text(),
        },
    )
    # A dataset already there is refused in the command line's words (--mode) by main.
    backend = rlds_writer.TFDSBackendWriter(
        data_directory=args.output,
        ds_config=config,
        max_episodes_per_file=args.max_episodes_per_file,
        file_format=args.format,
        mode=args.mode,
    )
    rng = np.random.default_rng(agent_seed)
    returns = {"value": 0.0}

    def episode_fn(timestep, action, unused_env):
        if timestep.first():
            returns["value"] = 0.0
        else:
            returns["value"] += float(timestep.reward)
        return {"seed": args.seed, "episode_return": returns["value"]}

    start = time.perf_counter()
    steps = 0
    show = not args.no_progress and args.episodes >= 20 and sys.stderr.isatty()
    with rlds_writer.EnvLogger(
        env,
        backend,
        step_fn=lambda ts, action, env: {"timestamp_ns": time.time_ns()},
        episode_fn=episode_fn,
        metadata={"agent": "uniform random", "env": "Catch", "seed": args.seed},
    ) as logged:
        with _StopOnInterrupt() as stop:
            for _ in tqdm(range(args.episodes), desc="episodes", unit="ep", disable=not show):
                timestep = logged.reset()
                while not timestep.last() and not stop.requested:
                    timestep = logged.step(rng.integers(3))
                    steps += 1
                if stop.requested:
                    break
    # Leaving the `with` closed the writer: whatever it listed is on disk.
    if stop.requested:
        safe = _episodes_on_disk(backend.data_directory)
        are = "is" if safe == 1 else "are"
        print(
            f"Interrupted: {counted(safe, 'episode')} {are} safely on disk in "
            f"{backend.data_directory} ({safe - already} from this run; the episode in "
            "progress was kept, cut short)",
            file=sys.stderr,
        )
        return 130
    elapsed = time.perf_counter() - start
    print(
        f"Recorded {counted(args.episodes, 'episode')} ({counted(steps, 'transition')}) "
        f"in {elapsed:.2f}s "
        f"to {backend.data_directory}"
    )
    # TFDS reads some formats (array_record) only through as_data_source (no tf.data reader).
    reader = shards.adapter(args.format).tfds_reader
    if not args.no_load_back:
        builder = tfds.builder_from_directory(str(backend.data_directory))
        loaded_episodes = 0
        loaded_steps = 0
        if reader == "as_data_source":
            source = builder.as_data_source(split="train")
            for i in range(len(source)):
                loaded_episodes += 1
                loaded_steps += len(source[i]["steps"])
        else:
            for episode in builder.as_dataset(split="train"):
                loaded_episodes += 1
                loaded_steps += int(episode["steps"].cardinality())
        print(
            f"Loaded back with tfds.builder_from_directory(...).{reader}: "
            f"{counted(loaded_episodes, 'episode')}, {counted(loaded_steps, 'step')} in split "
            "'train'"
        )
    print("Load it with:")
    print("  import tensorflow_datasets as tfds")
    print(
        f"  ds = tfds.builder_from_directory({str(backend.data_directory)!r})"
        f".{reader}(split='train')"
    )
    return 0


def _episodes_on_disk(path: str | os.PathLike) -> int:
    """Episodes listed in `path`'s dataset_info.json (0 if there is no dataset)."""
    import rlds_writer

    if not os.path.exists(os.path.join(path, "dataset_info.json")):
        return 0
    summary = rlds_writer.maintain.info(path, count_steps=False)
    return sum(split["episodes"] for split in summary["splits"].values())


class _StopOnInterrupt:
    """Turns Ctrl-C into a request the recording loop honours between steps.

    A KeyboardInterrupt raised inside the writer could land anywhere; a flag
    lets the loop stop cleanly and the writer close with everything listed.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def __enter__(self) -> _StopOnInterrupt:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._previous)
