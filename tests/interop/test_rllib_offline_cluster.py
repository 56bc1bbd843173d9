"""RLlib offline training from RLDS on a real two-node Ray cluster reading moto's S3.

`rllib_offline_cluster_child.py` runs in namespaces of its own (loopback only;
the second node sees a tmpfs where the driver wrote the dataset, and the
local copy is deleted after the upload): the cluster reads the bucket.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("ray")
pytest.importorskip("ray.rllib")
pytest.importorskip("s3fs")

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CHILD = os.path.join(os.path.dirname(__file__), "rllib_offline_cluster_child.py")
TIMEOUT = 420


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def run() -> dict:
    if not _can_unshare():
        pytest.skip("needs root and unshare (network, PID and mount namespaces)")
    work = tempfile.mkdtemp(prefix="ro", dir="/tmp")  # short: Ray's unix sockets live here
    result_path = os.path.join(work, "result.json")
    path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    try:
        child = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
            + [sys.executable, CHILD, work, result_path],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        result = {}
        if os.path.exists(result_path):
            with open(result_path) as f:
                result = json.load(f)
        if "seen" not in result:
            lines = child.stderr.splitlines()
            log = "\n".join(x for x in lines if "network_util" not in x)
            pytest.fail(result.get("child_error") or log[-4000:])
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_both_nodes_read_the_bucket(run):
    assert len(run["nodes"]) == 2
    assert run["read_nodes"] == run["nodes"]  # read tasks ran on each node


def test_one_epoch_of_bc_reads_every_transition_of_every_episode_once(run):
    assert len(run["expected"]) > 0
    assert run["seen"] == run["expected"]  # each (episode, step) handed over exactly once
    assert run["policy_loss"] == run["policy_loss"]  # a loss, not NaN
