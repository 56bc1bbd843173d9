"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest

# Before any test module imports TensorFlow: rlds_writer makes TensorFlow load
# RTLD_LOCAL, without which torch's triton (PyPI's CUDA torch) aborts the run.
import rlds_writer  # noqa: F401

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


# Fixtures whose tests are `slow` (left out of the quick loop `pytest -m "not
# slow"`): the d3rlpy consumer venv takes minutes to build the first time and each
# run starts an interpreter with torch; Ray tests train RLlib algorithms.
_SLOW_FIXTURES = ("d3rlpy_python", "ray_session")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in _SLOW_FIXTURES):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for every RLlib test; runner processes import env classes from tests/."""
    ray = pytest.importorskip("ray")
    path = os.pathsep.join(
        p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH")) if p
    )
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def d3rlpy_python():
    """The python of the d3rlpy consumer venv (tests/consumer_venv.py), built on first use."""
    from consumer_venv import D3RLPY_REQUIREMENTS, D3RLPY_SHARED, consumer_python

    return consumer_python("d3rlpy", D3RLPY_REQUIREMENTS, shared=D3RLPY_SHARED)


@pytest.fixture(scope="module")
def catch(tmp_path_factory):
    """A small Catch dataset (two episodes) for tests that only read it."""

    path = tmp_path_factory.mktemp("catch") / "ds"
    env = rlds_writer.EnvLogger(rlds_writer.Catch(seed=0), data_directory=path)
    for _ in range(2):
        timestep = env.reset()
        while not timestep.last():
            timestep = env.step(1)
    env.close()
    return path


# S3 (moto) and GCS (emulator) servers on loopback and a fresh bucket per test.
from object_stores import gcs_bucket, gcs_emulator, moto_server, object_store, s3_bucket  # noqa: E402,F401
