"""Shared pytest fixtures."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

# Before any test module imports TensorFlow: rlds_writer makes TensorFlow load
# RTLD_LOCAL, without which torch's triton (PyPI's CUDA torch) aborts the run.
import rlds_writer  # noqa: F401

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

TESTS = Path(__file__).resolve().parent


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
    # Test modules (which define the envs) are imported from their own folder, at
    # any depth (tests/record/rllib/ mirrors rlds_writer/record/rllib/).
    folders = [str(TESTS)] + [
        str(p) for p in sorted(TESTS.rglob("*")) if p.is_dir() and p.name.isalpha()
    ]
    path = os.pathsep.join(folders + [p for p in (os.environ.get("PYTHONPATH"),) if p])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


def _d3rlpy_venv() -> Path:
    from consumer_venv import D3RLPY_REQUIREMENTS, D3RLPY_SHARED, consumer_python

    return consumer_python("d3rlpy", D3RLPY_REQUIREMENTS, shared=D3RLPY_SHARED)


_prebuild: list[threading.Thread] = []


def _build_quietly() -> None:
    try:
        _d3rlpy_venv()
    except BaseException:  # noqa: BLE001 - the fixture builds again and reports
        pass


def pytest_collection_finish(session):
    # The first run builds the d3rlpy venv (about a minute of pip, mostly downloads
    # and unpacking): start it now, beside the tests before the first one that needs
    # it; that one's fixture waits for it on the venv's lock.
    if any("d3rlpy_python" in getattr(item, "fixturenames", ()) for item in session.items):
        thread = threading.Thread(target=_build_quietly, name="d3rlpy-venv", daemon=True)
        thread.start()
        _prebuild.append(thread)


def pytest_sessionfinish(session):
    for thread in _prebuild:
        thread.join()  # never leave pip writing into .cache after the run


@pytest.fixture(params=["c", "python"])
def step_path(request, monkeypatch) -> str:
    """Runs a test with EnvLogger's C step (skipped where it is not built) and its Python step.

    The Python step is the compiled one from the first step (not after the
    checked warm-up of `record.appender.COMPILE_AFTER` calls).
    """
    from rlds_writer.record import appender, step_kernel

    if request.param == "python":
        monkeypatch.setenv(step_kernel.PURE_PYTHON_ENV, "1")
        monkeypatch.setattr(appender, "COMPILE_AFTER", 0)
    else:
        monkeypatch.delenv(step_kernel.PURE_PYTHON_ENV, raising=False)
        if not step_kernel.available():
            pytest.skip("the C step is not built (no C compiler at install)")
    return request.param


@pytest.fixture(scope="session")
def d3rlpy_python():
    """The python of the d3rlpy consumer venv (tests/consumer_venv.py), built on first use."""
    return _d3rlpy_venv()


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


class Recording(NamedTuple):
    """What `record_episodes` wrote: the dataset and, for an env, each episode's observations."""

    path: Path
    observations: list[list[Any]]


def _record_env(
    env: Any,
    path: Path,
    episodes: int,
    *,
    action: Any,
    seed: int,
    max_steps: int | None,
    cut_last_at: int | None,
    before_episode: Callable[[Any, int], None] | None,
    **recorder_options: Any,
) -> Recording:
    import gymnasium as gym

    recorder = rlds_writer.RecordRLDS(
        gym.make(env) if isinstance(env, str) else env, path, **recorder_options
    )
    rng = np.random.default_rng(seed)
    recorder.action_space.seed(seed)
    observed = []
    for episode in range(episodes):
        if before_episode is not None:
            before_episode(recorder, episode)
        obs, _ = recorder.reset(seed=seed + episode)
        observed.append([obs])
        t = 0
        while max_steps is None or t < max_steps:
            if isinstance(action, str) and action == "sample":
                chosen = recorder.action_space.sample()
            else:
                chosen = action(rng) if callable(action) else action
            obs, _, terminated, truncated, _ = recorder.step(chosen)
            observed[-1].append(obs)
            if terminated or truncated or (episode == episodes - 1 and t == cut_last_at):
                break  # the last episode, cut short, is written by close()
            t += 1
    recorder.close()
    return Recording(Path(path), observed)


def _record_config(
    config: Any,
    path: Path,
    episodes: int,
    *,
    seed: int,
    splits: Sequence[str],
    max_steps: int | None,
    **writer_options: Any,
) -> Recording:
    from helpers_core import new_buffer

    rng = np.random.default_rng(seed)
    step_meta = config.step_metadata_info or {}
    episode_meta = config.episode_metadata_info or {}

    def draw(feature: Any) -> Any:
        return _plain_value(feature, rng) if feature else None

    with rlds_writer.store.DatasetWriter(path, config, **writer_options) as writer:
        for episode in range(episodes):
            buffer = new_buffer(writer)
            buffer.start(draw(config.observation_info), draw(step_meta))
            for _ in range(int(rng.integers(1, (max_steps or 6) + 1))):
                buffer.add(
                    draw(config.action_info),
                    draw(config.reward_info),
                    draw(config.discount_info),
                    draw(config.observation_info),
                    draw(step_meta),
                )
            if episode_meta:
                buffer.set_episode_metadata(draw(episode_meta))
            # Terminated and cut-short episodes alternate; so do the splits.
            finished = buffer.finish(terminated=bool(episode % 2))
            writer.write(finished, splits[episode % len(splits)])
    return Recording(Path(path), [])


def _plain_value(feature: Any, rng: np.random.Generator) -> Any:
    """Ordinary values of a feature (no NaN or extremes: see helpers_core.random_value)."""
    import tensorflow_datasets as tfds

    if isinstance(feature, dict | tfds.features.FeaturesDict):
        return {key: _plain_value(value, rng) for key, value in feature.items()}
    if isinstance(feature, tfds.features.Text):
        return f"text-{int(rng.integers(1000))}"
    if not isinstance(feature, tfds.features.FeatureConnector):
        feature = tfds.features.Tensor(shape=(), dtype=feature)
    dtype = np.dtype(feature.np_dtype)
    if dtype.kind == "f":
        return rng.normal(size=feature.shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=feature.shape).astype(bool)
    return rng.integers(0, 100, size=feature.shape).astype(dtype)


@pytest.fixture(scope="session")
def record_episodes() -> Callable[..., Recording]:
    """The recorder of test data: `record_episodes(source, path, episodes=2, **options)`.

    `source` is a Gymnasium env (or an env id), recorded with `RecordRLDS`:
    episode i is reset with `seed + i` and played with `action` (an action, the
    string "sample" for the action space sampled from `seed`, or a function of
    a numpy Generator seeded with `seed`) until it ends, or for at most
    `max_steps` steps; with `cut_last_at=t` the last episode is left open after
    its step t and `close()` writes it cut short; `before_episode(recorder, i)`
    runs before each reset. Other options go to `RecordRLDS`.

    Or `source` is a `DatasetConfig`: random values of its features, written
    with `DatasetWriter` (episodes of 1 to `max_steps` (6) steps, terminated
    and cut short in turn, spread over `splits`). Other options go to
    `DatasetWriter` (`max_episodes_per_file`, `metadata`, `mode`...).

    Session-scoped, so module-scoped fixtures can use it too.
    """

    def record(
        source: Any,
        path: Any,
        episodes: int = 2,
        *,
        seed: int = 0,
        max_steps: int | None = None,
        action: Any = "sample",
        cut_last_at: int | None = None,
        before_episode: Callable[[Any, int], None] | None = None,
        splits: Sequence[str] = ("train",),
        **options: Any,
    ) -> Recording:
        if isinstance(source, rlds_writer.DatasetConfig):
            return _record_config(
                source,
                Path(path),
                episodes,
                seed=seed,
                splits=splits,
                max_steps=max_steps,
                **options,
            )
        return _record_env(
            source,
            Path(path),
            episodes,
            action=action,
            seed=seed,
            max_steps=max_steps,
            cut_last_at=cut_last_at,
            before_episode=before_episode,
            **options,
        )

    return record


# S3 (moto) and GCS (emulator) servers on loopback and a fresh bucket per test.
from object_stores import gcs_bucket, gcs_emulator, moto_server, object_store, s3_bucket  # noqa: E402,F401
