"""`RLDSIterableDataset` across `torch.distributed` ranks and DataLoader workers, from a bucket.

Two real processes form a gloo process group on loopback; each reads an
RLDS dataset in moto's S3 server through a `DataLoader` with 2 worker
processes. Per epoch, the 4 readers together must give every episode
exactly once; the shuffled order must depend on the seed and epoch only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from byte_relay import upload
from helpers_core import EpisodeSpec, write_with_rlds_writer

import rlds_writer

pytest.importorskip("torch")
pytest.importorskip("s3fs")
# A server and four processes importing torch: out of the quick loop.
pytestmark = pytest.mark.slow

CHILD = os.path.join(os.path.dirname(__file__), "torch_ddp_child.py")
EPISODES = 11


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bucket_dataset(s3_bucket, tmp_path):
    """11 episodes, 2 per shard file (6 files), each episode's observations its id."""
    config = rlds_writer.DatasetConfig(
        name="ids",
        observation_info=np.float32,
        action_info=np.int64,
        reward_info=np.float32,
        discount_info=np.float32,
    )
    episodes = [
        EpisodeSpec(
            observations=[np.float32(i)] * (2 + i % 3),
            actions=[np.int64(0)] * (1 + i % 3),
            rewards=[np.float32(1)] * (1 + i % 3),
            discounts=[np.float32(1)] * (1 + i % 3),
        )
        for i in range(EPISODES)
    ]
    write_with_rlds_writer(tmp_path / "ids", config, episodes, max_episodes_per_file=2)
    url = s3_bucket.path("ids")
    upload(tmp_path / "ids", url)
    return url


def test_two_ranks_with_two_workers_each_read_every_episode_once_per_epoch(
    bucket_dataset, tmp_path
):
    port = _free_port()
    children = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",  # loopback only
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        out = tmp_path / f"rank{rank}.json"
        command = [sys.executable, CHILD, bucket_dataset, str(out), "0", "1", "0"]
        children.append((subprocess.Popen(command, env=env, stderr=subprocess.PIPE), out))
    results = []
    for child, out in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err.decode()[-3000:]
        results.append(json.loads(out.read_text()))
    assert [(r["rank"], r["world_size"]) for r in results] == [(0, 2), (1, 2)]  # from the group
    first, second, again = ([results[0]["epochs"][e], results[1]["epochs"][e]] for e in range(3))
    for ranks in (first, second):
        got = ranks[0] + ranks[1]
        assert sorted(got) == list(range(EPISODES)), ranks  # each episode once, per epoch
        assert ranks[0] and ranks[1]
    assert again == first  # the same seed and epoch: the same order on each rank
    assert second != first  # another epoch: another order
