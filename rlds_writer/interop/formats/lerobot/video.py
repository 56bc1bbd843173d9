"""MP4 camera streams for LeRobot `video` features, encoded with PyAV (the `lerobot` extra).

LeRobot v3.0 keeps each camera as `videos/<key>/chunk-XXX/file-XXX.mp4`:
consecutive episodes are appended to one file, which is closed and the next
one begun past `video_files_size_in_mb`; `meta/episodes` says where each
episode is (`videos/<key>/chunk_index`, `file_index`, `from_timestamp`,
`to_timestamp`, in seconds from the start of the file). Frame `i` of a file is
shown at `i / fps` exactly (presentation timestamps in units of `1 / fps`),
which is what LeRobot's decoders look frames up by. Encoding is lossy
(`yuv420p`), as LeRobot's own videos are.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from rlds_writer.errors import SpecError, import_optional
from rlds_writer.interop.formats.lerobot import layout

CODECS = ("h264", "libsvtav1")


def eligible(shape: tuple[int, ...]) -> bool:
    """Whether an image of this shape can be a video (RGB, even height and width for yuv420p)."""
    return len(shape) == 3 and shape[2] == 3 and shape[0] % 2 == 0 and shape[1] % 2 == 0


class VideoStreams:
    """One open MP4 per camera key, appended to episode by episode."""

    def __init__(
        self,
        root: Path,
        shapes: dict[str, tuple[int, ...]],
        fps: int,
        limit_mb: float,
        chunks_size: int,
        codec: str = "h264",
    ):
        import_optional("av", "encoding cameras as MP4 (video=True; else they are PNG images)")
        if codec not in CODECS:
            raise ValueError(f"video codec must be one of {CODECS}, got {codec!r}")
        self.root, self.shapes, self.fps, self.codec = root, shapes, fps, codec
        self.limit, self.chunks_size = limit_mb * 1024 * 1024, chunks_size
        self.open: dict[str, dict[str, Any]] = {}
        self.where = {key: (0, 0) for key in shapes}

    def info(self, key: str) -> dict[str, Any]:
        """The `info` entry LeRobot keeps with a video feature."""
        height, width, channels = self.shapes[key]
        return {
            "video.height": height,
            "video.width": width,
            "video.codec": "av1" if self.codec == "libsvtav1" else self.codec,
            "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False,
            "video.fps": self.fps,
            "video.channels": channels,
            "has_audio": False,
        }

    def _start(self, key: str) -> dict[str, Any]:
        import av

        chunk, file = self.where[key]
        path = self.root / layout.VIDEO_PATH.format(
            video_key=key, chunk_index=chunk, file_index=file
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        container = av.open(str(path), mode="w")
        stream = container.add_stream(self.codec, rate=self.fps)
        height, width, _ = self.shapes[key]
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # LeRobot's encoding defaults: a key frame every 2 frames (fast seeking), crf 30.
        stream.options = {"g": "2", "crf": "30"}
        return {"container": container, "stream": stream, "frames": 0, "path": path}

    def write(self, key: str, frames: np.ndarray) -> dict[str, Any]:
        """Appends one episode's frames; returns its `meta/episodes` columns."""
        import av

        if frames.shape[1:] != self.shapes[key]:
            raise SpecError(
                f"{key}: frames of shape {frames.shape[1:]}, expected {self.shapes[key]}"
            )
        state = self.open.get(key)
        if state is not None and os.path.getsize(state["path"]) >= self.limit:
            self._finish(key)
            self.where[key] = layout.next_file(*self.where[key], self.chunks_size)
            state = None
        if state is None:
            state = self.open[key] = self._start(key)
        start = state["frames"]
        for image in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts, frame.time_base = state["frames"], Fraction(1, self.fps)
            for packet in state["stream"].encode(frame):
                state["container"].mux(packet)
            state["frames"] += 1
        chunk, file = self.where[key]
        return {
            f"videos/{key}/chunk_index": chunk,
            f"videos/{key}/file_index": file,
            f"videos/{key}/from_timestamp": start / self.fps,
            f"videos/{key}/to_timestamp": state["frames"] / self.fps,
        }

    def _finish(self, key: str) -> None:
        state = self.open.pop(key)
        for packet in state["stream"].encode(None):
            state["container"].mux(packet)
        state["container"].close()

    def close(self) -> None:
        for key in list(self.open):
            self._finish(key)


def meta_types(keys: list[str]) -> list[tuple[str, Any]]:
    """The Arrow types of the `videos/<key>/...` columns of `meta/episodes`."""
    import pyarrow as pa

    out = []
    for key in keys:
        out += [(f"videos/{key}/chunk_index", pa.int64()), (f"videos/{key}/file_index", pa.int64())]
        out += [(f"videos/{key}/{n}_timestamp", pa.float64()) for n in ("from", "to")]
    return out


class VideoFrames:
    """Decodes LeRobot camera files episode by episode, reading each file once, in order."""

    def __init__(self, root: Path, info: dict[str, Any]):
        import_optional("av", "decoding this LeRobot dataset's MP4 cameras")
        template = info.get("video_path") or layout.VIDEO_PATH
        where = str(root / layout.INFO_PATH)
        self.root, self.template = root, layout.check_video_path(template, where)
        self.tolerance = 0.5 / float(info["fps"])
        self.open: dict[str, dict[str, Any]] = {}

    def _state(self, key: str, path: Path, start: float) -> dict[str, Any]:
        import av

        state = self.open.get(key)
        if state is None or state["path"] != path or state["last"] > start + self.tolerance:
            if state is not None:
                state["container"].close()
            if not path.is_file():
                raise SpecError(f"{path}: missing (camera {key!r} of the LeRobot dataset)")
            container = av.open(str(path))
            state = {"path": path, "container": container, "frames": container.decode(video=0)}
            state.update(pending=None, last=float("-inf"))
            self.open[key] = state
        return state

    def episode(self, key: str, meta: dict[str, Any]) -> np.ndarray:
        """The (length, H, W, 3) uint8 frames of one episode's camera `key`."""
        names = [f"videos/{key}/{n}" for n in ("chunk_index", "file_index")]
        names += [f"videos/{key}/{n}_timestamp" for n in ("from", "to")]
        missing = [n for n in names if meta.get(n) is None]
        if missing:
            raise SpecError(
                f"meta/episodes has no {missing[0]} for episode {meta['episode_index']}"
            )
        chunk, file, start, stop = (meta[n] for n in names)
        path = layout.video_file(self.root, self.template, key, chunk, file)
        state = self._state(key, path, start)
        frames: list[np.ndarray] = []
        while len(frames) < meta["length"]:
            frame = state["pending"] or next(state["frames"], None)
            state["pending"] = None
            if frame is None:
                break
            seconds = float(frame.pts * frame.time_base)
            state["last"] = seconds
            if seconds < start - self.tolerance:
                continue
            if seconds >= stop - self.tolerance:
                state["pending"] = frame
                break
            frames.append(frame.to_ndarray(format="rgb24"))
        if len(frames) != meta["length"]:
            raise SpecError(
                f"{path}: {len(frames)} frames of {key} between {start}s and {stop}s, "
                f"meta/episodes says episode {meta['episode_index']} has {meta['length']}"
            )
        return np.stack(frames)

    def close(self) -> None:
        for state in self.open.values():
            state["container"].close()
        self.open = {}
