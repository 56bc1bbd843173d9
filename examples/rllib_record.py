"""Record every episode RLlib's EnvRunners play while training PPO on CartPole.

    python examples/rllib_record.py --output /tmp/rllib_rlds --iterations 3

Each EnvRunner writes its own subdirectory of `--output`; evaluation runners
write split `eval`. `algo.stop()` merges them into `<output>/merged`, which
this script then loads with `tfds.builder_from_directory`. With `--keep` the
runner subdirectories stay as they are and are read with
`tfds.builder_from_directories`.

On a Ray cluster, start the script on the head node with `--address auto`;
`--output` is a directory of the head node (runners on other nodes ship
their shards to it through Ray) or an NFS mount (see
docs/gymnasium_rllib.md, "On a Ray cluster").
"""

from __future__ import annotations

import argparse
import os

import ray
from ray.rllib.algorithms.ppo import PPOConfig

from rlds_writer.record.rllib import RLDSRecorder, runner_directories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="/tmp/rllib_rlds")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--address", default=None, help="Ray cluster address (e.g. auto)")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of a local Ray instance")
    parser.add_argument("--keep", action="store_true", help="keep runner dirs, do not merge")
    args = parser.parse_args()

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)

    recorder = RLDSRecorder.with_options(
        args.output,
        name="cartpole_ppo",
        # RLlib's model outputs for each action, stored next to it.
        model_outputs=["action_dist_inputs", "action_logp"],
        merge=not args.keep,
        mode="overwrite",
    )
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=args.num_env_runners,
            rollout_fragment_length=32,
            num_cpus_per_env_runner=0.5,
        )
        .training(train_batch_size_per_learner=256, minibatch_size=64, num_epochs=2)
        .rl_module(model_config={"fcnet_hiddens": [32]})
        .evaluation(evaluation_interval=1, evaluation_duration=2, evaluation_num_env_runners=0)
        .fault_tolerance(restart_failed_env_runners=True)
        .callbacks(recorder)
    )
    algo = config.build_algo()
    for i in range(args.iterations):
        result = algo.train()
        runners = result["env_runners"]
        figures = runners.get("rlds_writer", {})
        print(
            f"iter {i}: return {runners.get('episode_return_mean', float('nan')):.1f}, "
            f"recorded {figures.get('episodes_written', 0):.0f} episodes, "
            f"{figures.get('steps_written', 0):.0f} steps, "
            f"{figures.get('bytes_written', 0) / 1e3:.1f} kB"
        )
    algo.stop()  # closes every runner's writer; merges unless --keep
    ray.shutdown()

    import tensorflow_datasets as tfds

    if args.keep:
        dirs = [os.fspath(p) for p in runner_directories(args.output)]
        builder = tfds.builder_from_directories(dirs)
        print(f"runner directories: {[os.path.basename(d) for d in dirs]}")
    else:
        builder = tfds.builder_from_directory(os.path.join(args.output, "merged"))
    for split, info in builder.info.splits.items():
        print(f"split {split}: {info.num_examples} episodes")
    episode = next(iter(tfds.as_numpy(builder.as_dataset(split="train"))))
    steps = list(episode["steps"])
    print(
        f"first episode {episode['episode_id'].decode()} from runner {episode['worker_index']}: "
        f"{len(steps)} steps, return {sum(float(s['reward']) for s in steps):.0f}"
    )


if __name__ == "__main__":
    main()
