"""Fixtures shared by the store's tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """`mount(size)`: a real disk of `size` ("1m"), a tmpfs under tmp_path.

    Skips the test where mounting is not allowed (it needs root); unmounted
    after the test.
    """
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mount_point = tmp_path / f"disk{len(mounted)}"
        mount_point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", os.fspath(mount_point)],
            capture_output=True,
        )
        if done.returncode != 0:
            pytest.skip("cannot mount a small tmpfs here (needs root)")
        mounted.append(mount_point)
        return mount_point

    try:
        yield mount
    finally:
        for mount_point in mounted:
            subprocess.run(["umount", "-l", os.fspath(mount_point)], check=False)
