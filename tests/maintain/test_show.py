"""`rlds-writer show`: an episode's images as a GIF, for datasets from us and from TFDS."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers_core import random_episodes, write_with_tfds
from PIL import Image

import rlds_writer
from rlds_writer.cli.main import main
from rlds_writer.maintain.episode_video import (
    _LABEL_HEIGHT,
    _STRIP_HEIGHT,
    _STRIP_LABEL,
    episode_frames,
    render_episode,
)


@pytest.fixture(scope="module")
def cameras(tmp_path_factory):
    """A TFDS-written dataset with a 16x16 RGB camera and a 16x16 depth image."""
    config = rlds_writer.DatasetConfig(
        name="cams",
        observation_info={
            "image": tfds.features.Image(shape=(16, 16, 3)),
            "depth": tfds.features.Image(shape=(16, 16, 1), dtype=np.uint16),
        },
        action_info=np.int64,
        reward_info=np.float32,
    )
    path = tmp_path_factory.mktemp("show") / "cams"
    episodes = random_episodes(config, np.random.default_rng(0), lengths=[6, 3])
    write_with_tfds(path, config, episodes)
    return path


def test_frames_show_each_recorded_image_scaled_up_exactly(cameras):
    episode = rlds_writer.open_dataset(cameras).episodes()[0]
    frames, fields = episode_frames(episode, ["observation/image"])
    assert fields == ["observation/image"]
    assert len(frames) == 6
    for t, frame in enumerate(frames):
        # 16 px scaled by 6 to the 96 px minimum height, nearest neighbour,
        # under the row of field labels.
        expected = episode["steps"]["observation"]["image"][t].repeat(6, 0).repeat(6, 1)
        np.testing.assert_array_equal(frame[_LABEL_HEIGHT : _LABEL_HEIGHT + 96, :96], expected)


def test_gif_has_a_frame_per_step_with_every_camera_side_by_side(cameras, tmp_path):
    done = render_episode(cameras, tmp_path / "ep.gif", episode=1)
    assert done["frames"] == 3
    assert sorted(done["fields"]) == ["observation/depth", "observation/image"]
    gif = Image.open(tmp_path / "ep.gif")
    assert gif.n_frames == 3
    assert gif.size == done["size"] and gif.size[0] == 2 * 96 + 48  # two panels, label room


def test_catch_boards_render_from_our_own_recording(tmp_path, capsys):
    assert main(["record", "--output", str(tmp_path / "c"), "--episodes", "2"]) == 0
    out = tmp_path / "catch.gif"
    assert main(["show", str(tmp_path / "c"), "--episode", "1", "--out", str(out)]) == 0
    assert "10 frames" in capsys.readouterr().out
    assert Image.open(out).n_frames == 10


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--out", "ep.png"], "must end in .gif or .mp4"),
        (["--out", "ep.gif", "--episode", "7"], r"has 2 episodes; --episode must be in 0..1"),
        (["--out", "ep.gif", "--field", "observation/nope"], "no image field"),
    ],
)
def test_user_mistakes_are_one_line(cameras, tmp_path, capsys, argv, match):
    argv = [a if a != "ep.gif" else str(tmp_path / "ep.gif") for a in argv]
    assert main(["show", str(cameras), *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(match, err)


def _write_cameras(path, steps: int, signal: bool = False) -> None:
    """One episode of `steps` steps: two smooth 48x48 cameras, a 16x16 depth image and scalars."""
    observation_info = {
        "image": tfds.features.Image(shape=(48, 48, 3)),
        "wrist_image": tfds.features.Image(shape=(48, 48, 3)),
        "depth": tfds.features.Image(shape=(16, 16, 1), dtype=np.uint16),
    }
    if signal:
        observation_info["signal"] = tfds.features.Tensor(shape=(3, 4000), dtype=np.uint8)
    config = rlds_writer.DatasetConfig(
        name="cams",
        observation_info=observation_info,
        action_info=np.int64,
        reward_info=np.float32,
        step_metadata_info={"gripper_opening_width": np.float32},
    )
    t = np.arange(steps)
    ramp = np.add.outer(np.arange(48), np.arange(48))
    observation = {
        "image": [
            np.stack([(ramp * 3 + i * 11) % 256, ramp % 256, 255 - ramp * 2 % 256], -1).astype(
                np.uint8
            )
            for i in t
        ],
        "wrist_image": [np.full((48, 48, 3), i * 13 % 256, np.uint8) for i in t],
        "depth": [((ramp[:16, :16] + i) * 500).astype(np.uint16)[..., None] for i in t],
    }
    if signal:
        observation["signal"] = [np.full((3, 4000), i % 256, np.uint8) for i in t]
    with rlds_writer.TFDSBackendWriter(path, config) as writer:
        writer.write_episode(
            {
                "observation": observation,
                "action": list(t[:-1] % 3),
                "reward": list(np.sin(t[:-1] / 3).astype(np.float32)),
                "gripper_opening_width": list((t / steps).astype(np.float32)),
            }
        )


def test_gif_frames_label_each_camera_and_strip_without_overlap(tmp_path):
    _write_cameras(tmp_path / "ds", 12)
    done = render_episode(tmp_path / "ds", tmp_path / "ep.gif")
    assert done["fields"] == ["observation/depth", "observation/image", "observation/wrist_image"]
    episode = rlds_writer.open_dataset(tmp_path / "ds").episodes()[0]
    frames, _ = episode_frames(episode)

    def text(pixels):  # light grey, anti-aliased
        return (pixels.min(-1) > 110) & (np.ptp(pixels.astype(int), -1) < 12)

    line = np.array([90, 160, 255])
    cursor = np.array([255, 80, 80])
    frame = frames[5]
    # Each camera's panel has its name in the label row above it (light text on
    # the label background), within the panel's own columns.
    labels = frame[:_LABEL_HEIGHT]
    for i in range(3):
        assert text(labels[:, 96 * i + 2 : 96 * (i + 1) - 2]).sum() > 20
    # Each strip: its label row holds text and no plot; its plot holds no text.
    top = _LABEL_HEIGHT + 96
    for row in range(3):
        strip = frame[top + row * _STRIP_HEIGHT : top + (row + 1) * _STRIP_HEIGHT]
        label, plot = strip[1 : 1 + _STRIP_LABEL], strip[_STRIP_LABEL + 1 :]
        assert text(label).sum() > 20
        assert not (label == line).all(-1).any() and not (label == cursor).all(-1).any()
        assert not text(plot).any()
        assert (plot == line).all(-1).any() and (plot == cursor).all(-1).any()
    # The GIF holds these frames (within its palette's rounding), readable by
    # another decoder than the Pillow that wrote each frame.
    gif = tf.io.decode_gif(tf.io.read_file(str(tmp_path / "ep.gif"))).numpy()
    assert gif.shape == (12, *frames[0].shape)
    for drawn, decoded in zip(frames, gif):
        assert np.abs(drawn.astype(int) - decoded).mean() < 2
    with Image.open(tmp_path / "ep.gif") as written:
        assert written.info["loop"] == 0 and written.info["duration"] == 100


def test_a_long_thin_array_is_not_taken_for_an_image_and_asked_for_stays_bounded(tmp_path):
    _write_cameras(tmp_path / "ds", 41, signal=True)
    done = render_episode(tmp_path / "ds", tmp_path / "all.gif")
    assert "observation/signal" not in done["fields"]
    done = render_episode(tmp_path / "ds", tmp_path / "sig.gif", fields=["observation/signal"])
    assert done["frames"] == 41
    width, height = done["size"]
    assert width <= 640 and height <= 640  # subsampled to a panel, not 32x wider


_PEAK = """
import resource, sys
from rlds_writer.maintain.episode_video import render_episode
render_episode(sys.argv[1], sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


# Slow: fresh processes at 150 and 600 steps, memory compared.
@pytest.mark.slow
def test_show_memory_does_not_grow_with_episode_length(tmp_path):
    peaks = {}
    for steps in (150, 600):
        _write_cameras(tmp_path / f"ds{steps}", steps)
        done = subprocess.run(
            [sys.executable, "-c", _PEAK, str(tmp_path / f"ds{steps}"), str(tmp_path / "x.gif")],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[steps] = int(done.stdout.split()[-1])
        assert Image.open(tmp_path / "x.gif").n_frames == steps
    # 450 more steps: the frames drawn would be 0.2 MB each if kept (~90 MB); allow
    # the record's own bytes and what the allocator and Pillow's GIF writer keep,
    # measured at 13-14 MB on the code of 2026-11-25 and today alike.
    assert peaks[600] - peaks[150] < 30, peaks


def test_mp4_holds_every_frame_at_an_even_size(tmp_path):
    av = pytest.importorskip("av")
    _write_cameras(tmp_path / "ds", 9)
    done = render_episode(tmp_path / "ds", tmp_path / "ep.mp4", fps=5)
    episode = rlds_writer.open_dataset(tmp_path / "ds").episodes()[0]
    frames, _ = episode_frames(episode)
    with av.open(str(tmp_path / "ep.mp4")) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert done["frames"] == len(decoded) == 9
    width, height = done["size"]
    assert decoded[0].shape == (height + height % 2, width + width % 2, 3)
    # Lossy, but each decoded frame is closest to the step it was drawn from.
    for t, image in enumerate(decoded):
        errors = [np.abs(image[:height, :width].astype(int) - f).mean() for f in frames]
        assert int(np.argmin(errors)) == t
