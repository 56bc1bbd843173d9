"""PyTorch datasets over RLDS datasets (`rlds_writer.read.torch_data`), with real DataLoaders."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rlds_writer  # noqa: E402
from rlds_writer.read import reader as reader_lib  # noqa: E402
from rlds_writer.read.torch_data import (  # noqa: E402
    EpisodeDataset,
    RLDSIterableDataset,
    WindowDataset,
    collate,
    to_tensors,
)


@pytest.fixture(scope="module")
def catch_path(tmp_path_factory):
    """Catch episodes over 3 shard files, with an episode id in the metadata."""
    path = tmp_path_factory.mktemp("catch")
    env = rlds_writer.Catch(rows=6, columns=3, seed=5)
    config = rlds_writer.config_from_env(env, name="catch")
    with rlds_writer.TFDSBackendWriter(path, config, max_episodes_per_file=3) as backend:
        logger = rlds_writer.EnvLogger(env, backend=backend)
        rng = np.random.default_rng(1)
        for _ in range(8):
            ts = logger.reset()
            while not ts.last():
                ts = logger.step(np.int64(rng.integers(0, 3)))
    return path


def _fingerprint(observation_column) -> float:
    return float(np.asarray(observation_column, dtype=np.float64).sum())


def test_iterable_dataset_with_two_workers_reads_every_episode_once(catch_path):
    episodes = reader_lib.open_dataset(catch_path)["train"]
    expected = sorted(_fingerprint(e["steps"]["observation"]) for e in episodes)
    dataset = RLDSIterableDataset(catch_path, unit="episodes", transform=to_tensors)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    seen = [_fingerprint(e["steps"]["observation"].numpy()) for e in loader]
    assert sorted(seen) == expected
    assert len(seen) == 8


def test_iterable_step_batches_with_two_workers_cover_all_steps(catch_path):
    ds = reader_lib.open_dataset(catch_path)
    total = ds.num_steps("train")
    dataset = RLDSIterableDataset(catch_path, unit="steps", batch_size=7)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, collate_fn=to_tensors
    )
    batches = list(loader)
    assert sum(len(b["reward"]) for b in batches) == total
    assert all(isinstance(b["observation"], torch.Tensor) for b in batches)
    assert batches[0]["observation"].shape[1:] == (6, 3)
    assert sum(int(b["is_first"].sum()) for b in batches) == 8
    assert all(len(b["reward"]) <= 7 for b in batches)


def test_single_steps_batched_by_the_dataloader_with_collate(catch_path):
    dataset = RLDSIterableDataset(catch_path, split="train[:4]", unit="steps")
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, collate_fn=collate, num_workers=2)
    batches = list(loader)
    total = reader_lib.open_dataset(catch_path).num_steps("train[:4]")
    assert sum(b["action"].shape[0] for b in batches) == total
    assert batches[0]["is_first"].dtype == torch.bool
    assert batches[0]["observation"].dtype == torch.float32


def test_workers_split_by_shard_file_and_by_range_when_files_are_few(catch_path):
    episodes = reader_lib.open_dataset(catch_path)["train"]
    assert len(episodes.files()) == 3
    parts = [episodes.partition(i, 2) for i in range(2)]
    assert [len(p.files()) for p in parts] == [2, 1]  # whole files when there are enough
    parts = [episodes.partition(i, 5) for i in range(5)]
    assert sum(len(p) for p in parts) == 8 and all(len(p) > 0 for p in parts)


def test_windows_dataset_with_shuffling_dataloader(catch_path):
    dataset = WindowDataset(catch_path, size=3, stride=1)
    episodes = reader_lib.open_dataset(catch_path)["train"]
    lengths = episodes.episode_lengths()
    assert len(dataset) == int(np.maximum(0, lengths - 2).sum())
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, shuffle=True, num_workers=2, collate_fn=collate
    )
    count = 0
    for batch in loader:
        obs = batch["observation"]
        assert obs.shape[1:] == (3, 6, 3)
        first = batch["is_first"]
        assert not first[:, 1:].any() and not batch["is_last"][:, :-1].any()
        count += obs.shape[0]
    assert count == len(dataset)
    episode, start = dataset.index[5]
    window = dataset[5]
    ref = episodes[int(episode)]["steps"]["reward"][start : start + 3]
    assert np.array_equal(window["reward"], ref)


def test_episode_dataset_collates_episodes_of_different_lengths(tmp_path):
    from helpers_core import EpisodeSpec, write_with_rlds_writer

    config = rlds_writer.DatasetConfig(
        name="var",
        observation_info=np.float32,
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
        episode_metadata_info={"name": rlds_writer_text()},
    )
    episodes = [
        EpisodeSpec(
            observations=[np.float32(t) for t in range(n + 1)],
            actions=[np.int64(1)] * n,
            rewards=[np.float32(0.5)] * n,
            discounts=[np.float32(1)] * n,
            episode_metadata={"name": f"ep{n}"},
        )
        for n in (1, 3, 3)
    ]
    write_with_rlds_writer(tmp_path, config, episodes)
    dataset = EpisodeDataset(tmp_path)
    assert len(dataset) == 3
    batch = collate([dataset[0], dataset[1]])
    assert isinstance(batch["steps"]["observation"], list)  # lengths 2 and 4 differ
    assert batch["name"] == [b"ep1", b"ep3"]
    same = collate([dataset[1], dataset[2]])
    assert same["steps"]["observation"].shape == (2, 4)


def rlds_writer_text():
    import tensorflow_datasets as tfds

    return tfds.features.Text()


def test_episode_dataset_in_forked_workers_after_the_parent_read_by_index(catch_path):
    episodes = reader_lib.open_dataset(catch_path)["train"]
    expected = [_fingerprint(episodes[i]["steps"]["observation"]) for i in range(len(episodes))]
    dataset = EpisodeDataset(episodes)  # its files are already open in this process
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, shuffle=True, num_workers=2, collate_fn=to_tensors
    )
    got = sorted(_fingerprint(e["steps"]["observation"].numpy()) for e in loader)
    assert got == sorted(expected)


def test_set_epoch_reaches_persistent_workers_each_epoch_reading_every_episode_once(catch_path):
    import pickle

    def key(episode):  # the episode's observations and actions, whole
        return (
            np.asarray(episode["steps"]["observation"]).tobytes()
            + np.asarray(episode["steps"]["action"]).tobytes()
        )

    episodes = reader_lib.open_dataset(catch_path)["train"]
    expected = sorted(key(e) for e in episodes)
    assert len(set(expected)) == len(expected) == 8
    dataset = RLDSIterableDataset(
        catch_path, unit="episodes", shuffle_files=True, shuffle_episodes=True, seed=3
    )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, persistent_workers=True
    )

    def epoch(e):
        dataset.set_epoch(e)
        return [key(episode) for episode in loader]

    first, second = epoch(0), epoch(1)
    workers = loader._iterator._workers  # the same worker processes served both epochs
    assert sorted(first) == expected and sorted(second) == expected  # each once an epoch
    assert second != first  # the workers shuffled for epoch 1, not the epoch they began in
    assert epoch(0) == first and loader._iterator._workers == workers
    # Pickled outside a worker's start, the dataset keeps the epoch, in memory of its own.
    dataset.set_epoch(5)
    copy = pickle.loads(pickle.dumps(dataset))
    copy.set_epoch(6)
    assert (copy.epoch, dataset.epoch) == (6, 5)
