"""Helpers shared by the core writer tests.

They load datasets the way a user does (`tfds.builder_from_directory`), write
reference datasets through TFDS's own path (`rlds_base.build_info`,
`FeaturesDict.encode_example`, `ExampleSerializer` inside
`tfds.core.SequentialWriter`), and compare decoded values exactly.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Every numeric dtype TFDS's `Tensor` takes.
NUMERIC_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


@dataclasses.dataclass
class EpisodeSpec:
    """One episode as a user would feed it to a recorder.

    `observations` has one more entry than `actions`: o_0 .. o_T and a_0 ..
    a_{T-1}, with `rewards[t]`/`discounts[t]` following `actions[t]`.
    `step_metadata`, if given, has one entry per observation.
    """

    observations: list[Any]
    actions: list[Any]
    rewards: list[Any]
    discounts: list[Any]
    step_metadata: list[Any] | None = None
    episode_metadata: Mapping[str, Any] | None = None
    terminated: bool = True


def load_episodes(path: Any, split: str = "train") -> list[dict[str, Any]]:
    """Loads every episode of a split as numpy, steps as a list of step dicts."""
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(os.fspath(path))
    out = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split)):
        episode = dict(episode)
        episode["steps"] = [dict(step) for step in episode["steps"]]
        out.append(episode)
    return out


def load_episodes_from_data_source(path: Any, split: str = "train") -> list[dict[str, Any]]:
    """Like `load_episodes`, through `builder.as_data_source()` (random access, no tf.data).

    This is the only way TFDS reads ArrayRecord shards: its `as_dataset` raises
    NotImplementedError for them, for datasets TFDS wrote itself as well.
    """
    import tensorflow_datasets as tfds

    source = tfds.builder_from_directory(os.fspath(path)).as_data_source(split=split)
    out = []
    for i in range(len(source)):
        episode = dict(source[i])
        episode["steps"] = [dict(step) for step in episode["steps"]]
        out.append(episode)
    return out


def spec_zero(feature: Any) -> Any:
    """Zero of a feature built independently of rlds_writer (reference side)."""
    import tensorflow_datasets as tfds

    if isinstance(feature, Mapping | tfds.features.FeaturesDict):
        return {k: spec_zero(v) for k, v in feature.items()}
    if isinstance(feature, tfds.features.Text):
        return ""
    if not isinstance(feature, tfds.features.FeatureConnector):
        feature = tfds.features.Tensor(shape=(), dtype=feature)
    return np.zeros(feature.shape, dtype=feature.np_dtype)


def rlds_example(config: Any, episode: EpisodeSpec) -> dict[str, Any]:
    """Builds the RLDS-aligned TFDS example of an episode, step by step."""
    n = len(episode.observations)
    assert len(episode.actions) == n - 1
    steps = []
    for t in range(n):
        last = t == n - 1
        step = {
            "observation": episode.observations[t],
            "is_first": t == 0,
            "is_last": last,
            "is_terminal": last and episode.terminated,
        }
        if config.action_info is not None:
            step["action"] = spec_zero(config.action_info) if last else episode.actions[t]
        if config.reward_info is not None:
            step["reward"] = spec_zero(config.reward_info) if last else episode.rewards[t]
        if config.discount_info is not None:
            step["discount"] = spec_zero(config.discount_info) if last else episode.discounts[t]
        if episode.step_metadata is not None:
            step.update(episode.step_metadata[t])
        steps.append(step)
    example = {"steps": steps}
    example.update(episode.episode_metadata or {})
    return example


def write_with_tfds(
    path: Any,
    config: Any,
    episodes: Sequence[EpisodeSpec],
    *,
    name: str | None = None,
    version: str = "0.0.1",
    split: str = "train",
    max_episodes_per_file: int = 1000,
    file_format: str = "tfrecord",
) -> None:
    """Writes episodes with TFDS's own encoder and `SequentialWriter`."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.rlds import rlds_base

    os.makedirs(path, exist_ok=True)
    identity = tfds.core.DatasetIdentity(
        name=name or config.name,
        version=tfds.core.Version(version),
        data_dir=os.fspath(path),
        module_name="",
    )
    info = rlds_base.build_info(config, identity)
    writer = tfds.core.SequentialWriter(
        info, max_examples_per_shard=max_episodes_per_file, file_format=file_format
    )
    writer.initialize_splits([split])
    writer.add_examples({split: [rlds_example(config, e) for e in episodes]})
    writer.close_all()


def write_with_rlds_writer(
    path: Any,
    config: Any,
    episodes: Sequence[EpisodeSpec],
    **backend_kwargs: Any,
) -> None:
    """Writes episodes through `TFDSBackendWriter`'s recorder API."""
    import rlds_writer

    with rlds_writer.TFDSBackendWriter(path, config, **backend_kwargs) as backend:
        for episode in episodes:
            meta = episode.step_metadata
            backend.begin_episode(episode.observations[0], meta[0] if meta else None)
            for t, action in enumerate(episode.actions):
                backend.add_step(
                    action,
                    episode.rewards[t] if episode.rewards else None,
                    episode.discounts[t] if episode.discounts else None,
                    episode.observations[t + 1],
                    meta[t + 1] if meta else None,
                )
            if episode.episode_metadata is not None:
                backend.set_episode_metadata(episode.episode_metadata)
            backend.end_episode(terminated=episode.terminated)


def assert_same(actual: Any, expected: Any, path: str = "") -> None:
    """Asserts two decoded values are identical: keys, types, dtypes, shapes, values.

    NaNs compare equal to NaNs; nothing else is approximate.
    """
    where = path or "<root>"
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{where}: expected a dict, got {type(actual)}"
        assert sorted(actual) == sorted(expected), (
            f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        )
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}/{key}")
        return
    if isinstance(expected, list):
        assert isinstance(actual, list), f"{where}: expected a list, got {type(actual)}"
        assert len(actual) == len(expected), f"{where}: {len(actual)} != {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
        return
    if isinstance(expected, bytes):
        assert isinstance(actual, bytes), f"{where}: expected bytes, got {type(actual)}"
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
        return
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.dtype == e.dtype, f"{where}: dtype {a.dtype} != {e.dtype}"
    assert a.shape == e.shape, f"{where}: shape {a.shape} != {e.shape}"
    if e.dtype.kind == "f":
        same = np.array_equal(a, e, equal_nan=True)
    else:
        same = np.array_equal(a, e)
    assert same, f"{where}: {a!r} != {e!r}"


_TEXT_ALPHABET = ["a", "b", "Z", " ", "é", "ß", "漢", "🙂", "\n", "0"]


def random_text(rng: np.random.Generator, max_len: int = 6) -> str:
    """A random unicode string, possibly empty."""
    n = int(rng.integers(0, max_len + 1))
    return "".join(_TEXT_ALPHABET[int(i)] for i in rng.integers(0, len(_TEXT_ALPHABET), n))


def random_numbers(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Random values of a numeric dtype, with the dtype's extremes mixed in."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "b":
        flat = rng.integers(0, 2, size).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        extremes = np.array([info.min, info.max, 0], dtype=dtype)
        k = min(size, int(rng.integers(0, 4)))
        flat[:k] = extremes[:k]
    else:
        flat = (rng.standard_normal(size) * 10.0 ** rng.integers(-3, 4, size)).astype(dtype)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.1], dtype=dtype)
        k = min(size, int(rng.integers(0, 3)))
        flat[:k] = specials[rng.integers(0, len(specials), k)]
    return flat.reshape(shape)


def random_value(feature: Any, rng: np.random.Generator) -> Any:
    """A random value a user could record for a TFDS feature (or a nest of them)."""
    import tensorflow_datasets as tfds

    if feature is None:  # e.g. a config without a reward
        return None
    if isinstance(feature, Mapping | tfds.features.FeaturesDict):
        return {k: random_value(v, rng) for k, v in feature.items()}
    if isinstance(feature, tfds.features.Text):
        return random_text(rng)
    if isinstance(feature, tfds.features.ClassLabel):
        index = int(rng.integers(feature.num_classes))
        # TFDS accepts both the label's name and its index.
        return feature.names[index] if rng.integers(2) else index
    if isinstance(feature, tfds.features.Image):
        shape = tuple(int(rng.integers(1, 6)) if d is None else d for d in feature.shape)
        dtype = np.dtype(feature.np_dtype)
        if dtype.kind == "f":
            return rng.random(shape, dtype=np.float32)
        return rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    if not isinstance(feature, tfds.features.FeatureConnector):
        feature = tfds.features.Tensor(shape=(), dtype=feature)
    shape = tuple(int(rng.integers(0, 4)) if d is None else d for d in feature.shape)
    dtype = np.dtype(feature.np_dtype)
    if dtype.kind in "SUO":
        return np.array(
            [random_text(rng).encode() for _ in range(int(np.prod(shape, dtype=np.int64)))],
            dtype=object,
        ).reshape(shape)
    return random_numbers(rng, shape, dtype)


def random_episodes(
    config: Any, rng: np.random.Generator, lengths: Sequence[int] = (1, 2, 4)
) -> list[EpisodeSpec]:
    """Random episodes for a config, one per entry of `lengths` (observations)."""
    step_meta = config.step_metadata_info or {}
    episode_meta = config.episode_metadata_info or {}
    episodes = []
    for i, n in enumerate(lengths):
        episodes.append(
            EpisodeSpec(
                observations=[random_value(config.observation_info, rng) for _ in range(n)],
                actions=[random_value(config.action_info, rng) for _ in range(n - 1)],
                rewards=[random_value(config.reward_info, rng) for _ in range(n - 1)],
                discounts=[random_value(config.discount_info, rng) for _ in range(n - 1)],
                step_metadata=[random_value(step_meta, rng) for _ in range(n)]
                if step_meta
                else None,
                episode_metadata=random_value(episode_meta, rng) if episode_meta else None,
                terminated=bool(i % 2 == 0),
            )
        )
    return episodes


def new_buffer(writer: Any) -> Any:
    """An empty episode buffer for a bare `DatasetWriter`'s features (what a recorder uses)."""
    from rlds_writer.record.episode import StepFields

    return StepFields(writer.encoder.fields, empty_dicts=writer.encoder.empty_dicts).new_buffer()


def fuzz_settings(default_examples: int) -> Any:
    """Hypothesis settings for the fuzz tests: no deadline, `RLDS_FUZZ_EXAMPLES` examples."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=int(os.environ.get("RLDS_FUZZ_EXAMPLES", str(default_examples))),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


@dataclasses.dataclass
class CliResult:
    """What one `rlds-writer` command printed, and its exit code."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: Any, expect: int | None = 0) -> CliResult:
    """Runs `rlds-writer ARGS` in this process through the CLI's `main()`.

    For tests of what a command says and does, not of the process around it:
    a traceback (an exception `main()` lets through) fails the test as it is
    raised. Output that bypasses `sys.stdout`/`sys.stderr` (TensorFlow's C++
    logs on file descriptor 2) is not captured: tests/cli/test_quiet_output.py
    checks that in real processes. `expect` is the exit code (None: any).
    """
    import contextlib
    import io
    import logging

    from rlds_writer.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    # What the process's logging.basicConfig would print: warnings and errors.
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse: --help, usage errors
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        logging.getLogger().removeHandler(handler)
    result = CliResult(code, out.getvalue(), err.getvalue())
    assert expect is None or code == expect, (args, result)
    return result


def skip_without_extra(extra: str | None) -> None:
    """Skips the test unless the modules of `extra` ("rllib,convert") are installed.

    A lean install (the Docker image's default) runs the tests its extras allow.
    """
    import importlib.util

    import pytest

    from rlds_writer.errors import OPTIONAL_MODULES

    wanted = set((extra or "").split(",")) - {""}
    missing = sorted(
        module
        for module, its_extra in OPTIONAL_MODULES.items()
        if its_extra in wanted and importlib.util.find_spec(module) is None
    )
    if missing:
        pytest.skip(f"needs the {extra} extra: {', '.join(missing)} not installed")


def skip_without_format(direction: str, name: str) -> None:
    """Skips the test unless the libraries of interop format `name` are installed."""
    from rlds_writer.interop import registry

    table = registry.FORMATS if direction == "convert" else registry.EXPORT_FORMATS
    skip_without_extra(table[name].extra)
