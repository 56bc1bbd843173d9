"""Datasets and a running server for the viewer's tests (`rlds-writer view`)."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np

TASKS = ("pick up the red block", "open the drawer", "push the cup to the left")


def robot_config(size: int = 32, extra: dict | None = None) -> Any:
    """Two JPEG cameras, a 4-vector state, a 7-dof action, an instruction, episode metadata."""
    import tensorflow_datasets as tfds

    import rlds_writer

    observation = {
        "image": tfds.features.Image(shape=(size, size, 3), encoding_format="jpeg"),
        "wrist_image": tfds.features.Image(shape=(size, size, 3), encoding_format="jpeg"),
        "state": tfds.features.Tensor(shape=(4,), dtype=np.float32),
        **(extra or {}),
    }
    return rlds_writer.DatasetConfig(
        name="robot",
        observation_info=observation,
        action_info=tfds.features.Tensor(shape=(7,), dtype=np.float32),
        reward_info=np.float32,
        step_metadata_info={"language_instruction": tfds.features.Text()},
        episode_metadata_info={"operator": tfds.features.Text(), "success": np.bool_},
    )


def robot_episode(e: int, steps: int, size: int = 32, extra: dict | None = None) -> dict:
    """Episode `e`'s columns: frames that change every step, smooth signals, a reward at the end."""
    t = np.arange(steps)
    yy, xx = np.mgrid[0:size, 0:size]
    scale = 256 // size
    image = [
        np.stack([(xx * scale + i * 8) % 256, yy * scale, np.full_like(xx, e * 40 % 256)], -1)
        for i in t
    ]
    wrist = [
        np.stack([np.full_like(xx, i * 9 % 256), (xx + yy + i * 3) % 256, yy * scale], -1)
        for i in t
    ]
    half = steps // 2
    task = TASKS[e % len(TASKS)]
    observation = {
        "image": [a.astype(np.uint8) for a in image],
        "wrist_image": [a.astype(np.uint8) for a in wrist],
        "state": np.stack([np.sin(t / 5 + k) for k in range(4)], 1).astype(np.float32),
        **{k: v(t) for k, v in (extra or {}).items()},
    }
    return {
        "observation": observation,
        "action": np.stack([np.cos(t[:-1] / 7 + k) * (k + 1) / 7 for k in range(7)], 1).astype(
            np.float32
        ),
        "reward": ((t[:-1] == steps - 2) * (e % 2 + e / 10)).astype(np.float32),
        "language_instruction": [task if i < half else f"{task}, then let go" for i in t],
    }


def write_robot(path: Any, episodes: int, steps: int = 12, size: int = 32, **options: Any) -> None:
    """A dataset of `robot_config` episodes of `steps + e % 5` steps; odd ones terminate."""
    import rlds_writer

    with rlds_writer.TFDSBackendWriter(path, robot_config(size), **options) as writer:
        for e in range(episodes):
            writer.write_episode(
                robot_episode(e, steps + e % 5, size),
                episode_metadata={"operator": f"operator-{e % 3}", "success": bool(e % 2)},
                terminated=bool(e % 2),
            )


class Client:
    """GETs from a running viewer; `json(path)` / `get(path)` -> (status, headers, body)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def get(self, path: str, headers: dict | None = None) -> tuple[int, Any, bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)


@contextlib.contextmanager
def serving(path: Any, **options: Any) -> Iterator[tuple[Any, Client]]:
    """A viewer over `path` on a free loopback port, stopped afterwards: (server, client)."""
    from rlds_writer.view.server import start
    from rlds_writer.view.source import ViewerSource

    source = ViewerSource(path, **options)
    server, thread = start(source)
    try:
        yield server, Client(server.url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        source.close()
