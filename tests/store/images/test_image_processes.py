"""PNG/JPEG frames are encoded in worker processes that read them from shared memory.

Proved end to end: what the processes encode is byte for byte what the
recording process would encode, TFDS loads it, a worker killed with SIGKILL
costs no episode, workers do not outlive a recorder killed with SIGKILL, and
shared-memory slices are reused rather than grown without bound.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow_datasets as tfds
from gymnasium import spaces
from helpers_core import load_episodes

from rlds_writer import RecordRLDS
from rlds_writer.errors import EncodingError
from rlds_writer.store.episodes import shared_frames
from rlds_writer.store.images import image_processes
from rlds_writer.store.writing import encoding
from rlds_writer.store.writing.encoding import EpisodeEncoder

pytestmark = pytest.mark.skipif(
    not image_processes.supported(), reason="image processes need Linux (memfd)"
)


class _Cameras(gym.Env):
    """A JPEG camera and a PNG camera (by config), 48x48x3, smooth frames that change per step."""

    def __init__(self, steps: int = 30):
        self.steps = steps
        box = spaces.Box(0, 255, (48, 48, 3), np.uint8)
        self.observation_space = spaces.Dict({"image": box, "wrist_image": box})
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        ramp = np.add.outer(np.arange(48), np.arange(48)) * 3 + self.t * 11
        rgb = np.stack([ramp, ramp // 2, 255 - ramp % 256], axis=-1) % 256
        noise = self.np_random.integers(0, 4, (48, 48, 3))
        return {
            "image": (rgb + noise).clip(0, 255).astype(np.uint8),
            "wrist_image": (255 - rgb).astype(np.uint8),
        }

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, self.t >= self.steps, {}


@pytest.fixture(autouse=True)
def _workers_from_the_first_image_episode(monkeypatch):
    """These tests are about the processes: start them at once, not when the writer falls behind.

    Each test starts with no idle pool left by another (a closed recording
    keeps its processes for the next one) and leaves none.
    """
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 0.0)
    image_processes.shutdown()
    yield
    image_processes.shutdown()


def _worker_pids(parent: int) -> list[int]:
    """Live `image_worker` processes whose parent is `parent` (read from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if b"rlds_writer.store.images.image_worker" in cmdline and ppid == parent and state != "Z":
            out.append(int(name))
    return out


def _run_episodes(env, episodes: int, seed: int | None = None) -> None:
    for i in range(episodes):
        env.reset(seed=seed if i == 0 else None)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(np.zeros(2, np.float32))
            done = terminated or truncated


def _running(pid: int) -> bool:
    """Whether `pid` runs (an exited child that nobody reaped yet is a zombie: not running)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# Where a child process imports this module and the shared helpers from.
_TEST_PATH = [
    os.path.dirname(__file__),
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
]


def _child_recorder(path, encoding: str, body: str) -> str:
    """Source of a child process that opens a `_Cameras` recorder on `path`, then runs `body`."""
    head = f"""
import signal, sys, time
import numpy as np
# Ctrl-C raises KeyboardInterrupt even where this runs with SIGINT ignored (as
# a background job of a script is started): the tests send it.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path[:0] = {_TEST_PATH!r}
from test_image_processes import _Cameras
from rlds_writer import RecordRLDS
from rlds_writer.store.writing import encoding
encoding.START_WORKERS_BEHIND_SECONDS = 0.0  # the processes from the first episode
env = RecordRLDS(_Cameras(), {str(path)!r}, image_encoding={encoding!r})
env.reset(seed=0)
"""
    return head + textwrap.dedent(body)


def _wrist_frames() -> list[np.ndarray]:
    """The wrist camera's frames of one episode (they do not depend on the seed)."""
    env = _Cameras()
    frames = [env.reset(seed=0)[0]["wrist_image"]]
    frames += [env.step(None)[0]["wrist_image"] for _ in range(env.steps)]
    return frames


def _shard_bytes(path) -> bytes:
    return b"".join(
        (path / name).read_bytes() for name in sorted(os.listdir(path)) if ".tfrecord-" in name
    )


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_frames_encoded_in_worker_processes_are_the_bytes_encoded_in_process(
    tmp_path, encoding, record_episodes
):
    for name, workers in (("in_process", 0), ("workers", 2)):
        options = dict(image_encoding=encoding, image_workers=workers)
        record_episodes(
            _Cameras(), tmp_path / name, seed=3, action=np.zeros(2, np.float32), **options
        )
    assert _shard_bytes(tmp_path / "workers") == _shard_bytes(tmp_path / "in_process")
    episodes = load_episodes(tmp_path / "workers")
    assert [len(e["steps"]) for e in episodes] == [31, 31]
    first = episodes[0]["steps"][0]["observation"]["image"]
    assert first.shape == (48, 48, 3) and first.dtype == np.uint8
    if encoding == "png":  # lossless: TFDS decodes the recorded pixels
        expected = _Cameras().reset(seed=3)[0]["image"]
        np.testing.assert_array_equal(first, expected)


def test_recording_runs_the_encoding_in_child_processes(tmp_path):
    env = RecordRLDS(_Cameras(), str(tmp_path / "ds"), image_encoding="jpeg", image_workers=2)
    _run_episodes(env, 1, seed=0)
    env.flush()
    workers = _worker_pids(os.getpid())
    assert len(workers) == 2
    env.close()  # kept, idle, for the next recording of this process
    assert _worker_pids(os.getpid()) == workers
    image_processes.shutdown()
    assert _worker_pids(os.getpid()) == []


def test_a_worker_killed_with_sigkill_loses_no_episode(tmp_path, caplog):
    path = tmp_path / "ds"
    env = RecordRLDS(_Cameras(), str(path), image_encoding="png", image_workers=2)
    _run_episodes(env, 1, seed=0)
    env.flush()
    workers = _worker_pids(os.getpid())
    assert len(workers) == 2
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="rlds_writer.store.writing.encoding"):
        _run_episodes(env, 2)  # encoded after the workers died
        env.close()
    assert "encoding images in the recording process" in caplog.text
    episodes = load_episodes(path)
    assert len(episodes) == 3
    expected = _wrist_frames()
    for episode in episodes:
        recorded = [step["observation"]["wrist_image"] for step in episode["steps"]]
        np.testing.assert_array_equal(np.stack(recorded), np.stack(expected))


def test_workers_exit_when_the_recording_process_is_killed(tmp_path):
    script = _child_recorder(
        tmp_path / "ds",
        "jpeg",
        """
        for _ in range(_Cameras().steps):
            env.step(np.zeros(2, np.float32))
        env.flush()
        print("ready", flush=True)
        time.sleep(600)
        """,
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        workers = _worker_pids(child.pid)
        assert len(workers) == 2
        child.kill()
        child.wait()
        deadline = time.monotonic() + 20
        # Orphans go to PID 1, which reaps them (or, in a container whose PID 1
        # is this test run, leaves them as zombies).
        while any(_running(pid) for pid in workers):
            assert time.monotonic() < deadline, "image workers outlived the recorder"
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    # The episode flushed (and committed) before the kill loads.
    builder = tfds.builder_from_directory(str(tmp_path / "ds"))
    assert builder.info.splits["train"].num_examples == 1


@pytest.mark.slow
def test_ctrl_c_stops_the_loop_and_the_workers_still_encode_the_last_episodes(tmp_path):
    script = _child_recorder(
        tmp_path / "ds",
        "png",
        """
        try:
            while True:
                env.step(np.zeros(2, np.float32))
                if env.unwrapped.t == 20:
                    print("ready", flush=True)
                    time.sleep(0.01)
                if env.unwrapped.t == 30:
                    env.reset()
        except KeyboardInterrupt:
            # A close that hangs fails with every thread's stack, not a bare timeout.
            import faulthandler
            faulthandler.dump_traceback_later(90, exit=True)
            env.close()
            print("closed", flush=True)
        """,
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a shell gives a foreground job
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        os.killpg(child.pid, signal.SIGINT)  # what Ctrl-C sends: the whole group
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
        child.wait()
    assert "closed" in out, err
    assert "encoding images in the recording process" not in err
    assert "Traceback" not in err
    episodes = load_episodes(tmp_path / "ds")
    # Every episode the env ended is whole (30 steps and the last observation).
    # The one open at Ctrl-C is written cut short, with as many steps as it had:
    # one (its first observation) when the Ctrl-C came right after a reset.
    ended = [e for e in episodes if e["end_reason"] != b"cut_short"]
    assert len(ended) >= 2 and all(len(e["steps"]) == 31 for e in ended)
    assert len(episodes) - len(ended) <= 1 and all(len(e["steps"]) >= 1 for e in episodes)


def test_frames_from_ordinary_memory_are_copied_to_shared_slots_and_encode_the_same():
    camera = tfds.features.Image(shape=(32, 32, 3), encoding_format="jpeg")
    features = tfds.features.FeaturesDict(
        {"steps": tfds.features.Dataset({"observation": {"image": camera}})}
    )
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8)  # not in shared memory
    assert shared_frames.arena().locate(frames) is None
    columns = {"steps/observation/image": frames}
    alone = EpisodeEncoder(features, image_workers=0)
    pooled = EpisodeEncoder(features, image_workers=2)
    try:
        assert pooled.encode(columns, {}) == alone.encode(columns, {})
        assert pooled._processes is not None  # still the processes, not a fallback
    finally:
        pooled.close()


def test_a_frame_a_worker_cannot_encode_is_an_error_naming_the_field_and_the_pool_recovers():
    pool = image_processes.ImageProcessPool(1)
    try:
        two_channels = np.zeros((3, 8, 8, 2), np.uint8)  # JPEG takes 1 or 3 channels
        with pytest.raises(EncodingError) as failed:
            pool.encode(
                [("png", 0, [np.zeros((2, 8, 8, 3), np.uint8)]), ("jpeg", 95, [two_channels])]
            )
        assert isinstance(failed.value, image_processes.BatchFailed) and failed.value.job == 1
        good = pool.encode([("png", 0, [np.zeros((3, 8, 8, 3), np.uint8)])])
        assert len(good) == 1 and sum(map(len, good[0])) > 0
    finally:
        pool.close()


def test_released_shared_slices_are_reused_not_grown():
    arena = shared_frames.arena()
    shape = (7, 33, 33, 3)  # a size no other test uses
    first = [shared_frames.shared_empty(shape, np.uint8) for _ in range(3)]
    offsets = [arena.locate(a) for a in first]
    size = os.fstat(arena.fd).st_size
    view = first[0][2:]  # a view keeps its slice alive
    del first
    again = [shared_frames.shared_empty(shape, np.uint8) for _ in range(2)]
    assert sorted(arena.locate(a) for a in again) == sorted(offsets[1:])
    assert os.fstat(arena.fd).st_size == size
    assert arena.locate(view) == offsets[0] + view[0].nbytes * 2


def _in_process_entries(codec: str, frames: np.ndarray) -> bytes:
    from rlds_writer.store.features.wire import bytes_entries
    from rlds_writer.store.images.image_codecs import encode_jpeg, encode_png

    encode = encode_png if codec == "png" else (lambda f: encode_jpeg(f, 95))
    return bytes_entries([encode(f) for f in frames])


def test_batches_queued_ahead_come_back_whole_and_a_failed_one_spoils_no_other():
    rng = np.random.default_rng(1)
    a, c, d = (rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8) for n in (9, 5, 7))
    pool = image_processes.ImageProcessPool(2)
    try:
        first = pool.submit([("png", 0, [a])])
        bad = pool.submit([("jpeg", 95, [np.zeros((3, 8, 8, 2), np.uint8)])])
        third = pool.submit([("jpeg", 95, [c])])
        queued = []

        def submit_d_once() -> bool:
            queued.append(pool.submit([("png", 0, [d])]))
            return True

        assert b"".join(pool.wait(first, submit_d_once)[0]) == _in_process_entries("png", a)
        assert len(queued) == 1  # asked once, then no more
        with pytest.raises(image_processes.BatchFailed):
            pool.wait(bad)
        assert b"".join(pool.wait(third)[0]) == _in_process_entries("jpeg", c)
        assert b"".join(pool.wait(queued[0])[0]) == _in_process_entries("png", d)
    finally:
        pool.close()


def test_a_discarded_batch_is_not_encoded_further_and_never_reaches_a_later_one(monkeypatch):
    rng = np.random.default_rng(2)
    dropped, kept = (rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8) for n in (40, 6))
    sent = []
    send = image_processes._Worker.send

    def counted(worker, task, codec, quality, frames):
        sent.append(len(frames))
        send(worker, task, codec, quality, frames)

    monkeypatch.setattr(image_processes._Worker, "send", counted)
    pool = image_processes.ImageProcessPool(1)
    try:
        pool.discard(pool.submit([("png", 0, [dropped])]))
        in_flight = sum(sent)
        assert in_flight < len(dropped)  # the tasks not yet sent are dropped
        assert b"".join(pool.wait(pool.submit([("png", 0, [kept])]))[0]) == (
            _in_process_entries("png", kept)
        )
        assert sum(sent) == in_flight + len(kept)
    finally:
        pool.close()


def _camera_features(encoding: str = "jpeg"):
    camera = tfds.features.Image(shape=(24, 24, 3), encoding_format=encoding)
    return tfds.features.FeaturesDict(
        {"steps": tfds.features.Dataset({"observation": {"image": camera}})}
    )


def _camera_columns(seed: int, steps: int = 12) -> dict[str, np.ndarray]:
    frames = shared_frames.shared_empty((steps, 24, 24, 3), np.uint8)
    frames[:] = np.random.default_rng(seed).integers(0, 256, frames.shape, dtype=np.uint8)
    return {"steps/observation/image": frames}


def test_the_next_episode_is_encoded_ahead_and_its_bytes_are_the_same():
    features = _camera_features()
    first, second, third = (_camera_columns(seed) for seed in (0, 1, 2))
    alone = EpisodeEncoder(features, image_workers=0)
    pooled = EpisodeEncoder(features, image_workers=2)
    try:
        parts, _ = pooled.encode_parts(first, {}, upcoming=lambda: second)
        assert b"".join(parts) == alone.encode(first, {})
        assert pooled._ahead is not None and pooled._ahead[0] is second
        assert pooled.encode(second, {}) == alone.encode(second, {})
        # Queued ahead for an episode that is then not the next one: dropped.
        pooled.encode_parts(third, {}, upcoming=lambda: first)
        assert pooled.encode(second, {}) == alone.encode(second, {})
        assert pooled._ahead is None and pooled._processes is not None
    finally:
        pooled.close()


def test_the_writer_hands_the_queued_episode_to_the_workers_before_writing_the_current_one(
    tmp_path,
):
    path = tmp_path / "ds"
    env = RecordRLDS(_Cameras(), str(path), image_encoding="png", image_workers=2)
    _run_episodes(env, 1, seed=0)
    env.flush()  # the workers are started
    writer = env._recording.recorder.writer
    pool = writer.encoder._processes
    events = []
    submit, wait = pool.submit, pool.wait

    def logged_submit(jobs):
        handle = submit(jobs)
        events.append(("submit", handle))
        return handle

    def logged_wait(handle, between=None):
        out = wait(handle, between)
        events.append(("collected", handle))
        return out

    pool.submit, pool.wait = logged_submit, logged_wait
    with writer._io_lock:  # the writer thread waits: the next episodes queue up
        _run_episodes(env, 3)  # each ends at its last step: all three are queued
    env.close()
    # Each episode's frames went to the workers before the one before it was collected.
    handles = [h for kind, h in events if kind == "submit"]
    assert len(handles) == 3
    for earlier, later in zip(handles, handles[1:]):
        assert events.index(("submit", later)) < events.index(("collected", earlier))
    episodes = load_episodes(path)
    assert len(episodes) == 4
    expected = np.stack(_wrist_frames())
    for episode in episodes:
        recorded = [step["observation"]["wrist_image"] for step in episode["steps"]]
        np.testing.assert_array_equal(np.stack(recorded), expected)


_PLANTED = """
import os
with open(os.path.join({markers!r}, __name__ + "-" + str(os.getpid())), "w") as f:
    f.write(repr(__file__))
"""


def test_workers_import_nothing_from_the_working_directory_or_a_relative_pythonpath(tmp_path):
    # Modules named like ones the worker imports, planted where the user works
    # (the working directory, and `sub` on PYTHONPATH as a relative entry):
    # importing any of them leaves a marker naming the process.
    markers, plant, script_dir = tmp_path / "markers", tmp_path / "work", tmp_path / "script"
    for d in (markers, plant / "sub", script_dir):
        d.mkdir(parents=True)
    for where, name in [(plant, "mmap"), (plant, "socket"), (plant / "sub", "struct")]:
        (where / f"{name}.py").write_text(_PLANTED.format(markers=str(markers)))
    (plant / "sub" / "pickle.py").write_text(_PLANTED.format(markers=str(markers)))
    # The recording process itself drops the planted directories from its own
    # path, so any marker comes from a worker.
    script = script_dir / "record.py"
    script.write_text(
        f"""
import sys
sys.path[:] = [p for p in sys.path if not p.startswith({str(plant)!r})]
sys.path[:0] = {_TEST_PATH!r}
import logging, os
logging.basicConfig(level=logging.WARNING)
from test_image_processes import _Cameras, _run_episodes, _worker_pids
from rlds_writer import RecordRLDS
from rlds_writer.store.writing import encoding
encoding.START_WORKERS_BEHIND_SECONDS = 0.0  # the processes from the first episode
env = RecordRLDS(_Cameras(), {str(tmp_path / "ds")!r}, image_encoding="png", image_workers=2)
_run_episodes(env, 2)
env.flush()
print("workers", len(_worker_pids(os.getpid())), flush=True)
env.close()
"""
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), "sub"]).lstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=plant, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "workers 2" in done.stdout
    assert "encoding images in the recording process" not in done.stderr
    assert sorted(os.listdir(markers)) == []
    # The planted modules do load where Python looks for them: a plain
    # `python -c` started there imports them (the check above can fail).
    probe = subprocess.run(
        [sys.executable, "-c", "import mmap, struct"], cwd=plant, env=env, capture_output=True
    )
    assert probe.returncode == 0
    assert sorted(n.split("-")[0] for n in os.listdir(markers)) == ["mmap", "struct"]
    # Every frame the workers encoded decodes to what the env drew (PNG is lossless).
    episodes = load_episodes(tmp_path / "ds")
    assert len(episodes) == 2
    for episode in episodes:
        recorded = [step["observation"]["wrist_image"] for step in episode["steps"]]
        np.testing.assert_array_equal(np.stack(recorded), np.stack(_wrist_frames()))
