"""Per-agent-step cost of recording RLlib multi-agent episodes, next to RLlib's own bookkeeping.

Builds env episodes on RLlib's `MultiAgentEpisode` as a `MultiAgentEnvRunner`
does (`add_env_step`, `cut` every `--fragment` env steps) and times, per
agent step:

* rllib: building the episode and its chunks (what RLlib does anyway);
* record: what `RLDSRecorder` adds: copying each chunk at `on_sample_end`
  (`extract_multi_agent`) and, when the env episode ends, joining and
  writing every agent's episode to its module's dataset
  (`MultiAgentRecording.write`), plus the final flush/close.

No policy and no env are timed (both are the user's), nor the one-time
import of TensorFlow Datasets. Usage:

    python benchmarks/rllib_multiagent_cost.py [--episodes 40] [--agents 4] [--length 200]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import gymnasium as gym
import numpy as np

from rlds_writer.record.rllib.rllib_multiagent import MultiAgentRecording, extract_multi_agent
from rlds_writer.record.rllib.rllib_options import DEFAULTS as _DEFAULTS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--length", type=int, default=200, help="env steps per episode")
    parser.add_argument("--fragment", type=int, default=50, help="rollout_fragment_length")
    parser.add_argument("--obs-size", type=int, default=16)
    args = parser.parse_args()

    import tensorflow_datasets  # noqa: F401  (a runner imports it once, with its first writer)
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    agents = [f"agent_{i}" for i in range(args.agents)]
    obs_space = gym.spaces.Box(-10, 10, (args.obs_size,), np.float32)
    act_space = gym.spaces.Discrete(4)
    rng = np.random.default_rng(0)
    # Pre-drawn values: the env and the policy are not what is timed.
    obs = rng.uniform(-1, 1, (args.length + 1, args.agents, args.obs_size)).astype(np.float32)
    actions = rng.integers(0, 4, (args.length, args.agents))
    logits = rng.normal(size=(args.length, args.agents, 4)).astype(np.float32)

    rllib_s = record_s = 0.0
    agent_steps = 0
    with tempfile.TemporaryDirectory() as tmp:
        opts = {
            **_DEFAULTS,
            "output_root": tmp,
            "model_outputs": ("action_dist_inputs", "action_logp"),
            "info_keys": ("clock",),
        }
        recording = MultiAgentRecording(opts, "00001", 1, "train")
        for _ in range(args.episodes):
            start = time.perf_counter()
            episode = MultiAgentEpisode(
                observation_space={a: obs_space for a in agents},
                action_space={a: act_space for a in agents},
                agent_to_module_mapping_fn=lambda agent, ep: "shared",
            )
            episode.add_env_reset(
                observations={a: obs[0, i] for i, a in enumerate(agents)},
                infos={a: {"clock": 0} for a in agents},
            )
            rllib_s += time.perf_counter() - start
            copies = []
            for t in range(1, args.length + 1):
                start = time.perf_counter()
                last = t == args.length
                episode.add_env_step(
                    {a: obs[t, i] for i, a in enumerate(agents)},
                    {a: int(actions[t - 1, i]) for i, a in enumerate(agents)},
                    {a: 1.0 for a in agents},
                    infos={a: {"clock": t} for a in agents},
                    truncateds={"__all__": last},
                    extra_model_outputs={
                        a: {
                            "action_dist_inputs": logits[t - 1, i],
                            "action_logp": np.float32(-1.0),
                        }
                        for i, a in enumerate(agents)
                    },
                )
                cut = not last and t % args.fragment == 0
                if cut:
                    successor = episode.cut(len_lookback_buffer=1)
                rllib_s += time.perf_counter() - start
                if cut:
                    start = time.perf_counter()
                    copies.append(extract_multi_agent(episode, opts["model_outputs"]))
                    record_s += time.perf_counter() - start
                    episode = successor
            start = time.perf_counter()
            copies.append(extract_multi_agent(episode, opts["model_outputs"]))
            recording.write(episode.id_, copies)
            record_s += time.perf_counter() - start
            agent_steps += args.length * args.agents
        start = time.perf_counter()
        recording.close()
        record_s += time.perf_counter() - start
        written = recording.episodes_written
    print(
        f"{args.episodes} env episodes x {args.agents} agents x {args.length} steps "
        f"(fragment {args.fragment}, obs {args.obs_size} float32, 2 model outputs): "
        f"{written} agent episodes written"
    )
    print(f"rllib episode bookkeeping: {rllib_s / agent_steps * 1e6:.1f} us per agent step")
    per_step = record_s / agent_steps * 1e6
    print(f"recording (copy + join + write + close): {per_step:.1f} us per agent step")


if __name__ == "__main__":
    main()
