"""`rlds-writer view`'s server without a browser: JSON shapes, the list, frames, borders."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers_viewer import TASKS, serving, write_robot

import rlds_writer
from rlds_writer.store.features import wire
from rlds_writer.view import server as server_lib

N = 14


@pytest.fixture(scope="module")
def robot(tmp_path_factory):
    path = tmp_path_factory.mktemp("view") / "robot"
    write_robot(path, N, max_episodes_per_file=5)
    return path


@pytest.fixture(scope="module")
def viewer(robot):
    with serving(robot) as (server, client):
        yield server, client


def _stored_frames(path, episode, key):
    reader = rlds_writer.open_dataset(path)
    ((_, record),) = list(reader.episodes("train")[episode : episode + 1].records())
    loc = wire.parse_example(record)[key]
    return wire.bytes_list(record, loc[1], loc[2])


def test_dataset_lists_cameras_plots_texts_flags_and_metadata(viewer):
    _, client = viewer
    info = client.json("/api/dataset")
    assert info["name"] == "robot" and info["splits"] == {"train": N}
    fields = info["fields"]
    assert [c["name"] for c in fields["cameras"]] == [
        "observation/image",
        "observation/wrist_image",
    ]
    assert all(c["format"] == "jpeg" for c in fields["cameras"])
    plots = {p["name"]: p["series"] for p in fields["plots"]}
    assert plots["action"] == [f"action[{i}]" for i in range(7)]
    assert plots["observation/state"] == [f"observation/state[{i}]" for i in range(4)]
    assert plots["reward"] == ["reward"]
    assert fields["flags"] == ["is_first", "is_last", "is_terminal"]
    assert fields["texts"] == ["language_instruction"]
    assert fields["instruction"] == "language_instruction"
    assert fields["episode_fields"] == ["operator", "success"]


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


def test_pages_cover_every_episode_once_in_order(viewer):
    _, client = viewer
    seen = []
    for offset in range(0, N, 5):
        page = client.json(f"/api/episodes?offset={offset}&limit=5")
        assert page["total"] == page["matched"] == N and page["offset"] == offset
        seen += [e["id"] for e in page["episodes"]]
    assert seen == list(range(N))
    row = client.json("/api/episodes?limit=1")["episodes"][0]
    assert set(row) == {"id", "length", "return", "ending", "instruction", "texts", "metadata"}
    assert row == {
        "id": 0,
        "length": 12,
        "return": 0.0,
        "ending": "truncated",
        "instruction": TASKS[0],
        "texts": [TASKS[0], f"{TASKS[0]}, then let go"],
        "metadata": {"operator": "operator-0", "success": False},
    }


def test_rows_agree_with_the_reader(robot, viewer):
    _, client = viewer
    rows = client.json(f"/api/episodes?limit={N}")["episodes"]
    for row, episode in zip(rows, rlds_writer.open_dataset(robot).episodes("train")):
        steps = episode["steps"]
        assert row["length"] == len(steps["is_first"])
        assert row["return"] == pytest.approx(float(np.sum(steps["reward"], dtype=np.float64)))
        assert row["ending"] == ("terminated" if steps["is_terminal"].any() else "truncated")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("min_length=14&max_length=15", [2, 3, 7, 8, 12, 13]),
        ("ending=terminated", [1, 3, 5, 7, 9, 11, 13]),
        ("ending=truncated,terminated&min_return=1.5", [5, 7, 9, 11, 13]),
        ("max_return=0.5", [0, 2, 4]),
        ("text=OPEN%20THE", [1, 4, 7, 10, 13]),
        ("text=then%20let%20go", list(range(N))),  # a step text, not the first one
        ("meta=operator%3Doperator-2", [2, 5, 8, 11]),
        ("meta=success%3Dtrue&text=drawer", [1, 7, 13]),
        ("meta=nosuchfield%3Dx", []),
    ],
)
def test_filters_narrow_the_list(viewer, query, expected):
    _, client = viewer
    page = client.json(f"/api/episodes?{query}&limit=500")
    assert [e["id"] for e in page["episodes"]] == expected
    assert page["matched"] == len(expected) and page["total"] == N


def test_sorting_is_stable_both_ways(viewer):
    _, client = viewer
    up = client.json("/api/episodes?sort=length&limit=500")["episodes"]
    down = client.json("/api/episodes?sort=length&order=desc&limit=500")["episodes"]
    assert [e["length"] for e in up] == sorted(e["length"] for e in up)
    assert [e["length"] for e in down] == sorted((e["length"] for e in up), reverse=True)
    # Ties keep episode order in both directions.
    assert [e["id"] for e in up[:3]] == [0, 5, 10]
    assert [e["id"] for e in down[:3]] == [4, 9, 3]
    by_operator = client.json("/api/episodes?sort=meta:operator&limit=500")["episodes"]
    assert [e["metadata"]["operator"] for e in by_operator] == sorted(
        e["metadata"]["operator"] for e in by_operator
    )


def test_next_and_previous_follow_the_filtered_order(viewer):
    _, client = viewer
    assert client.json("/api/episodes/3/next?dir=1")["id"] == 4
    assert client.json("/api/episodes/0/next?dir=-1")["id"] is None
    assert client.json("/api/episodes/3/next?dir=1&ending=terminated")["id"] == 5
    assert client.json("/api/episodes/5/next?dir=-1&ending=terminated")["id"] == 3
    assert client.json("/api/episodes/13/next?dir=1")["id"] is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sort=name", "sort: expected one of"),
        ("min_length=abc", "min_length: expected a number"),
        ("ending=crashed", "ending: expected some of"),
        ("limit=100000", "limit: expected 1..500"),
        ("meta=novalue", "meta: expected field=text"),
    ],
)
def test_a_bad_list_parameter_is_a_400_naming_it(viewer, query, message):
    _, client = viewer
    status, _, body = client.get(f"/api/episodes?{query}")
    assert status == 400 and message in json.loads(body)["error"]


def test_episode_holds_plots_flags_texts_and_metadata(viewer):
    _, client = viewer
    episode = client.json("/api/episodes/3")
    length = 15
    assert episode["id"] == 3 and episode["length"] == length
    assert [c["frames"] for c in episode["cameras"]] == [length, length]
    assert episode["flags"] == {
        "is_first": [0],
        "is_last": [length - 1],
        "is_terminal": [length - 1],
    }
    assert episode["texts"] == {
        "language_instruction": [[0, TASKS[0]], [length // 2, f"{TASKS[0]}, then let go"]]
    }
    assert episode["metadata"] == {"operator": "operator-0", "success": True}
    action = next(p for p in episode["plots"] if p["name"] == "action")
    assert action["bucket"] == 1 and len(action["values"]) == 7
    assert all(len(series) == length for series in action["values"])


def test_steps_are_exact_at_any_cursor(robot, viewer):
    _, client = viewer
    stored = rlds_writer.open_dataset(robot).episodes("train")[3]["steps"]
    info = client.json("/api/dataset")["fields"]
    steps = client.json("/api/episodes/3/steps?start=4&stop=7")
    assert (steps["start"], steps["stop"]) == (4, 7)
    action = steps["plots"][[p["name"] for p in info["plots"]].index("action")]
    np.testing.assert_array_equal(np.array(action, np.float32), stored["action"][4:7])
    assert steps["texts"]["language_instruction"] == [TASKS[0]] * 3
    assert steps["flags"]["is_first"] == [False] * 3


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


def test_frames_are_the_stored_bytes(robot, viewer):
    _, client = viewer
    for camera, key in enumerate(("steps/observation/image", "steps/observation/wrist_image")):
        stored = _stored_frames(robot, 6, key)
        for step in (0, 5, len(stored) - 1):
            status, headers, body = client.get(f"/api/episodes/6/frames/{camera}/{step}")
            assert status == 200 and headers["Content-Type"] == "image/jpeg"
            assert body == stored[step]
            assert headers["Accept-Ranges"] == "bytes"


def test_frames_answer_range_requests(robot, viewer):
    _, client = viewer
    stored = _stored_frames(robot, 2, "steps/observation/image")[3]
    size = len(stored)
    url = "/api/episodes/2/frames/0/3"
    cases = [("bytes=0-99", 0, 100), ("bytes=100-", 100, size), ("bytes=-50", size - 50, size)]
    for header, start, stop in cases:
        status, headers, body = client.get(url, {"Range": header})
        assert status == 206 and body == stored[start:stop]
        assert headers["Content-Range"] == f"bytes {start}-{stop - 1}/{size}"
    status, headers, _ = client.get(url, {"Range": f"bytes={size}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{size}"
    status, _, body = client.get(url, {"Range": "bytes=0-1,5-6"})  # several: the whole body
    assert status == 200 and body == stored


@pytest.mark.parametrize(
    "path",
    [
        "/api/episodes/14",
        "/api/episodes/99999999",
        "/api/episodes/-1",
        "/api/episodes/abc",
        "/api/episodes/1.5",
        "/api/episodes/1/frames/2/0",
        "/api/episodes/1/frames/0/999",
        "/api/episodes/1/frames/0/1/extra",
        "/api/episodes/1/frames/observation%2Fimage/0",
        "/api/episodes/1234567890123/frames/0/0",
        "/api/episodes?split=test",
        "/api/episodes?split=../../etc",
        "/static/../server.py",
        "/static/%2e%2e/server.py",
        "/static/index.html",
        "/static/",
        "/etc/passwd",
        "//etc/passwd",
        "/api/episodes/1/../../../../etc/passwd",
    ],
)
def test_bad_ids_and_paths_are_404(viewer, path):
    _, client = viewer
    status, headers, body = client.get(path)
    assert status == 404, (path, body)
    assert "error" in json.loads(body)
    assert headers["Content-Security-Policy"] == server_lib.CSP


def test_only_get_and_head(viewer):
    import urllib.request

    server, client = viewer
    request = urllib.request.Request(client.url + "/api/dataset", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 405
    status, headers, body = client.get("/api/episodes/0/frames/0/0")
    head = urllib.request.Request(client.url + "/api/episodes/0/frames/0/0", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as response:
        assert response.read() == b"" and response.headers["Content-Length"] == str(len(body))


def test_it_listens_on_loopback_and_refuses_other_host_names(viewer):
    server, client = viewer
    assert server.server_address[0] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")
    for host in ("localhost", f"127.0.0.1:{server.server_address[1]}", "[::1]:80"):
        assert client.get("/api/dataset", {"Host": host})[0] == 200
    # A page elsewhere reaching us through a name that resolves to 127.0.0.1 (DNS rebinding).
    status, _, body = client.get("/api/dataset", {"Host": "attacker.example:8000"})
    assert status == 403 and "loopback" in json.loads(body)["error"]
    assert client.get("/", {"Host": "attacker.example"})[0] == 403


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("example.org", False),
    ],
)
def test_only_loopback_addresses_count_as_local(host, loopback):
    assert server_lib.is_loopback(host) is loopback


def test_no_served_file_names_anything_outside(viewer):
    _, client = viewer
    paths = ["/"] + [f"/static/{name}" for name in server_lib.ASSETS]
    for path in paths:
        status, headers, body = client.get(path)
        assert status == 200, path
        text = body.decode("utf-8")
        assert not re.search(r"[a-z][a-z0-9+.-]*://", text, re.I), (path, "names a URL")
        # Every src/href is the server's own path (or an inline empty icon).
        for ref in re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", text):
            assert ref.startswith("/static/") or ref in ("data:,", "#"), (path, ref)
        assert not re.search(r"@import|url\(", text) or path.endswith(".js"), path
        assert headers["Content-Security-Policy"] == server_lib.CSP
        assert "default-src 'none'" in server_lib.CSP and "connect-src 'self'" in server_lib.CSP
    # The page is exactly the package's files: nothing else is served.
    listed = {
        p.name for p in server_lib.resources.files("rlds_writer.view").joinpath("static").iterdir()
    }
    assert listed == set(server_lib.ASSETS) | {server_lib.PAGE}


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
