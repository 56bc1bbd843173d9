"""Recording real Gymnasium envs: the loaded dataset equals a reference rollout.

Each test runs the same env, seeds and actions twice: once bare (the
reference), once through the recording wrapper; the dataset is then loaded
with `tfds.builder_from_directory` and compared step by step.
"""

from __future__ import annotations

import json
import os
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds
from gymnasium import spaces

from rlds_writer.errors import StepValueError
from rlds_writer.record.gymnasium import RecordRLDS

# ----------------------------------------------------------------- helpers


def load(path: Any, split: str = "train") -> list[dict[str, Any]]:
    builder = tfds.builder_from_directory(os.fspath(path))
    out = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split)):
        episode = dict(episode)
        episode["steps"] = [dict(s) for s in episode["steps"]]
        out.append(episode)
    return out


def rollout(env: gym.Env, seeds: list[int], actions: list[list[Any]], max_steps: int = 10_000):
    """Plays one episode per seed with the given actions; returns the episodes.

    Each episode is a dict with `obs` (o_0..o_T), `actions`, `rewards`,
    `infos` (reset info first), `terminated`, `truncated`.
    """
    episodes = []
    for seed, acts in zip(seeds, actions):
        obs, info = env.reset(seed=seed)
        ep = {"obs": [obs], "actions": [], "rewards": [], "infos": [info]}
        terminated = truncated = False
        for a in acts[:max_steps]:
            obs, r, terminated, truncated, info = env.step(a)
            ep["obs"].append(obs)
            ep["actions"].append(a)
            ep["rewards"].append(r)
            ep["infos"].append(info)
            if terminated or truncated:
                break
        ep["terminated"], ep["truncated"] = terminated, truncated
        episodes.append(ep)
    return episodes


def action_lists(space: gym.Space, n_episodes: int, length: int, seed: int) -> list[list[Any]]:
    space.seed(seed)
    return [[space.sample() for _ in range(length)] for _ in range(n_episodes)]


def assert_nested_equal(got: Any, want: Any, path: str = "") -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            assert_nested_equal(got[k], want[k], f"{path}/{k}")
        return
    if isinstance(want, str):
        assert got == want.encode(), path
        return
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=path)


def zero_like(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: zero_like(v) for k, v in value.items()}
    return np.zeros_like(np.asarray(value))


def assert_episode_matches(
    got: dict[str, Any],
    want: dict[str, Any],
    convert_obs: Any = lambda o: o,
    convert_action: Any = lambda a: a,
    reward_dtype: Any = np.float32,
) -> None:
    steps = got["steps"]
    n = len(want["obs"])
    assert len(steps) == n
    for t, step in enumerate(steps):
        assert_nested_equal(step["observation"], convert_obs(want["obs"][t]), f"obs[{t}]")
        assert step["is_first"] == (t == 0)
        assert step["is_last"] == (t == n - 1)
        if t < n - 1:
            assert_nested_equal(step["action"], convert_action(want["actions"][t]), f"a[{t}]")
            assert step["reward"] == np.asarray(want["rewards"][t], dtype=reward_dtype)
            assert not step["is_terminal"]
        else:
            # The final step holds zeros for the transition fields.
            assert_nested_equal(
                step["action"], zero_like(convert_action(want["actions"][0])), "a[T]"
            )
            assert step["reward"] == 0
            assert step["is_terminal"] == want["terminated"]


# ----------------------------------------------------------------- classic control


def test_cartpole_episodes_equal_reference_rollout(tmp_path):
    seeds = [3, 4, 5]
    actions = action_lists(gym.make("CartPole-v1").action_space, 3, 500, seed=0)
    want = rollout(gym.make("CartPole-v1"), seeds, actions)

    env = RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds", name="cartpole")
    rollout(env, seeds, actions)
    env.close()

    got = load(tmp_path / "ds")
    assert len(got) == 3
    for g, w in zip(got, want):
        assert w["terminated"]
        assert_episode_matches(g, w)
    info = json.loads((tmp_path / "ds" / "features.json").read_text())
    assert "discount" not in json.dumps(info)


def test_pendulum_truncation_sets_is_last_but_not_is_terminal(tmp_path):
    make = lambda: gym.make("Pendulum-v1", max_episode_steps=25)  # noqa: E731
    seeds = [1, 2]
    actions = action_lists(make().action_space, 2, 25, seed=1)
    want = rollout(make(), seeds, actions)

    env = RecordRLDS(make(), tmp_path / "ds", discount=True)
    rollout(env, seeds, actions)
    env.close()

    got = load(tmp_path / "ds")
    assert [len(e["steps"]) for e in got] == [26, 26]
    for g, w in zip(got, want):
        assert w["truncated"] and not w["terminated"]
        assert_episode_matches(g, w)
        assert not g["steps"][-1]["is_terminal"]
        # Discount is 1.0 on every transition of a truncated episode; 0 on the last step.
        assert [s["discount"] for s in g["steps"]] == [1.0] * 25 + [0.0]


def test_discount_is_zero_on_termination_when_asked(tmp_path):
    env = RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds", discount=True)
    actions = action_lists(env.action_space, 1, 500, seed=2)
    rollout(env, [0], actions)
    env.close()
    (episode,) = load(tmp_path / "ds")
    discounts = [s["discount"] for s in episode["steps"]]
    assert discounts[:-2] == [1.0] * (len(discounts) - 2)
    assert discounts[-2] == 0.0  # the transition that terminated
    assert episode["steps"][-1]["is_terminal"]


# ----------------------------------------------------------------- custom envs


class _DictEnv(gym.Env):
    """Dict observations mixing every supported space; info carries custom data."""

    def __init__(self, length: int = 6):
        self.length = length
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "grid": spaces.MultiBinary(4),
                "mode": spaces.Discrete(3),
                "pair": spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (3,), np.float64))),
                "label": spaces.Text(max_length=6),
            }
        )
        self.action_space = spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        self.t = 0
        return self.observation_space.sample(), {"station": "inlet", "load": 0.0}

    def step(self, action):
        self.t += 1
        info = {"station": f"st{self.t}", "load": float(self.t) / 2, "jam": self.t % 2 == 0}
        terminated = self.t == self.length
        return self.observation_space.sample(), float(action.sum()), terminated, False, info


def _tuple_to_dict(obs):
    out = dict(obs)
    out["pair"] = {"0": obs["pair"][0], "1": obs["pair"][1]}
    return out


def test_dict_observation_env_records_every_space_and_info_keys(tmp_path):
    seeds = [10, 11]
    actions = action_lists(_DictEnv().action_space, 2, 6, seed=3)
    want = rollout(_DictEnv(), seeds, actions)

    env = RecordRLDS(
        _DictEnv(),
        tmp_path / "ds",
        info_keys=["station", "load", "jam"],
        info_defaults={"jam": False},
        episode_fn=lambda o, a, r, te, tr, info: {"last_station": info["station"]},
    )
    rollout(env, seeds, actions)
    env.close()

    features = tfds.builder_from_directory(os.fspath(tmp_path / "ds")).info.features
    steps = features["steps"].feature
    assert steps["observation"]["pair"]["1"].dtype == np.float64
    assert steps["station"].__class__.__name__ == "Text"
    assert steps["load"].dtype == np.float32
    assert steps["jam"].dtype == np.bool_
    got = load(tmp_path / "ds")
    for g, w in zip(got, want):
        assert_episode_matches(g, w, convert_obs=_tuple_to_dict)
        # The reset info belongs to step 0; each step's info to the step it opened.
        assert [s["station"] for s in g["steps"]] == [i["station"].encode() for i in w["infos"]]
        assert [s["load"] for s in g["steps"]] == [np.float32(i["load"]) for i in w["infos"]]
        assert [s["jam"] for s in g["steps"]] == [i.get("jam", False) for i in w["infos"]]
        assert g["last_station"] == b"st6"


def test_missing_info_key_without_default_names_key_and_step(tmp_path):
    env = RecordRLDS(_DictEnv(), tmp_path / "ds", info_keys=["jam"])
    with pytest.raises(StepValueError, match=r"steps/jam: info key 'jam' is missing at step 0"):
        env.reset(seed=0)
    env.close()


def test_step_fn_sees_reset_with_action_none(tmp_path):
    calls = []

    def step_fn(obs, action, reward, terminated, truncated, info):
        calls.append(action is None)
        return {"has_action": action is not None, "x": np.asarray(obs[:2], np.float32)}

    env = RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds", step_fn=step_fn)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(0)
    env.close()  # cut short: is_last without is_terminal
    (episode,) = load(tmp_path / "ds")
    assert [s["has_action"] for s in episode["steps"]] == [False, True, True, True]
    assert calls[0] and not any(calls[1:])
    np.testing.assert_array_equal(episode["steps"][-1]["x"], obs[:2])
    assert episode["steps"][-1]["is_last"] and not episode["steps"][-1]["is_terminal"]


class _ImageEnv(gym.Env):
    """uint8 (16, 16, 3) image observations."""

    observation_space = spaces.Box(0, 255, (16, 16, 3), np.uint8)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return self.np_random.integers(0, 256, (16, 16, 3), dtype=np.uint8)

    def step(self, action):
        self.t += 1
        return self._obs(), 0.5 * action, False, self.t >= 7, {}


@pytest.mark.parametrize("image_encoding", ["png", "bytes"])
def test_image_observations_are_png_images_by_default_and_exact(tmp_path, image_encoding):
    # The default changed from a bytes-encoded Tensor to a PNG Image (issue 12).
    seeds = [0, 1, 2]
    actions = action_lists(_ImageEnv.action_space, 3, 7, seed=4)
    want = rollout(_ImageEnv(), seeds, actions)

    kwargs = {} if image_encoding == "png" else {"image_encoding": image_encoding}
    env = RecordRLDS(_ImageEnv(), tmp_path / "ds", **kwargs)
    rollout(env, seeds, actions)
    env.close()

    obs_feature = tfds.builder_from_directory(os.fspath(tmp_path / "ds")).info.features["steps"]
    observation = obs_feature.feature["observation"]
    if image_encoding == "png":
        assert isinstance(observation, tfds.features.Image)
        assert observation.encoding_format == "png"
    else:
        assert "bytes" in str(observation._encoding).lower()
    got = load(tmp_path / "ds")
    assert len(got) == 3
    for g, w in zip(got, want):
        assert_episode_matches(g, w)


def test_user_features_override_the_inferred_ones(tmp_path):
    env = RecordRLDS(
        _ImageEnv(),
        tmp_path / "ds",
        image_encoding="zlib",
        reward_info=tfds.features.Scalar(np.float64),
        info_keys=["k"],
        info_defaults={"k": 0},
        step_metadata_info={"k": tfds.features.Scalar(np.int32)},
    )
    env.reset(seed=0)
    env.step(1)
    env.close()
    steps = tfds.builder_from_directory(os.fspath(tmp_path / "ds")).info.features["steps"].feature
    assert "zlib" in str(steps["observation"]._encoding).lower()
    assert steps["reward"].dtype == np.float64
    assert steps["k"].dtype == np.int32


def test_existing_dataset_is_not_overwritten_silently(tmp_path):
    from rlds_writer.errors import DatasetExistsError

    env = RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds")
    env.reset(seed=0)
    env.close()
    with pytest.raises(DatasetExistsError):
        RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds")
    env = RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds", mode="append")
    env.reset(seed=1)
    env.close()
    assert len(load(tmp_path / "ds")) == 2


def test_core_imports_without_gymnasium_or_ray():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('gymnasium', 'ray'):\n"
        "    sys.modules[m] = None  # makes `import m` fail\n"
        "import rlds_writer, rlds_writer.record, rlds_writer.record.spaces\n"
        "import rlds_writer.record.recorder, rlds_writer.store.writing.writer\n"
        "try:\n"
        "    rlds_writer.RecordRLDS\n"
        "except ImportError as e:\n"
        "    print('needs', e.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "needs gymnasium"


def test_reset_mid_episode_records_it_cut_short(tmp_path):
    env = RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds")
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    env.reset(seed=1)
    env.step(1)
    env.close()
    first, second = load(tmp_path / "ds")
    assert len(first["steps"]) == 4 and len(second["steps"]) == 2
    for episode in (first, second):
        assert episode["steps"][-1]["is_last"] and not episode["steps"][-1]["is_terminal"]


def test_types_inferred_mid_episode_when_the_first_episode_is_long(tmp_path):
    # The dataset is created after `infer_max_steps` buffered steps, mid-episode.
    env = RecordRLDS(
        gym.make("CartPole-v1"),
        tmp_path / "ds",
        step_fn=lambda obs, action, reward, te, tr, info: {"a": -1 if action is None else action},
        infer_max_steps=5,
    )
    actions = action_lists(env.action_space, 2, 500, seed=5)
    want = rollout(gym.make("CartPole-v1"), [0, 1], actions)
    assert len(want[0]["obs"]) > 6
    env.reset(seed=0)
    for a in actions[0][:4]:
        env.step(a)
    assert env.recorder.ready  # 5 steps buffered: the writer exists, the episode goes on
    for a in actions[0][4 : len(want[0]["actions"])]:
        env.step(a)
    rollout(env, [1], actions[1:])
    env.close()
    got = load(tmp_path / "ds")
    for g, w in zip(got, want):
        assert_episode_matches(g, w)
        assert [s["a"] for s in g["steps"]] == [-1] + [int(a) for a in w["actions"]]


def test_mode_error_is_checked_when_the_wrapper_is_created_even_when_features_are_inferred(
    tmp_path,
):
    import rlds_writer

    first = rlds_writer.RecordRLDS(gym.make("CartPole-v1"), tmp_path / "ds")
    first.reset(seed=0)
    first.step(0)
    first.close()
    with pytest.raises(rlds_writer.errors.DatasetExistsError, match="mode='append'"):
        # step_fn's features are inferred from the first episode: the writer
        # comes later, but the taken directory is refused now.
        rlds_writer.RecordRLDS(
            gym.make("CartPole-v1"), tmp_path / "ds", step_fn=lambda *a: {"x": 1}
        )
