"""Image worker processes start only when the encoding needs them.

A recording whose writer keeps up, or that ends first, encodes its frames on
the writer's thread and never starts a process (no fixed cost, nothing for
`close()` to wait for). A writer that falls behind on costly frames starts
the processes in the background and hands them the episodes that follow;
the bytes are those of the single-threaded encoder either way.
"""

from __future__ import annotations

import os
import threading

import pytest
from helpers_core import load_episodes
from test_image_processes import _Cameras, _run_episodes, _shard_bytes, _worker_pids

from rlds_writer import RecordRLDS
from rlds_writer.store.episodes import episode_data
from rlds_writer.store.images import image_processes
from rlds_writer.store.writing import encoding

pytestmark = pytest.mark.skipif(
    not image_processes.supported(), reason="image processes need Linux (memfd)"
)


@pytest.fixture(autouse=True)
def _no_idle_pool(monkeypatch):
    """No test finds processes another one left idle, or leaves any."""
    image_processes.shutdown()
    # These tests hold the writer so that episodes queue behind it; an env
    # that outruns it then waits for chunks (at most `_WAIT_MAX`, 5 s a chunk:
    # the bound itself is tested in test_chunk_recycling). Not here.
    monkeypatch.setattr(episode_data, "_WAIT_MAX", 0.05)
    yield
    image_processes.shutdown()


def _recorder(path, image_workers: int = 2) -> RecordRLDS:
    return RecordRLDS(_Cameras(), str(path), image_encoding="png", image_workers=image_workers)


def test_a_recording_that_keeps_up_never_starts_a_worker_process(tmp_path):
    env = _recorder(tmp_path / "ds")
    for _ in range(3):
        _run_episodes(env, 1, seed=0)
        env.flush()  # the writer is idle again: never behind
        assert _worker_pids(os.getpid()) == []
    encoder = env._recording.recorder.writer.encoder
    env.close()
    assert encoder._starter is None and not encoder._workers_up.is_set()
    reference = _recorder(tmp_path / "alone", image_workers=0)
    for _ in range(3):
        _run_episodes(reference, 1, seed=0)
    reference.close()
    assert _shard_bytes(tmp_path / "ds") == _shard_bytes(tmp_path / "alone")


def _fall_behind(env) -> None:
    """Records four episodes while the writer thread is held: they queue up behind it."""
    _run_episodes(env, 1, seed=0)
    env.flush()
    writer = env._recording.recorder.writer
    with writer._io_lock:
        _run_episodes(env, 4)


def test_a_writer_behind_on_costly_frames_starts_the_workers_and_keeps_the_bytes(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 1e-9)
    monkeypatch.setattr(encoding, "START_WORKERS_FRAME_SECONDS", 0.0)
    env = _recorder(tmp_path / "ds")
    encoder = env._recording.recorder.writer.encoder
    _fall_behind(env)
    env.flush()
    assert encoder._starter is not None
    encoder._starter.join(timeout=60)
    assert encoder._workers_up.is_set() and len(_worker_pids(os.getpid())) == 2
    submitted = []
    submit = encoder._processes.submit
    encoder._processes.submit = lambda jobs: submitted.append(jobs) or submit(jobs)
    _run_episodes(env, 2)  # after the workers are up: encoded there
    env.close()
    assert len(submitted) == 2
    image_processes.shutdown()  # close kept them for the next recording
    assert _worker_pids(os.getpid()) == []
    reference = _recorder(tmp_path / "alone", image_workers=0)
    _run_episodes(reference, 7, seed=0)
    reference.close()
    assert _shard_bytes(tmp_path / "ds") == _shard_bytes(tmp_path / "alone")


def test_frames_cheaper_than_handing_them_over_stay_on_the_writer_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 1e-9)
    monkeypatch.setattr(encoding, "START_WORKERS_FRAME_SECONDS", 10.0)  # no frame costs this
    env = _recorder(tmp_path / "ds")
    encoder = env._recording.recorder.writer.encoder
    _fall_behind(env)
    env.close()
    assert encoder._starter is None and _worker_pids(os.getpid()) == []


def test_closing_while_the_workers_start_leaves_no_process_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 1e-9)
    monkeypatch.setattr(encoding, "START_WORKERS_FRAME_SECONDS", 0.0)
    env = _recorder(tmp_path / "ds")
    encoder = env._recording.recorder.writer.encoder
    _fall_behind(env)
    env.close()  # at once: the start may still be under way
    assert encoder._starter is None
    for thread in threading.enumerate():  # a start under way leaves its processes idle
        if thread.name == "rlds_writer_start_workers":
            thread.join(timeout=60)
    image_processes.shutdown()
    assert _worker_pids(os.getpid()) == []
    assert len(load_episodes(tmp_path / "ds")) == 5


def test_an_episode_finished_while_the_last_one_was_encoded_counts_as_behind(tmp_path, monkeypatch):
    # Long episodes: the queue admits one at a time, so the next one is never
    # finished when encoding starts, only while it runs (as with real cameras).
    monkeypatch.setattr(encoding, "START_WORKERS_BEHIND_SECONDS", 1e-9)
    monkeypatch.setattr(encoding, "START_WORKERS_FRAME_SECONDS", 0.0)
    env = _recorder(tmp_path / "ds")
    encoder = env._recording.recorder.writer.encoder
    next_queued = threading.Event()
    encode_field = encoder._encode_image_field

    def encode_while_the_env_finishes_the_next(field, values):
        assert next_queued.wait(timeout=60)
        return encode_field(field, values)

    monkeypatch.setattr(encoder, "_encode_image_field", encode_while_the_env_finishes_the_next)
    _run_episodes(env, 1, seed=0)  # handed to the writer, which waits in its encoding
    _run_episodes(env, 1)  # finished while the first one is encoded
    next_queued.set()
    env.flush()
    assert encoder._starter is not None
    encoder._starter.join(timeout=60)
    assert encoder._workers_up.is_set()
    env.close()
    assert len(load_episodes(tmp_path / "ds")) == 2


def test_frames_encoded_in_process_use_the_encoding_threads_and_keep_the_bytes(
    tmp_path, monkeypatch
):
    # Before any process runs, an episode's PNG frames are shared by the encoding
    # threads (zlib releases the GIL), not left to the writer thread alone; no
    # process starts, and the bytes are those of the single-threaded encoder.
    # (JPEG frames this large are encoded while the episode runs: test_frame_stream.)
    image_encoding = "png"
    threads: set[str] = set()
    real = encoding.encode_png

    def encode_and_note_the_thread(image, *args):
        threads.add(threading.current_thread().name)
        return real(image, *args)

    monkeypatch.setattr(encoding, f"encode_{image_encoding}", encode_and_note_the_thread)
    monkeypatch.setattr(encoding, "THREADS_MIN_FRAME_BYTES", 48 * 48 * 3)  # these cameras' frames
    env = RecordRLDS(_Cameras(), str(tmp_path / "ds"), image_encoding=image_encoding)
    encoder = env._recording.recorder.writer.encoder
    _run_episodes(env, 3, seed=0)
    env.close()
    assert threads and all(name.startswith("rlds_writer_encode") for name in threads)
    assert encoder._starter is None and _worker_pids(os.getpid()) == []
    assert encoder._frame_seconds > 0  # measured on the threads: the start decision has it
    reference = RecordRLDS(
        _Cameras(), str(tmp_path / "alone"), image_encoding=image_encoding, image_workers=0
    )
    _run_episodes(reference, 3, seed=0)
    reference.close()
    assert _shard_bytes(tmp_path / "ds") == _shard_bytes(tmp_path / "alone")


@pytest.mark.parametrize("few", ["frames", "bytes per frame"])
def test_few_or_small_frames_are_encoded_on_the_writer_thread(tmp_path, monkeypatch, few):
    # Few PNG frames per episode, or JPEG frames too small to stream.
    threads: set[str] = set()
    image_encoding = "png" if few == "frames" else "jpeg"
    real = getattr(encoding, f"encode_{image_encoding}")

    def encode_and_note_the_thread(image, *args):
        threads.add(threading.current_thread().name)
        return real(image, *args)

    monkeypatch.setattr(encoding, f"encode_{image_encoding}", encode_and_note_the_thread)
    if few == "frames":
        monkeypatch.setattr(encoding, "THREADS_MIN_FRAME_BYTES", 0)
        steps = encoding.THREADS_MIN_FRAMES - 2  # steps + 1 frames per field
    else:  # 48x48x3 frames, smaller than the threads' minimum
        steps = 30
    env = RecordRLDS(_Cameras(steps=steps), str(tmp_path / "ds"), image_encoding=image_encoding)
    _run_episodes(env, 2, seed=0)
    env.close()
    assert threads and not any(name.startswith("rlds_writer_encode") for name in threads)
    assert len(load_episodes(tmp_path / "ds")) == 2
