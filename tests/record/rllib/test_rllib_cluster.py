"""RLlib on a real two-node Ray cluster without a shared file system: nothing lost, or an error.

The tests share one run of `rllib_cluster_child.py`, the first process of new
PID, network and mount namespaces, which plays each selected test's scenario
in turn on one cluster: its Ray head and second node listen on that
namespace's loopback only, and everything in it ends when the child exits
(no Ray outside is reached, attached to or stopped). The second node runs in
a mount namespace of its own with a tmpfs over the output root's parent: it
cannot see the driver's files, as on a cluster whose nodes have their own
disks. One EnvRunner runs there and is killed (and restarted) mid-run, or
the node itself is stopped and the runner restarted on a third node.
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

# Left out of the default run (about 4 minutes on 2 cores): `pytest -m cluster`.
pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CHILD = os.path.join(os.path.dirname(__file__), "rllib_cluster_child.py")
# Per scenario: one cluster start, then each scenario's three train() calls.
TIMEOUT_PER_SCENARIO = 240


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    return probe.returncode == 0


def _run(scenarios: list[str]) -> dict[str, dict]:
    if not _can_unshare():
        pytest.skip("needs root and unshare (network, PID and mount namespaces)")
    # A short path: Ray's unix sockets live under it.
    work = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    result_path = os.path.join(work, "result.json")
    # This process's import path, whatever the child's working directory.
    path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    try:
        child = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
            + [sys.executable, CHILD, work, result_path, *scenarios],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_PER_SCENARIO * len(scenarios),
        )
        # Ray's nodes warn on every start that no route leaves the namespace.
        log = "\n".join(line for line in child.stderr.splitlines() if "network_util" not in line)
        results = {}
        if os.path.exists(result_path):
            with open(result_path) as f:
                results = json.load(f)
        # A scenario the child never finished fails its own test with the child's log.
        return {s: results.get(s, {"child_error": log[-4000:]}) for s in scenarios}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Each test's scenario (rllib_cluster_child.py says what each does).
_SCENARIOS = {
    "test_every_finished_episode_of_every_node_is_merged": "single",
    "test_every_finished_episode_of_every_node_is_merged_in_the_bucket": "s3",
    "test_a_runner_restarted_on_another_node_after_its_node_died_loses_nothing_delivered": (
        "node_lost"
    ),
    "test_every_finished_agent_episode_of_every_node_is_merged": "multi",
    "test_every_finished_agent_episode_of_every_node_is_merged_in_the_bucket": "multi_s3",
    "test_a_shipped_shard_missing_at_stop_raises_naming_the_runner_and_node": "lost",
}


@pytest.fixture(scope="module")
def runs(request) -> dict[str, dict]:
    """One cluster for the module: the scenarios of the selected tests, played in one child."""
    here = request.module.__file__
    wanted = {
        _SCENARIOS[item.originalname]
        for item in request.session.items
        if getattr(item, "fspath", None) and str(item.fspath) == here
    }
    return _run(sorted(wanted))


@pytest.fixture
def result(runs, request) -> dict:
    """This test's scenario's result; the child's traceback if it did not finish."""
    out = runs[_SCENARIOS[request.node.originalname]]
    assert "rllib_episodes" in out, out.get("child_error")
    return out


def test_every_finished_episode_of_every_node_is_merged(result):
    assert result["restarted_on"] != result["driver_node"]  # a runner off the driver's node
    assert "stop_error" not in result
    assert result["rllib_episodes"] > 0
    # RLlib's own lifetime counter (episodes its runners finished and reported).
    assert result["merged"] == {"train": result["rllib_episodes"]} == result["reported"]
    assert result["runner_directories"] == []  # merged by moving


def test_every_finished_episode_of_every_node_is_merged_in_the_bucket(result):
    # Output root s3://cluster-bucket/run on a moto server inside the namespace;
    # a runner on the second node is killed and restarted mid-run.
    assert result["restarted_on"] != result["driver_node"]
    assert "stop_error" not in result
    assert result["rllib_episodes"] > 0
    # Read back with open_dataset("s3://..."): RLlib's counter and the runners' counts.
    assert result["merged"] == {"train": result["rllib_episodes"]} == result["reported"]
    assert result["runner_directories"] == []  # moved into the merge, in the bucket


def test_a_runner_restarted_on_another_node_after_its_node_died_loses_nothing_delivered(result):
    assert result["restarted_on"] not in (result["driver_node"], result["lost_node"])
    assert "stop_error" not in result
    # The dead node's runner delivered episodes before it died; they are merged too.
    assert result["lost_node_episodes"] > 0
    assert result["merged"] == {"train": result["rllib_episodes"]}


def test_every_finished_agent_episode_of_every_node_is_merged(result):
    assert "stop_error" not in result
    assert result["rllib_episodes"] > 0
    # Two agents act in every MultiAgentCartPole episode: one RLDS episode each.
    assert set(result["merged"]) == {"p0/train", "p1/train"}
    # Every agent episode the runners finished (their counts) is merged, per module.
    assert result["merged"] == result["reported"]
    # RLlib counts env episodes; each module has at most one agent episode in each.
    assert max(result["merged"].values()) == result["rllib_episodes"]
    assert sum(result["merged"].values()) <= 2 * result["rllib_episodes"]


def test_every_finished_agent_episode_of_every_node_is_merged_in_the_bucket(result):
    assert "stop_error" not in result
    assert result["rllib_episodes"] > 0
    assert set(result["merged"]) == {"p0/train", "p1/train"}
    assert result["merged"] == result["reported"]
    assert max(result["merged"].values()) == result["rllib_episodes"]


def test_a_shipped_shard_missing_at_stop_raises_naming_the_runner_and_node(result):
    error = result["stop_error"]
    deleted = result["deleted"]
    assert error.startswith("EpisodesLostError: ")
    assert "\n" not in error
    assert f"EnvRunner {deleted['worker_index']} " in error
    assert "127.0.0.1" in error and deleted["node_id"][:12] in error
    assert deleted["shard"].rpartition("/")[2] in error
    # Nothing was merged and nothing else removed: the runner directories stay.
    assert result["merged"] == {}
    assert deleted["shard"].partition("/")[0] in result["runner_directories"]
