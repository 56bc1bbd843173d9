"""rlds's own transformations run on datasets we record (issue 25 item 6).

The `rlds` extra installs rlds 0.1.6: rlds 0.1.7 and 0.1.8 import `reverb` at
`import rlds` (only for `rlds.transformations.pattern_map`), and no dm-reverb
release loads beside TensorFlow 2.16+ (undefined protobuf symbol). 0.1.6 is
the same code without that module. See docs/sharing.md, "The rlds library".
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("tensorflow_datasets")

from rlds_writer import RecordRLDS  # noqa: E402

_CHILD = Path(__file__).resolve().parents[1] / "rlds_library_child.py"

# The rlds library runs in a subprocess with TensorFlow (about 8 s).
pytestmark = pytest.mark.slow


def _record_cartpole(path):
    """Records CartPole with RecordRLDS; returns each episode's observations and rewards."""
    env = RecordRLDS(gym.make("CartPole-v1"), path, name="cartpole", discount=True)
    env.action_space.seed(0)
    obs, _ = env.reset(seed=0)
    episodes, current = [], {"obs": [obs], "reward": [], "terminated": False}
    for _ in range(120):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        current["obs"].append(obs)
        current["reward"].append(reward)
        if terminated or truncated:
            current["terminated"] = terminated
            episodes.append(current)
            obs, _ = env.reset()
            current = {"obs": [obs], "reward": [], "terminated": False}
    env.close()  # the running episode is recorded, cut short
    episodes.append(current)
    # RLDS alignment: the final step holds the last observation and reward 0.
    return [
        {
            "obs": np.asarray(e["obs"], np.float32),
            "reward": np.asarray([*e["reward"], 0.0], np.float64),
            "terminated": e["terminated"],
        }
        for e in episodes
    ]


@pytest.fixture(scope="module")
def rlds_results(tmp_path_factory):
    if importlib.util.find_spec("rlds") is None:
        pytest.skip('rlds is not installed: pip install -e ".[rlds]"')
    path = tmp_path_factory.mktemp("rlds") / "cartpole"
    episodes = _record_cartpole(path)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # A fresh interpreter of this venv: `import rlds` as a user's first import.
    proc = subprocess.run(
        [sys.executable, str(_CHILD), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :]), episodes


def test_import_rlds_works_in_the_project_venv(rlds_results):
    got, _ = rlds_results
    assert Path(got["rlds_file"]).is_relative_to(Path(sys.prefix))


def test_episode_length_and_sums_match_numpy(rlds_results):
    got, episodes = rlds_results
    assert len(episodes) > 3
    lengths = [len(e["obs"]) for e in episodes]
    assert got["lengths"] == lengths
    assert got["lengths_batched"] == lengths
    assert got["reward_sum"] == sum(e["reward"].sum() for e in episodes)
    assert got["returns"] == [e["reward"].sum() for e in episodes]
    all_obs = np.concatenate([e["obs"] for e in episodes]).astype(np.float64)
    np.testing.assert_allclose(got["obs_sum"], all_obs.sum(axis=0), rtol=1e-12)
    assert got["terminal_sum"] == sum(e["terminated"] for e in episodes)
    assert not episodes[-1]["terminated"]  # cut short by close()


def test_batch_mean_std_and_truncate_match_numpy(rlds_results):
    got, episodes = rlds_results
    all_obs = np.concatenate([e["obs"] for e in episodes])
    # batch(size=3, shift=2, drop_remainder=True) over the steps of all episodes.
    want = [all_obs[i : i + 3] for i in range(0, len(all_obs) - 2, 2)]
    assert len(got["batches"]) == len(want)
    for batch, expected in zip(got["batches"], want):
        np.testing.assert_array_equal(np.asarray(batch, np.float32), expected)
    np.testing.assert_allclose(got["mean"], all_obs.astype(np.float64).mean(axis=0), rtol=1e-6)
    # rlds's std is the sample standard deviation (n - 1).
    std = all_obs.astype(np.float64).std(axis=0, ddof=1)
    np.testing.assert_allclose(got["std"], std, rtol=1e-6)
    # truncate_after_condition(is_last): the steps up to the first episode's end.
    assert got["truncated_length"] == len(episodes[0]["obs"])
