"""`rlds-writer view` on datasets of every kind: fields it cannot draw, long episodes, hostile
frames, records that do not decode, arrays as cameras, several splits, object storage."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers_viewer import serving, write_robot

import rlds_writer
from rlds_writer.store.features import wire

N = 14


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    path = tmp_path_factory.mktemp("view_datasets") / "robot"
    write_robot(path, N, max_episodes_per_file=5)
    return path


def _stored_frames(path, episode, key):
    reader = rlds_writer.open_dataset(path)
    ((_, record),) = list(reader.episodes("train")[episode : episode + 1].records())
    loc = wire.parse_example(record)[key]
    return wire.bytes_list(record, loc[1], loc[2])


def test_fields_it_cannot_draw_are_listed_with_the_reason(tmp_path):
    import tensorflow_datasets as tfds

    config = rlds_writer.DatasetConfig(
        name="odd",
        observation_info={
            "lidar": tfds.features.Tensor(shape=(360,), dtype=np.float32),
            "labels": tfds.features.Tensor(shape=(2,), dtype=np.str_),
        },
        action_info=np.int64,
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "odd", config) as writer:
        writer.write_episode(
            {
                "observation": {
                    "lidar": np.zeros((3, 360), np.float32),
                    "labels": np.array([["a", "b"]] * 3, object),
                },
                "action": [1, 2],
            }
        )
    with serving(tmp_path / "odd") as (_, client):
        left_out = {
            f["name"]: f["reason"] for f in client.json("/api/dataset")["fields"]["left_out"]
        }
        assert "360 values per step" in left_out["observation/lidar"]
        assert "plots draw at most 32 series" in left_out["observation/lidar"]
        assert "text of shape" in left_out["observation/labels"]
        episode = client.json("/api/episodes/0")
        assert [p["name"] for p in client.json("/api/dataset")["fields"]["plots"]] == ["action"]
        assert episode["cameras"] == []


def test_float_images_are_left_out_as_no_picture_a_browser_shows():
    from rlds_writer.store.features.features import PNG, Features, Leaf
    from rlds_writer.view.fields import layout

    def image(name, dtype):
        path = ("steps", "observation", name)
        return Leaf(path, "/".join(path), PNG, np.dtype(dtype), (4, 4, 1), True, "Image", "png")

    shown = layout(Features((image("depth", np.float32), image("ir", np.uint16)), True))
    assert [leaf.path[-1] for leaf in shown.cameras] == ["ir"]
    assert "a float32 image" in shown.left_out["observation/depth"]


def test_long_episodes_are_drawn_downsampled_and_read_exactly(tmp_path):
    import tensorflow_datasets as tfds

    config = rlds_writer.DatasetConfig(
        name="long",
        observation_info=np.float32,
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.float64),
    )
    n = 5001
    rng = np.random.default_rng(0)
    observation = rng.normal(size=n).astype(np.float32)
    observation[1234] = 50.0  # a spike the envelope must keep
    with rlds_writer.TFDSBackendWriter(tmp_path / "long", config) as writer:
        writer.write_episode({"observation": observation, "action": rng.normal(size=(n - 1, 2))})
    with serving(tmp_path / "long") as (_, client):
        names = [p["name"] for p in client.json("/api/dataset")["fields"]["plots"]]
        episode = client.json("/api/episodes/0")
        plot = episode["plots"][names.index("observation")]
        assert plot["bucket"] == 6 and "values" not in plot
        assert len(plot["min"][0]) == len(plot["max"][0]) == -(-n // 6)
        assert max(plot["max"][0]) == 50.0
        lows = np.array(plot["min"][0])
        highs = np.array(plot["max"][0])
        buckets = np.pad(observation, (0, len(lows) * 6 - n), constant_values=np.nan)
        np.testing.assert_array_equal(lows, np.nanmin(buckets.reshape(-1, 6), axis=1))
        np.testing.assert_array_equal(highs, np.nanmax(buckets.reshape(-1, 6), axis=1))
        exact = client.json("/api/episodes/0/steps?start=1230&stop=1240")["plots"]
        np.testing.assert_array_equal(
            np.array(exact[names.index("observation")], np.float32)[:, 0], observation[1230:1240]
        )
        assert len(client.json("/api/episodes/0/steps?start=0&stop=99999")["plots"][0]) == 1000


def test_frames_that_are_not_the_features_images_are_refused_not_served(tmp_path):
    import io
    import struct
    import zlib

    import tensorflow_datasets as tfds
    from PIL import Image

    def saved(fmt, shape=(16, 16, 3)):
        buf = io.BytesIO()
        Image.fromarray(np.full(shape, 90, np.uint8)).save(buf, format=fmt)
        return buf.getvalue()

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    # A PNG whose header declares 60000x60000 pixels over a few bytes (a bomb).
    bomb = b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)),
            chunk(b"IDAT", zlib.compress(b"\0" * 1000)),
            chunk(b"IEND", b""),
        ]
    )
    frames = [saved("PNG"), saved("GIF"), bomb, saved("PNG")]
    config = rlds_writer.DatasetConfig(
        name="hostile",
        observation_info={"cam": tfds.features.Image(shape=(None, None, 3))},
        action_info=np.int64,
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "hostile", config) as writer:
        writer.write_episode({"observation": {"cam": frames}, "action": [0, 0, 0]})
    with serving(tmp_path / "hostile") as (_, client):
        assert client.json("/api/episodes")["episodes"][0]["length"] == 4  # no frame decoded
        assert client.json("/api/episodes/0")["cameras"][0]["frames"] == 4
        status, headers, body = client.get("/api/episodes/0/frames/0/0")
        assert status == 200 and body == frames[0] and headers["Content-Type"] == "image/png"
        status, headers, body = client.get("/api/episodes/0/frames/0/1")
        assert status == 415 and "stored image is GIF" in json.loads(body)["error"]
        assert headers["Content-Type"] == "application/json"
        status, _, body = client.get("/api/episodes/0/frames/0/2")
        assert status == 415 and "60000x60000" in json.loads(body)["error"]
        assert client.get("/api/episodes/0/frames/0/3")[0] == 200


@pytest.mark.slow
def test_a_dataset_in_object_storage_is_served_and_never_written_to(robot, object_store):
    from byte_relay import upload

    url = object_store.path("robot")
    upload(robot, url)
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    before = sorted(fs.ls(root))
    with serving(url) as (_, client):
        assert client.json("/api/dataset")["splits"] == {"train": N}
        page = client.json("/api/episodes?ending=terminated&limit=100")
        assert [e["id"] for e in page["episodes"]] == [1, 3, 5, 7, 9, 11, 13]
        stored = _stored_frames(robot, 5, "steps/observation/wrist_image")
        assert client.get("/api/episodes/5/frames/1/4")[2] == stored[4]
    fs.invalidate_cache()
    assert sorted(fs.ls(root)) == before  # no index cache written into the bucket


def test_each_split_has_its_own_list_and_episodes(tmp_path, record_episodes):
    import tensorflow_datasets as tfds

    config = rlds_writer.DatasetConfig(
        name="splits",
        observation_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        action_info=np.int64,
        reward_info=np.float32,
    )
    record_episodes(config, tmp_path / "ds", episodes=5, splits=("train", "test"))
    with serving(tmp_path / "ds") as (_, client):
        assert client.json("/api/dataset")["splits"] == {"train": 3, "test": 2}
        assert client.json("/api/episodes")["split"] == "train"  # the first split
        test = client.json("/api/episodes?split=test")
        assert test["total"] == 2 and [e["id"] for e in test["episodes"]] == [0, 1]
        reader = rlds_writer.open_dataset(tmp_path / "ds")
        for e, episode in enumerate(reader.episodes("test")):
            assert client.json(f"/api/episodes/{e}?split=test")["length"] == len(
                episode["steps"]["is_first"]
            )
        assert client.get("/api/episodes/2?split=test")[0] == 404
        assert client.get("/api/episodes/2?split=train")[0] == 200


def test_an_episode_that_does_not_decode_is_listed_with_its_error(tmp_path):
    path = tmp_path / "robot"
    write_robot(path, 3)
    features = json.loads((path / "features.json").read_text())

    def retype(node):  # the reward is stored as floats; call it int64
        if isinstance(node, dict):
            if "reward" in node and isinstance(node["reward"], dict):
                node["reward"]["tensor"]["dtype"] = "int64"
                return True
            return any(retype(v) for v in node.values())
        return isinstance(node, list) and any(retype(v) for v in node)

    assert retype(features)
    (path / "features.json").write_text(json.dumps(features))
    with serving(path) as (_, client):
        rows = client.json("/api/episodes")["episodes"]
        assert len(rows) == 3 and all("reward" in row["error"] for row in rows)
        status, _, body = client.get("/api/episodes/1")
        assert status == 422 and "reward" in json.loads(body)["error"]


def test_uint8_arrays_shaped_like_pictures_are_cameras_served_as_png(tmp_path):
    import io

    import tensorflow_datasets as tfds
    from PIL import Image

    config = rlds_writer.DatasetConfig(
        name="arrays",
        observation_info={
            "frame": tfds.features.Tensor(shape=(24, 32, 3), dtype=np.uint8, encoding="bytes"),
            "grey": tfds.features.Tensor(shape=(20, 20), dtype=np.uint8),
            "board": tfds.features.Tensor(shape=(10, 5), dtype=np.uint8),  # too small
        },
        action_info=np.int64,
    )
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (4, 24, 32, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (4, 20, 20), dtype=np.uint8)
    with rlds_writer.TFDSBackendWriter(tmp_path / "arrays", config) as writer:
        writer.write_episode(
            {
                "observation": {
                    "frame": frames,
                    "grey": grey,
                    "board": np.zeros((4, 10, 5), np.uint8),
                },
                "action": [0, 1, 2],
            }
        )
    with serving(tmp_path / "arrays") as (_, client):
        fields = client.json("/api/dataset")["fields"]
        assert [(c["name"], c["format"]) for c in fields["cameras"]] == [
            ("observation/frame", "array"),
            ("observation/grey", "array"),
        ]
        assert "observation/board" in {f["name"] for f in fields["left_out"]}
        for camera, stored in enumerate((frames, grey)):
            for step in range(4):
                status, headers, body = client.get(f"/api/episodes/0/frames/{camera}/{step}")
                assert status == 200 and headers["Content-Type"] == "image/png"
                np.testing.assert_array_equal(
                    np.asarray(Image.open(io.BytesIO(body))), stored[step]
                )
        assert client.get("/api/episodes/0/frames/0/4")[0] == 404


def test_frames_too_large_for_a_browser_are_refused_whatever_the_feature_declares(tmp_path):
    """A fixed-size `Image` as large as it likes costs only its declaration to the
    reader; the page would decode each frame whole (a 20000x20000 PNG of zeros:
    gigabytes of the browser's memory). Such a camera is left out, and an open
    size frame over the same pixels is refused."""
    import io
    import struct
    import zlib

    import tensorflow_datasets as tfds
    from PIL import Image

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    def grey_zeros(side):
        packer = zlib.compressobj(9)
        rows = b"".join(packer.compress(b"\0" * (1 + side)) for _ in range(side))
        header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
        stream = rows + packer.flush()
        return b"".join(
            [
                b"\x89PNG\r\n\x1a\n",
                chunk(b"IHDR", header),
                chunk(b"IDAT", stream),
                chunk(b"IEND", b""),
            ]
        )

    small = io.BytesIO()
    Image.fromarray(np.full((16, 16), 90, np.uint8)).save(small, format="PNG")
    big = grey_zeros(4100)  # 16.8 M pixels, ~17 KB stored
    config = rlds_writer.DatasetConfig(
        name="large",
        observation_info={
            "huge": tfds.features.Image(shape=(4100, 4100, 1)),
            "open": tfds.features.Image(shape=(None, None, 1)),
        },
        action_info=np.int64,
    )
    with rlds_writer.TFDSBackendWriter(tmp_path / "large", config) as writer:
        writer.write_episode(
            {
                "observation": {"huge": [big, big], "open": [small.getvalue(), big]},
                "action": [0],
            }
        )
    with serving(tmp_path / "large") as (_, client):
        fields = client.json("/api/dataset")["fields"]
        assert [c["name"] for c in fields["cameras"]] == ["observation/open"]
        reasons = {f["name"]: f["reason"] for f in fields["left_out"]}
        assert reasons["observation/huge"].startswith("4100x4100 frames (uint8[4100,4100,1])")
        assert client.get("/api/episodes/0/frames/0/0")[0] == 200
        status, _, body = client.get("/api/episodes/0/frames/0/1")
        error = json.loads(body)["error"]
        assert status == 415 and "steps/observation/open, step 1: a 4100x4100 frame" in error
