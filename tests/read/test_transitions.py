"""Transitions from the TF-free reader: terminated, truncated, one-step and cut-short episodes."""

from __future__ import annotations

import numpy as np
import pytest

from rlds_writer import open_dataset
from rlds_writer.interop.episodes import SourceEpisode, write_episodes


def _episode(n_obs: int, start: float, terminated: bool, end: str | None = None) -> SourceEpisode:
    obs = {"pos": start + np.arange(n_obs, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)}
    meta = {"end": end} if end else {}
    return SourceEpisode(
        observations=obs,
        actions=np.arange(n_obs - 1, dtype=np.int64) + int(start),
        rewards=np.full(n_obs - 1, start, np.float32),
        terminated=terminated,
        step_metadata={"tick": np.arange(n_obs, dtype=np.int32)},
        episode_metadata=meta,
    )


EPISODES = [
    _episode(4, 100.0, True, "terminated"),  # 3 transitions, terminated
    _episode(3, 200.0, False, "truncated"),  # 2 transitions, truncated
    _episode(1, 300.0, False, "truncated"),  # reset only: no transition
    _episode(3, 400.0, False, "cut_short"),  # the recorder ended it
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("transitions") / "ds"
    write_episodes(lambda: iter(EPISODES), path, name="toy", source="test", max_episodes_per_file=2)
    return open_dataset(path).episodes("train")


def test_transitions_follow_rlds_steps_and_never_cross_episodes(dataset):
    rows = list(dataset.transitions())
    assert len(rows) == 3 + 2 + 2
    first = rows[0]
    assert set(first) >= {"observation", "action", "reward", "next_observation", "terminated"}
    np.testing.assert_array_equal(first["observation"]["pos"], [100, 100])
    np.testing.assert_array_equal(first["next_observation"]["pos"], [101, 101])
    # the last transition of episode 0 ends on its final, observation-only step
    np.testing.assert_array_equal(rows[2]["next_observation"]["pos"], [103, 103])
    # and episode 1 starts from its own first observation, not episode 0's last
    np.testing.assert_array_equal(rows[3]["observation"]["pos"], [200, 200])
    assert [int(r["action"]) for r in rows] == [100, 101, 102, 200, 201, 400, 401]
    assert rows[0]["step_metadata"]["tick"] == 0 and rows[0]["next_step_metadata"]["tick"] == 1


def test_terminated_and_truncated_only_on_each_episodes_last_transition(dataset):
    rows = list(dataset.transitions())
    assert [bool(r["terminated"]) for r in rows] == [False, False, True, False, False, False, False]
    assert [bool(r["truncated"]) for r in rows] == [False, False, False, False, True, False, True]


def test_cut_short_episodes_kept_as_truncated_or_dropped(dataset):
    kept = dataset.qlearning_dataset()
    dropped = dataset.qlearning_dataset(cut_short="drop")
    assert len(kept["rewards"]) == 7 and len(dropped["rewards"]) == 5
    assert 400 not in dropped["actions"]
    assert kept["timeouts"].tolist()[-1] is True
    with pytest.raises(ValueError, match="cut_short must be one of"):
        dataset.qlearning_dataset(cut_short="silently")


def test_qlearning_dataset_has_d4rl_names_and_episode_ids(dataset):
    q = dataset.qlearning_dataset()
    assert set(q) == {
        "observations",
        "actions",
        "next_observations",
        "rewards",
        "terminals",
        "timeouts",
        "discounts",
        "episode_ids",
    }
    assert q["observations"]["pos"].shape == (7, 2)
    np.testing.assert_array_equal(
        q["next_observations"]["pos"][:, 0], [101, 102, 103, 201, 202, 401, 402]
    )
    assert q["episode_ids"].tolist() == [0, 0, 0, 1, 1, 3, 3]
    # dm_env convention: discount 0 on a terminated episode's last transition
    assert q["discounts"].tolist() == [1, 1, 0, 1, 1, 1, 1]


def test_one_step_episode_gives_no_batch(dataset):
    batches = list(dataset.transition_batches())
    assert [len(b["reward"]) for b in batches] == [3, 2, 2]


def test_recorded_cartpole_pairs_gymnasium_steps(tmp_path):
    gym = pytest.importorskip("gymnasium")
    from rlds_writer import RecordRLDS

    env = RecordRLDS(gym.make("CartPole-v1", max_episode_steps=15), tmp_path / "cp", name="cp")
    expected = []
    obs, _ = env.reset(seed=3)
    env.action_space.seed(3)
    for _ in range(40):
        action = env.action_space.sample()
        nxt, reward, terminated, truncated, _ = env.step(action)
        expected.append((obs, action, reward, nxt, terminated, truncated))
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()  # the episode in progress ends cut short: kept as truncated
    eps = open_dataset(tmp_path / "cp").episodes("train")
    rows = list(eps.transitions())
    assert len(rows) == len(expected)
    for row, (o, a, r, n, te, tr) in zip(rows, expected):
        np.testing.assert_array_equal(row["observation"], o)
        np.testing.assert_array_equal(row["next_observation"], n)
        assert row["action"] == a and row["reward"] == r
        assert bool(row["terminated"]) == te
        # RLDS keeps termination only when the env reported both; the last
        # episode, cut short by close(), reads as truncated
        assert bool(row["truncated"]) == ((tr and not te) or row is rows[-1])


def test_torch_transition_dataset_batches(dataset):
    torch = pytest.importorskip("torch")
    from rlds_writer.read.torch_transitions import TransitionDataset

    ds = TransitionDataset(dataset)
    assert len(ds) == 7
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["observation"]["pos"].shape == (4, 2)
    assert batch["terminated"].tolist() == [False, False, True, False]
    assert batch["next_observation"]["pos"][2, 0].item() == 103
