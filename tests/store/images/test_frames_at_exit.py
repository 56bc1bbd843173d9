"""An image episode left open at exit is written with the frames the env drew.

At interpreter exit the recorder writes the open episode (cut short) from an
`atexit` handler. Frames in shared memory must still be there then: the
arena's slices are not released by `weakref.finalize`'s own exit hook, which
runs first (it zeroed the frames' pages, or left the workers no frames to read).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from helpers_core import load_episodes
from test_image_processes import _child_recorder, _wrist_frames

from rlds_writer.store.images import image_processes

pytestmark = pytest.mark.skipif(
    not image_processes.supported(), reason="image processes need Linux (memfd)"
)


@pytest.mark.parametrize("encoding", ["png", "jpeg"])
def test_an_open_image_episode_is_written_at_exit_with_its_frames(tmp_path, encoding):
    script = _child_recorder(
        tmp_path / "ds",
        encoding,
        """
        for _ in range(_Cameras().steps):
            env.step(np.zeros(2, np.float32))
        env.flush()  # the first episode is written: the processes run
        for _ in range(3):
            env.reset()
            for _ in range(_Cameras().steps):
                env.step(np.zeros(2, np.float32))
        env.flush()  # episodes whose chunks were taken while the processes ran
        env.reset()
        for _ in range(7):
            env.step(np.zeros(2, np.float32))
        # exit with that episode open: written at exit, cut short
        """,
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr, done.stderr
    episodes = load_episodes(tmp_path / "ds")
    assert len(episodes) == 5
    last = np.stack([step["observation"]["wrist_image"] for step in episodes[-1]["steps"]])
    expected = np.stack(_wrist_frames()[:8])
    if encoding == "png":
        np.testing.assert_array_equal(last, expected)
    else:  # lossy, but never zeros
        assert np.abs(last.astype(int) - expected.astype(int)).mean() < 8
