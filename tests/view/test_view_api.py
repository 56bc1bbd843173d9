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
    # Positions of thousands of digits (int() refuses them): the whole body, never a 500.
    for header in ("bytes=" + "9" * 5000 + "-", "bytes=-" + "9" * 5000, "bytes=0-" + "9" * 5000):
        status, _, body = client.get(url, {"Range": header})
        assert status == 200 and body == stored, (header[:20], status)


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
