"""One rank of a `torch.distributed` job (gloo) reading an RLDS dataset with 2 DataLoader workers.

Run by tests/read/test_torch_distributed.py, one process per rank:

    python torch_ddp_child.py DATASET RESULT_JSON EPOCH [EPOCH ...]

with `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` set (and the object
store's client settings). Writes, per epoch asked for in turn, the episode
ids (each episode's observations hold its id) in the order this rank got them.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import rlds_writer  # noqa: F401 - TensorFlow's loading rules before torch's extensions
from rlds_writer.read.torch_data import RLDSIterableDataset


def main() -> None:
    path, result, *epochs = sys.argv[1:]
    dist.init_process_group("gloo")
    dataset = RLDSIterableDataset(
        path, unit="episodes", shuffle_files=True, shuffle_episodes=True, seed=7
    )
    out = {"rank": dataset.rank, "world_size": dataset.world_size, "epochs": []}
    for epoch in epochs:
        dataset.set_epoch(int(epoch))
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
        ids = [int(episode["steps"]["observation"][0]) for episode in loader]
        out["epochs"].append(ids)
    # Every rank got here: the group is whole until the end.
    dist.barrier()
    with open(result, "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
