"""Every code block in README.md and docs/*.md runs, as a user would paste it.

A file's `python` blocks run in order as one script (later blocks may use
names from earlier ones), in a fresh directory: absolute paths under `/data/`
and `/tmp/` are moved into it, and the datasets a block reads are recorded
first. `bash` blocks must be marked `<!-- not-run: reason -->` (they install
software or need a daemon); other blocks must be `text` (output, synopses).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_docs import FENCE, ROOT, RUN1_SETUP

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = ("python", "bash")

# What a doc's examples expect to find under /data/: recorded once (DATA_SETUP)
# and copied into each doc's fresh directory before its blocks run.
SETUP = """
import os
DATA = os.path.join(os.getcwd(), "data")
"""

DATA_SETUP = """
import subprocess, sys
def record(path, episodes=40):
    subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "rlds-writer"), "record",
         "--output", path, "--episodes", str(episodes), "--no-load-back", "--no-progress"],
        check=True, capture_output=True)
record(os.path.join(DATA, "catch"))
"""

DATA_SETUP += RUN1_SETUP


@pytest.fixture(scope="module")
def doc_data(tmp_path_factory) -> Path:
    """The datasets the docs read (/data/catch, /data/run1), recorded once."""
    where = tmp_path_factory.mktemp("doc_data")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-c", SETUP + DATA_SETUP],
        cwd=where,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return where / "data"


def _blocks(path: Path) -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["body"], m["why"]) for m in FENCE.finditer(path.read_text())]


def _script(path: Path, workdir: Path) -> str:
    parts = []
    moved = {"data": f'"{workdir}/data/', "tmp": f'"{workdir}/'}
    for i, (lang, body, why) in enumerate(_blocks(path)):
        if lang == "python" and why is None:
            body = re.sub(r'"/(data|tmp)/', lambda m: moved[m[1]], body)
            parts.append(f"# --- {path.name}, block {i}\n{body}")
    return "\n".join(parts)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_block_is_runnable_or_says_why_not(path):
    for lang, body, why in _blocks(path):
        first = body.strip().splitlines()[0] if body.strip() else ""
        if lang in RUNNABLE:
            assert lang == "python" or why, f"{path.name}: `{lang}` block needs a not-run reason"
        else:
            assert lang == "text", f"{path.name}: tag the block starting {first!r} (python/text)"


def _imported_modules(tree: ast.Module, top_level_only: bool) -> set[str]:
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # also `try: import torch` at module level
        nodes = [
            n
            for stmt in nodes
            for n in ([stmt, *stmt.body] if isinstance(stmt, ast.Try) else [stmt])
        ]
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _missing_modules(script: str) -> list[str]:
    """Packages the script needs that are not installed (extras left out).

    Looks one level into our own modules: `rlds_writer.read.torch_data` needs torch.
    """
    names = _imported_modules(ast.parse(script), top_level_only=False)
    for name in [n for n in names if n.startswith("rlds_writer.")]:
        base = ROOT.joinpath(*name.split("."))
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file():
                names |= _imported_modules(ast.parse(source.read_text()), top_level_only=True)
    tops = {name.split(".")[0] for name in names}
    return sorted(top for top in tops if importlib.util.find_spec(top) is None)


# Docs whose blocks need the object-store servers (never a real bucket), and the test
# that runs them there.
_RUN_AGAINST_SERVERS = {"storage.md": "tests/store/storage/test_storage_docs.py"}


# Executing a doc's blocks takes from 10 s to a minute (RLlib training, every README
# example): `slow` and `docs`, run with the release checks (`pytest -m "release or
# cluster or docs"`, README, .ci/run), not by `pytest -q`. The check that every
# block is runnable stays in the quick loop, and tests/docs/test_readme_examples.py
# and tests/cli/test_quiet_output.py run the README's quick start in the default run.
@pytest.mark.slow
@pytest.mark.docs
@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path, doc_data):
    if path.name in _RUN_AGAINST_SERVERS:
        pytest.skip(
            f"{path.name} runs against the S3/GCS test servers: {_RUN_AGAINST_SERVERS[path.name]}"
        )
    script = _script(path, tmp_path)
    if not script:
        pytest.skip(f"{path.name} has no runnable python block")
    # An image or venv without some extras (e.g. the lean Docker image) skips the
    # docs that need them rather than failing on ImportError.
    missing = _missing_modules(DATA_SETUP + script)
    if missing:
        pytest.skip(f"{path.name} imports {', '.join(missing)}, not installed (an extra)")
    # A copy: blocks may append to, merge or delete what they read.
    shutil.copytree(doc_data, tmp_path / "data", symlinks=True)
    (tmp_path / "doc_blocks.py").write_text(SETUP + "\n" + script)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "doc_blocks.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, f"{path.name}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
