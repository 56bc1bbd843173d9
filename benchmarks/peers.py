"""Benchmark: rlds_writer side by side with the tools users would pick instead.

The same deterministic rollouts are recorded by each peer, each measurement in
a fresh process (imports are not timed, but with `--cold`), peers and
repetitions interleaved:

* **ours**: `RecordRLDS` (the Gymnasium wrapper);
* **ours-dm_env**: our `EnvLogger` on the dm_env env envlogger records, as an
  envlogger user switches (catch only: its spec-made config stores 84x84
  frames as PNG);
* **tfds**: TFDS's own `SequentialWriter` fed per-step RLDS dicts (the
  features of `rlds_base.build_info`: `Image` PNG/JPEG, `Tensor` with
  `encoding="bytes"` for raw frames), one `add_examples` per episode;
* **minari**: Minari's `DataCollector` and `create_dataset` (its default:
  image spaces stored as Pillow JPEG, quality 75; `jpeg_encoding=False` for raw);
* **hf**: Hugging Face `datasets.Dataset.from_generator` over the steps
  (`Image` stores PNG), then `save_to_disk`;
* **envlogger**: envlogger's `EnvLogger` (Riegeli backend), in its own venv
  (`--envlogger-python`, or built on first use in `.cache/bench-venvs/`);
* **lerobot**: LeRobot's `LeRobotDataset.create`, `add_frame` per step,
  `save_episode` per episode and `finalize` (Parquet; PNG frames embedded with
  `use_videos=False`, JPEG workloads as its default AV1 video), in its own venv
  (`--lerobot-python`, or built on first use in `.cache/bench-venvs/`: it pins
  its own torch and datasets);
* **plain**: one `write()` per step of the frame's bytes to one open file, the
  physical limit for raw frames;
* **plain-episode**: each frame copied into one reused episode buffer and the
  episode written at its end, in 1 MiB `write()`s: what any format of
  whole-episode records (a TFRecord record, with its length and CRC ahead of
  the data) must do at least. (One multi-MB `write()` per episode was up to 6x
  slower on the benchmark VM's page cache: REPORT.md, "Where the time goes".)

Each peer runs only the workloads it stores like for like (raw with raw, PNG
with PNG, JPEG with JPEG or lossy video):

* **catch**: float32 (10, 5) observation, discrete action;
* **raw84**: uint8 (84, 84, 3) frames stored as raw bytes;
* **png84**: the same frames as lossless PNG;
* **jpeg84**: the same frames as JPEG;
* **cams256**: two uint8 (256, 256, 3) JPEG cameras and a float32 (7,) action
  (the Open X-Embodiment shape).

Per run: *wall* is from creating the dataset to `close()` returning (all on
disk; the env is made before, as a user makes it with or without a recorder,
except in a cold run); *CPU* is the CPU time of the process and of every process it started
(image workers included) over the same span; *env thread* is the time the
loop spends beyond the bare env's loop, per step, before `close()`; *bytes* is
the size of what is left on disk. Three lengths: **fixed** (create, one 1-step
episode, close), **short** (one episode) and **long** (several); *marginal*
is (long - short) / (long steps - short steps).

`--cold` measures instead the fixed run in a process that has imported nothing
but numpy: the clock also runs over the imports of the peer, of its env's
framework and whatever it loads on first use, as for a recording that is the
only one of its process (an evaluation, a test, one episode per process of a
sweep). It writes its own report section.

Usage: `python benchmarks/peers.py [--repetitions 3] [--workloads catch,png84]
[--peers ours,tfds] [--cold] [--report [PATH]]`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
SECTION = "## Side by side with the peers"
COLD_SECTION = "## Cold start: the only recording of a process"

# workload -> (steps per episode, episodes of the long run)
WORKLOADS = {
    "catch": (400, 10),
    "raw84": (400, 10),
    "png84": (400, 10),
    "jpeg84": (400, 10),
    "cams256": (100, 10),
}
PEERS = {
    "ours": ("catch", "raw84", "png84", "jpeg84", "cams256"),
    "tfds": ("catch", "raw84", "png84", "jpeg84", "cams256"),
    "minari": ("catch", "raw84", "jpeg84", "cams256"),
    "hf": ("catch", "raw84", "png84"),
    "envlogger": ("catch", "raw84"),
    "ours-dm_env": ("catch",),
    # LeRobot stores no raw frames: images are PNG files or video.
    "lerobot": ("catch", "png84", "jpeg84", "cams256"),
    "plain": ("raw84",),
    "plain-episode": ("raw84",),
}
# envlogger 1.3's wheel needs glibc 2.38; 1.2 (the version users compared against) needs numpy 1.
ENVLOGGER_REQUIREMENTS = ["envlogger==1.2", "dm-env", "numpy<2", "absl-py", "psutil"]
# LeRobot pins its own torch and datasets; gymnasium for the bare loop.
LEROBOT_REQUIREMENTS = ["lerobot", "gymnasium", "psutil"]


# --------------------------------------------------------------------------- rollouts


class Rollout:
    """A deterministic env without any framework: observations cycle through 16 precomputed ones."""

    def __init__(self, workload: str, steps: int):
        self.workload = workload
        self.horizon = steps
        rng = np.random.default_rng(0)
        if workload == "catch":
            self.obs = [rng.random((10, 5), dtype=np.float32) for _ in range(16)]
        elif workload == "cams256":
            ramp = np.add.outer(np.arange(256), np.arange(256)) // 2
            base = np.stack([ramp, ramp.T, np.full_like(ramp, 128)], axis=-1)
            frames = [
                ((base + 8 * i + rng.integers(0, 6, base.shape)) % 256).astype(np.uint8)
                for i in range(16)
            ]
            self.obs = [
                {"image": frames[i], "wrist_image": frames[(i + 5) % 16]} for i in range(16)
            ]
        else:
            ramp = np.add.outer(np.arange(84), np.arange(84)) * 3 // 2
            base = np.stack([ramp, ramp.T, np.full_like(ramp, 100)], axis=-1)
            self.obs = [
                ((base + 7 * i + rng.integers(0, 4, base.shape)) % 256).astype(np.uint8)
                for i in range(16)
            ]
        self.action = np.zeros(7, np.float32) if workload == "cams256" else 1
        self.t = 0

    def reset(self) -> Any:
        self.t = 0
        return self.obs[0]

    def step(self) -> tuple[Any, float, bool]:
        self.t += 1
        return self.obs[self.t % 16], 1.0, self.t >= self.horizon


def _gym_env(workload: str, steps: int) -> Any:
    import gymnasium as gym

    class Env(gym.Env):
        def __init__(self) -> None:
            self.rollout = Rollout(workload, steps)
            if workload == "catch":
                self.observation_space = gym.spaces.Box(0, 1, (10, 5), np.float32)
            elif workload == "cams256":
                box = gym.spaces.Box(0, 255, (256, 256, 3), np.uint8)
                self.observation_space = gym.spaces.Dict({"image": box, "wrist_image": box})
            else:
                self.observation_space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
            self.action_space = (
                gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
                if workload == "cams256"
                else gym.spaces.Discrete(3)
            )

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            return self.rollout.reset(), {}

        def step(self, action: Any) -> Any:
            obs, reward, done = self.rollout.step()
            return obs, reward, False, done, {}

    return Env()


def _gym_loop(env: Any, episodes: int, action: Any) -> float:
    """Runs the episodes; returns the loop's wall time."""
    start = time.perf_counter()
    for episode in range(episodes):
        env.reset(seed=episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    return time.perf_counter() - start


# The peers that record a dm_env env; the Gymnasium recorders' and the others' bare
# loop is the Gymnasium env's.
_DM_ENV_PEERS = ("envlogger", "ours-dm_env")


def _make_env(peer: str, workload: str, steps: int) -> Any:
    """The env `peer` records: a dm_env or Gymnasium one, or the bare `Rollout`."""
    if peer in _DM_ENV_PEERS:
        return _dm_env(workload, steps)
    if peer in ("ours", "minari"):
        return _gym_env(workload, steps)
    return Rollout(workload, steps)


def _bare_loop(peer: str, workload: str, steps: int, episodes: int) -> float:
    if peer in _DM_ENV_PEERS:
        return _dm_loop(_dm_env(workload, steps), episodes, 1)
    env = _gym_env(workload, steps)
    return _gym_loop(env, episodes, env.rollout.action)


# --------------------------------------------------------------------------- peers


def _run_ours(env: Any, workload: str, episodes: int, out: str) -> float:
    from rlds_writer import RecordRLDS

    encoding = {"raw84": "bytes", "png84": "png"}.get(workload, "jpeg")
    env = RecordRLDS(env, out, name="bench", image_encoding=encoding)
    loop = _gym_loop(env, episodes, env.env.rollout.action)
    env.close()
    return loop


def _tfds_config(workload: str) -> Any:
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    if workload == "catch":
        obs = tfds.features.Tensor(shape=(10, 5), dtype=np.float32)
    elif workload == "raw84":
        obs = tfds.features.Tensor(shape=(84, 84, 3), dtype=np.uint8, encoding="bytes")
    elif workload == "cams256":
        cam = tfds.features.Image(shape=(256, 256, 3), encoding_format="jpeg")
        obs = tfds.features.FeaturesDict({"image": cam, "wrist_image": cam})
    else:
        fmt = "png" if workload == "png84" else "jpeg"
        obs = tfds.features.Image(shape=(84, 84, 3), encoding_format=fmt)
    action = (
        tfds.features.Tensor(shape=(7,), dtype=np.float32) if workload == "cams256" else np.int64
    )
    return rlds_base.DatasetConfig(
        name="bench",
        observation_info=obs,
        action_info=action,
        reward_info=np.float32,
        discount_info=np.float32,
    )


def _run_tfds(env: Any, workload: str, episodes: int, out: str) -> float:
    """TFDS's own path, as a user (or envlogger's TFDS backend) feeds it: one dict per step."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    config = _tfds_config(workload)
    info = rlds_base.build_info(
        config,
        tfds.core.DatasetIdentity(
            name="bench", version=tfds.core.Version("0.0.1"), data_dir=out, module_name=""
        ),
    )
    os.makedirs(out, exist_ok=True)
    writer = tfds.core.SequentialWriter(info, max_examples_per_shard=1000)
    writer.initialize_splits(["train"])
    rollout = env
    zero_action = np.zeros(7, np.float32) if workload == "cams256" else 0
    start = time.perf_counter()
    for _ in range(episodes):
        obs = rollout.reset()
        episode = []
        first, done = True, False
        while not done:
            action = rollout.action
            next_obs, reward, done = rollout.step()
            episode.append(
                {
                    "observation": obs,
                    "action": action,
                    "reward": reward,
                    "discount": 1.0,
                    "is_first": first,
                    "is_last": False,
                    "is_terminal": False,
                }
            )
            obs, first = next_obs, False
        episode.append(
            {
                "observation": obs,
                "action": zero_action,
                "reward": 0.0,
                "discount": 0.0,
                "is_first": False,
                "is_last": True,
                "is_terminal": False,
            }
        )
        writer.add_examples({"train": [{"steps": episode}]})
    loop = time.perf_counter() - start
    writer.close_all()
    return loop


def _run_minari(env: Any, workload: str, episodes: int, out: str) -> float:
    os.environ["MINARI_DATASETS_PATH"] = out
    from minari import DataCollector

    gym_env = env
    # Minari's default stores image spaces as JPEG; raw frames are its non-default.
    env = DataCollector(gym_env, jpeg_encoding=workload != "raw84")
    loop = _gym_loop(env, episodes, gym_env.rollout.action)
    env.create_dataset(dataset_id="bench/rollouts-v0", algorithm_name="bench")
    env.close()
    return loop


def _hf_features(workload: str) -> Any:
    import datasets

    if workload == "catch":
        obs = datasets.Array2D(shape=(10, 5), dtype="float32")
    elif workload == "raw84":
        obs = datasets.Array3D(shape=(84, 84, 3), dtype="uint8")
    else:
        obs = datasets.Image()
    return datasets.Features(
        {
            "episode": datasets.Value("int64"),
            "observation": obs,
            "action": datasets.Value("int64"),
            "reward": datasets.Value("float32"),
            "is_first": datasets.Value("bool"),
            "is_last": datasets.Value("bool"),
            "is_terminal": datasets.Value("bool"),
        }
    )


def _run_hf(env: Any, workload: str, episodes: int, out: str) -> float:
    import datasets

    datasets.disable_progress_bars()
    rollout = env

    def rows() -> Any:
        for episode in range(episodes):
            obs = rollout.reset()
            first, done = True, False
            while not done:
                next_obs, reward, done = rollout.step()
                yield {
                    "episode": episode,
                    "observation": obs,
                    "action": rollout.action,
                    "reward": reward,
                    "is_first": first,
                    "is_last": False,
                    "is_terminal": False,
                }
                obs, first = next_obs, False
            yield {
                "episode": episode,
                "observation": obs,
                "action": 0,
                "reward": 0.0,
                "is_first": False,
                "is_last": True,
                "is_terminal": False,
            }

    cache = out + ".cache"
    start = time.perf_counter()
    ds = datasets.Dataset.from_generator(rows, features=_hf_features(workload), cache_dir=cache)
    loop = time.perf_counter() - start
    ds.save_to_disk(out)
    shutil.rmtree(cache, ignore_errors=True)
    return loop


def _dm_env(workload: str, steps: int) -> Any:
    import dm_env
    from dm_env import specs

    class Env(dm_env.Environment):
        def __init__(self) -> None:
            self.rollout = Rollout(workload, steps)

        def reset(self) -> Any:
            return dm_env.restart(self.rollout.reset())

        def step(self, action: Any) -> Any:
            obs, reward, done = self.rollout.step()
            return dm_env.truncation(reward, obs) if done else dm_env.transition(reward, obs)

        def observation_spec(self) -> Any:
            if workload == "catch":
                return specs.Array((10, 5), np.float32)
            return specs.BoundedArray((84, 84, 3), np.uint8, 0, 255)

        def action_spec(self) -> Any:
            return specs.DiscreteArray(3)

    return Env()


def _dm_loop(env: Any, episodes: int, action: Any) -> float:
    start = time.perf_counter()
    for _ in range(episodes):
        ts = env.reset()
        while not ts.last():
            ts = env.step(action)
    return time.perf_counter() - start


def _run_ours_dm_env(env: Any, workload: str, episodes: int, out: str) -> float:
    import rlds_writer

    env = rlds_writer.EnvLogger(env, data_directory=out)
    loop = _dm_loop(env, episodes, 1)
    env.close()
    return loop


def _run_envlogger(env: Any, workload: str, episodes: int, out: str) -> float:
    import envlogger

    os.makedirs(out, exist_ok=True)
    env = envlogger.EnvLogger(env, data_directory=out)
    loop = _dm_loop(env, episodes, 1)
    env.close()
    return loop


def _lerobot_features(workload: str) -> dict[str, dict[str, Any]]:
    image = ("height", "width", "channels")
    if workload == "catch":
        obs = {"observation.state": {"dtype": "float32", "shape": (10, 5), "names": None}}
    elif workload == "cams256":
        cam = {"dtype": "video", "shape": (256, 256, 3), "names": image}
        obs = {"observation.images.image": cam, "observation.images.wrist_image": dict(cam)}
    else:
        kind = "image" if workload == "png84" else "video"
        obs = {"observation.image": {"dtype": kind, "shape": (84, 84, 3), "names": image}}
    action = (7,) if workload == "cams256" else (1,)
    return {
        **obs,
        "action": {
            "dtype": "float32" if workload == "cams256" else "int64",
            "shape": action,
            "names": None,
        },
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    }


def _run_lerobot(env: Any, workload: str, episodes: int, out: str) -> float:
    """LeRobot's recording path, as its `record` script drives it: a frame per step."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = _lerobot_features(workload)
    dataset = LeRobotDataset.create(
        "bench/rollouts", fps=30, features=features, root=out, use_videos=workload != "png84"
    )
    rollout = env
    if workload == "cams256":
        action = rollout.action
    else:
        action = np.array([rollout.action], np.int64)
    reward = np.ones(1, np.float32)
    start = time.perf_counter()
    for _ in range(episodes):
        obs = rollout.reset()
        done = False
        while not done:
            frame = {"task": "bench", "action": action, "next.reward": reward}
            if workload == "catch":
                frame["observation.state"] = obs
            elif workload == "cams256":
                frame["observation.images.image"] = obs["image"]
                frame["observation.images.wrist_image"] = obs["wrist_image"]
            else:
                frame["observation.image"] = obs
            dataset.add_frame(frame)
            obs, _, done = rollout.step()
        dataset.save_episode()
    loop = time.perf_counter() - start
    dataset.finalize()
    return loop


def _run_plain(env: Any, workload: str, episodes: int, out: str) -> float:
    rollout = env
    os.makedirs(out)
    start = time.perf_counter()
    with open(os.path.join(out, "frames.bin"), "wb") as f:
        for _ in range(episodes):
            f.write(rollout.reset())
            done = False
            while not done:
                obs, _, done = rollout.step()
                f.write(obs)
    return time.perf_counter() - start


def _run_plain_episode(env: Any, workload: str, episodes: int, out: str) -> float:
    rollout = env
    frame = rollout.obs[0].nbytes
    # Reused: only its first episode faults it in.
    episode = bytearray(frame * (rollout.horizon + 1))
    view = memoryview(episode)
    os.makedirs(out)
    start = time.perf_counter()
    with open(os.path.join(out, "frames.bin"), "wb", buffering=0) as f:
        for _ in range(episodes):
            view[:frame] = memoryview(rollout.reset()).cast("B")
            at, done = frame, False
            while not done:
                obs, _, done = rollout.step()
                view[at : at + frame] = memoryview(obs).cast("B")
                at += frame
            for piece in range(0, at, 1 << 20):  # as rlds_writer writes a big record
                f.write(view[piece : min(at, piece + (1 << 20))])
    return time.perf_counter() - start


RUNNERS = {
    "ours": _run_ours,
    "tfds": _run_tfds,
    "minari": _run_minari,
    "hf": _run_hf,
    "envlogger": _run_envlogger,
    "ours-dm_env": _run_ours_dm_env,
    "lerobot": _run_lerobot,
    "plain": _run_plain,
    "plain-episode": _run_plain_episode,
}
_IMPORTS = {
    "ours": (
        "rlds_writer",
        "rlds_writer.record.gymnasium.gymnasium_wrapper",
        "tensorflow",
        "tensorflow_datasets",
        "gymnasium",
    ),
    "tfds": ("tensorflow_datasets", "tensorflow_datasets.rlds.rlds_base", "tensorflow"),
    "minari": ("minari", "gymnasium", "PIL.Image"),
    "hf": ("datasets", "PIL.Image"),
    "envlogger": ("envlogger",),
    "ours-dm_env": ("rlds_writer", "rlds_writer.record.dm_env.env_logger", "dm_env"),
    "lerobot": ("lerobot.datasets.lerobot_dataset", "gymnasium"),
    "plain": (),
    "plain-episode": (),
}


# --------------------------------------------------------------------------- one measurement


def _cpu_seconds(at_start: bool) -> float:
    """CPU of this process and of every process it started, ended or still running.

    The live children are found by a scan of /proc (about 1 ms of CPU): it is
    done before this process's own CPU is read at the start, after it at the
    end, so that the measurement leaves it out.
    """
    # Imported before the clock is read: its first import (10-17 ms) is no peer's cost.
    try:
        import psutil
    except ImportError:
        psutil = None

    def live_children() -> float:
        total = 0.0
        if psutil is not None:
            for child in psutil.Process().children(recursive=True):
                try:
                    times = child.cpu_times()
                except psutil.Error:
                    continue
                total += times.user + times.system
        return total

    live = live_children() if at_start else 0.0
    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime
    return total + (live if at_start else live_children())


def _disk_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def child(
    peer: str, workload: str, steps: int, episodes: int, out: str, cold: bool = False
) -> dict[str, Any]:
    """One measurement, in this (fresh) process; `cold` times the imports too."""
    import importlib

    bare = None
    if not cold:
        for module in _IMPORTS[peer]:
            importlib.import_module(module)
        bare = _bare_loop(peer, workload, steps, episodes)
    # The env is made before the clock: a user makes it with or without a
    # recorder (a Gymnasium env costs about 0.3 ms more to make than the dm_env
    # one). A cold run times it too, as it times the imports.
    env = None if cold else _make_env(peer, workload, steps)
    # numpy's OpenBLAS threads spin for about 50 ms after its import: that CPU is
    # not the peer's (a peer with quick imports would otherwise be charged it).
    time.sleep(0.1)
    cpu0, wall0 = _cpu_seconds(at_start=True), time.perf_counter()
    if env is None:
        env = _make_env(peer, workload, steps)
    loop = RUNNERS[peer](env, workload, episodes, out)
    wall = time.perf_counter() - wall0
    cpu = _cpu_seconds(at_start=False) - cpu0
    return {
        "wall": wall,
        "cpu": cpu,
        "env_wait": max(loop - bare, 0.0) if bare is not None else None,
        "bytes": _disk_bytes(out),
        "steps": steps * episodes,
    }


def _peer_python(cache: str, peer: str, requirements: list[str]) -> str | None:
    """The python of `peer`'s own venv under `cache`, built on first use; None if it cannot be."""
    venv = os.path.join(cache, peer)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        try:
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            subprocess.run(
                [python, "-m", "pip", "install", "-q", *requirements],
                check=True,
                timeout=1800,
            )
        except (subprocess.SubprocessError, OSError) as e:
            print(f"{peer}: no venv ({e}); not measured", file=sys.stderr)
            shutil.rmtree(venv, ignore_errors=True)
            return None
    return python


def _measure(
    python: str, peer: str, workload: str, steps: int, episodes: int, cold: bool = False
) -> dict | None:
    with tempfile.TemporaryDirectory(prefix="rlds_peers_") as tmp:
        args = [python, os.path.abspath(__file__), "--child", peer, workload, str(steps)]
        args += [str(episodes), os.path.join(tmp, "out")] + (["--cold"] if cold else [])
        # Bytecode cached as in an installed package (an editable install of
        # rlds_writer would otherwise compile its lazily imported modules in
        # every timed run where the environment sets PYTHONDONTWRITEBYTECODE).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        done = subprocess.run(args, capture_output=True, text=True, timeout=1800, env=env)
        if done.returncode:
            print(f"{peer} {workload}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            return None
        return json.loads(done.stdout.strip().splitlines()[-1])


def _lengths(workload: str, quick: bool = False) -> dict[str, tuple[int, int]]:
    steps, episodes = WORKLOADS[workload]
    if quick:
        steps, episodes = steps // 4, 3
    return {"fixed": (1, 1), "short": (steps, 1), "long": (steps, episodes)}


# --------------------------------------------------------------------------- report


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _rows(results: dict[tuple[str, str, str], list[dict]], quick: bool) -> list[str]:
    lines = []
    for workload in WORKLOADS:
        peers = [p for p in PEERS if results.get((p, workload, "long"))]
        if not peers:
            continue
        steps, episodes = _lengths(workload, quick)["long"]
        lines += [
            "",
            f"**{workload}** (short: 1 × {steps} steps, long: {episodes} × {steps} steps)",
            "",
            "| peer | fixed ms wall / CPU | short µs/step wall / CPU | long µs/step wall / CPU "
            "| marginal µs/step wall / CPU | env thread µs/step | bytes/step "
            "| short wall, CPU vs ours | long wall, CPU vs ours |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        per: dict[str, dict[str, float]] = {}
        for peer in peers:
            m: dict[str, float] = {}
            for length in ("fixed", "short", "long"):
                runs = results.get((peer, workload, length)) or []
                if runs:
                    n = runs[0]["steps"]
                    m[f"{length}_wall"] = _median(runs, "wall")
                    m[f"{length}_cpu"] = _median(runs, "cpu")
                    m[f"{length}_steps"] = n
                    if length == "long":
                        m["env"] = _median(runs, "env_wait") / n * 1e6
                        m["bytes"] = _median(runs, "bytes") / n
            per[peer] = m
        for peer in peers:
            m, ours = per[peer], per.get("ours", {})

            def us(length: str, kind: str, m: dict[str, float] = m) -> float:
                return m[f"{length}_{kind}"] / m[f"{length}_steps"] * 1e6

            def marginal(kind: str, m: dict[str, float] = m) -> float:
                dn = m["long_steps"] - m["short_steps"]
                return (m[f"long_{kind}"] - m[f"short_{kind}"]) / dn * 1e6

            def vs(length: str, m: dict[str, float] = m, ours: dict = ours) -> str:
                if not ours or f"{length}_wall" not in m:
                    return "—"
                return (
                    f"{m[f'{length}_wall'] / ours[f'{length}_wall']:.2f}×, "
                    f"{m[f'{length}_cpu'] / ours[f'{length}_cpu']:.2f}×"
                )

            fixed = (
                f"{m['fixed_wall'] * 1e3:.0f} / {m['fixed_cpu'] * 1e3:.0f}"
                if "fixed_wall" in m
                else "—"
            )
            short = (
                f"{us('short', 'wall'):.0f} / {us('short', 'cpu'):.0f}"
                if "short_wall" in m
                else "—"
            )
            lines.append(
                f"| {peer} | {fixed} | {short} "
                f"| {us('long', 'wall'):.0f} / {us('long', 'cpu'):.0f} "
                + (
                    f"| {marginal('wall'):.0f} / {marginal('cpu'):.0f} "
                    if "short_wall" in m
                    else "| — "
                )
                + f"| {m['env']:.1f} | {m['bytes']:,.0f} | {vs('short')} | {vs('long')} |"
            )
    return lines


def report(results: dict, repetitions: int, command: str, quick: bool = False) -> str:
    import platform

    lines = [
        SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. Medians of "
        f"{repetitions} interleaved repetitions, each run in a fresh process "
        "(imports, and making the env, not timed). Wall: create to `close()` returned; "
        "CPU: the process and "
        "every process it started (image workers included); env thread: what the loop "
        "spends beyond the bare env, per step; bytes: on disk per step. Ratios are the "
        "peer's time over ours (above 1: we are faster). Peers run only the workloads "
        "they store like for like (see `benchmarks/peers.py`).",
    ]
    lines += _rows(results, quick)
    missing = [p for p in PEERS if not any(k[0] == p for k in results)]
    if missing:
        lines += ["", f"Not measured in this run: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def cold_report(results: dict, repetitions: int, command: str) -> str:
    """The cold-start section: one row per peer, one column per workload."""
    import platform

    workloads = [w for w in WORKLOADS if any(k[1] == w for k in results)]
    lines = [
        COLD_SECTION,
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. Medians of "
        f"{repetitions} interleaved repetitions. Each is a 1-step recording (create, one "
        "episode, close) in a fresh process that has imported only numpy: the clock runs "
        "over the imports of the peer and of its env's framework (gymnasium or dm_env) "
        "and over whatever it loads on first use. ms wall / CPU; ratios are the peer's "
        "wall time over ours (`RecordRLDS`, which pays gymnasium's import); envlogger "
        "records a dm_env env, as ours-dm_env does.",
        "",
        "| peer | " + " | ".join(workloads) + " |",
        "|---|" + "---|" * len(workloads),
    ]
    for peer in PEERS:
        cells = []
        for workload in workloads:
            runs = results.get((peer, workload, "cold"))
            ours = results.get(("ours", workload, "cold"))
            if not runs:
                cells.append("—")
                continue
            wall, cpu = _median(runs, "wall"), _median(runs, "cpu")
            ratio = f" ({wall / _median(ours, 'wall'):.2f}×)" if ours and peer != "ours" else ""
            cells.append(f"{wall * 1e3:.0f} / {cpu * 1e3:.0f}{ratio}")
        if any(c != "—" for c in cells):
            lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--envlogger-python", help="python of a venv with envlogger installed")
    parser.add_argument("--lerobot-python", help="python of a venv with lerobot installed")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="only the fixed run, imports timed, in its own report section",
    )
    sys.path.insert(0, _HERE)
    from report_sections import add_report_argument, write_section

    add_report_argument(parser)
    args = parser.parse_args()
    if args.child:
        peer, workload, steps, episodes, out = args.child
        print(json.dumps(child(peer, workload, int(steps), int(episodes), out, args.cold)))
        return
    workloads = [w for w in args.workloads.split(",") if w]
    peers = [p for p in args.peers.split(",") if p]
    pythons = {p: sys.executable for p in peers}
    cache = os.path.join(os.path.dirname(_HERE), ".cache", "bench-venvs")
    for peer, given, requirements in (
        ("envlogger", args.envlogger_python, ENVLOGGER_REQUIREMENTS),
        ("lerobot", args.lerobot_python, LEROBOT_REQUIREMENTS),
    ):
        if peer in peers:
            python = given or _peer_python(cache, peer, requirements)
            if python:
                pythons[peer] = python
            else:
                peers.remove(peer)
    results: dict[tuple[str, str, str], list[dict]] = {}
    for rep in range(args.repetitions):
        for workload in workloads:
            lengths = _lengths(workload, args.quick)
            if args.cold:
                lengths = {"cold": lengths["fixed"]}
            for length, (steps, episodes) in lengths.items():
                for peer in peers:
                    if workload not in PEERS[peer]:
                        continue
                    r = _measure(pythons[peer], peer, workload, steps, episodes, args.cold)
                    print(f"rep {rep} {workload} {length} {peer}: {r}", file=sys.stderr)
                    if r:
                        results.setdefault((peer, workload, length), []).append(r)
    command = "python benchmarks/peers.py " + " ".join(sys.argv[1:])
    if args.cold:
        text = cold_report(results, args.repetitions, command.strip())
    else:
        text = report(results, args.repetitions, command.strip(), args.quick)
    if args.report:
        write_section(args.report, COLD_SECTION if args.cold else SECTION, text)
    print(text)


if __name__ == "__main__":
    main()
