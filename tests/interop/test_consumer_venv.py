"""tests/consumer_venv.py: a venv pip cannot build fails the tests under CI, skips elsewhere;
the d3rlpy venv shares this venv's torch."""

from __future__ import annotations

from pathlib import Path

import consumer_venv
import pytest

# pip refuses this specifier itself, before asking any index.
_BROKEN = ("d3rlpy===",)


@pytest.mark.slow  # two pip runs
@pytest.mark.parametrize(
    "ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_venv_pip_cannot_build_fails_under_ci_and_skips_elsewhere(
    tmp_path, monkeypatch, ci, outcome
):
    monkeypatch.setattr(consumer_venv, "VENVS", tmp_path)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome) as caught:
        consumer_venv.consumer_python("broken", _BROKEN)
    message = str(caught.value)
    assert "could not create the broken consumer venv" in message
    assert "d3rlpy===" in message and "exited with" in message  # pip's own output included
    assert not (tmp_path / "broken").exists()  # no half-built venv is reused next time


def test_the_d3rlpy_venv_uses_this_venvs_torch_and_holds_no_copy(d3rlpy_python):
    import torch
    from consumer_venv import run_consumer

    out = run_consumer(
        d3rlpy_python,
        "-c",
        "import os, sysconfig, torch, d3rlpy\n"
        "print(os.path.realpath(torch.__file__))\n"
        "print(sysconfig.get_path('purelib'))\n",
        cwd=consumer_venv.ROOT,
    )
    torch_file, purelib = out.strip().splitlines()[-2:]
    assert torch_file == str(Path(torch.__file__).resolve())
    # No torch, nvidia-* or triton files of its own (PyPI's CUDA torch: several GB).
    own = sorted(p.name for p in Path(purelib).iterdir())
    assert not [n for n in own if n.split("-")[0].split("_")[0] in ("torch", "nvidia", "triton")], (
        own
    )
