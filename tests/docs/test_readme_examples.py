"""The README's recording examples run as written (paths moved to a temp dir)."""

from __future__ import annotations

import os
import re

import tensorflow_datasets as tfds

_README = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "README.md")


def _python_blocks() -> list[str]:
    with open(_README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.DOTALL)


def _run(block: str, tmp_path, paths: list[str]) -> None:
    for path in paths:
        block = block.replace(f'"{path}"', repr(os.fspath(tmp_path / os.path.basename(path))))
    exec(compile(block, "README.md", "exec"), {})  # noqa: S102


def test_readme_dm_env_example_records_a_dataset_tfds_loads(tmp_path):
    block = next(b for b in _python_blocks() if "EnvLogger" in b)
    _run(block, tmp_path, ["/tmp/catch_example"])
    builder = tfds.builder_from_directory(os.fspath(tmp_path / "catch_example"))
    assert builder.info.splits["train"].num_examples == 10
    assert len(list(builder.as_dataset(split="train"))) == 10


def test_readme_gymnasium_example_records_a_dataset_tfds_loads(tmp_path):
    block = next(b for b in _python_blocks() if "RecordRLDS(" in b)
    _run(block, tmp_path, ["/tmp/cartpole"])
    builder = tfds.builder_from_directory(os.fspath(tmp_path / "cartpole"))
    steps = sum(int(ep["steps"].cardinality()) for ep in builder.as_dataset(split="train"))
    episodes = builder.info.splits["train"].num_examples
    assert episodes >= 1
    assert steps == 500 + episodes  # every transition plus each episode's final step
