"""Importers at the border: source files that reach other files, forge sizes or loop.

Each hostile file is built here, in the test's tmp dir. HDF5 sources that
take data from a victim file (external links, external raw storage, virtual
datasets) are refused before anything is read, and the victim's values never
reach an output; declared sizes (npy headers, HDF5 dataspaces, zip members,
task indices) are checked against the bytes on disk, and the bombs are run in
a child whose peak memory is measured. Every case ends in one line naming the
file and the field, through the CLI (no traceback) and through Python.
"""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
from hostile_sources import (
    MARKER,
    d4rl_file,
    deflate_bomb,
    episode_arrays,
    hdf5_episodes_file,
    lerobot_dir,
    marker_in,
    npy_bytes,
    npy_header,
    npz_members,
    run_cli_measured,
    victim,
)

import rlds_writer
from rlds_writer.cli.main import main
from rlds_writer.errors import SourceError

# The bombs' child may grow by this much over its imports (a memory bound, not a timing).
MEMORY_BOUND = 1 << 30


def _cli_error(capsys, argv, *expected):
    """Runs the CLI; asserts exit 1 and one stderr line holding every `expected` regex."""
    capsys.readouterr()
    assert main(argv) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    for pattern in expected:
        assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def _python_error(fn, *expected):
    with pytest.raises(SourceError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message
    for pattern in expected:
        assert re.search(pattern, message), message
    return message


def _both(capsys, tmp_path, fmt, src, *expected, options=()):
    dest = tmp_path / "out"
    _cli_error(capsys, ["convert", "--from", fmt, str(src), str(dest), *options], *expected)
    assert not dest.exists() or not marker_in(dest)
    _python_error(lambda: rlds_writer.convert(fmt, src, tmp_path / "out_py"), *expected)
    assert not (tmp_path / "out_py").exists() or not marker_in(tmp_path / "out_py")


# ------------------------------------------------------------ item 4: HDF5 reaching other files


def _external_link(f, key, secret):
    f[key] = h5py.ExternalLink(str(secret), "/secret")


def _external_storage(f, key, secret):
    f.create_dataset(
        key, shape=(6, 3), dtype="<f8", external=[(str(secret.with_suffix(".raw")), 0, 144)]
    )


def _virtual(f, key, secret):
    layout = h5py.VirtualLayout(shape=(6, 3), dtype="f8")
    layout[:] = h5py.VirtualSource(str(secret), "secret", shape=(6, 3))
    f.create_virtual_dataset(key, layout)


REACHES = {
    "external link": (_external_link, r"external link to /secret in .*victim\.h5"),
    "external storage": (_external_storage, r"external files .*victim\.raw"),
    "virtual dataset": (_virtual, r"virtual dataset reading .*victim\.h5"),
}


@pytest.mark.parametrize("kind", REACHES)
def test_d4rl_file_reaching_another_file_is_refused(kind, tmp_path, capsys):
    secret = victim(tmp_path / "victim.h5")
    before = secret.read_bytes()
    src = tmp_path / "d4rl.hdf5"
    d4rl_file(src)
    make, message = REACHES[kind]
    with h5py.File(src, "a") as f:
        del f["observations"]
        make(f, "observations", secret)
    _both(capsys, tmp_path, "d4rl-hdf5", src, re.escape(str(src)), "/observations", message)
    assert secret.read_bytes() == before


@pytest.mark.parametrize("kind", REACHES)
def test_hdf5_episodes_reaching_another_file_are_refused(kind, tmp_path, capsys):
    secret = victim(tmp_path / "victim.h5")
    src = hdf5_episodes_file(tmp_path / "demos.hdf5")
    make, message = REACHES[kind]
    with h5py.File(src, "a") as f:
        del f["data/demo_1/obs"]
        make(f, "data/demo_1/obs", secret)
    _both(capsys, tmp_path, "hdf5-episodes", src, "data/demo_1/obs", message)


def test_external_link_hidden_behind_a_soft_link_is_refused(tmp_path, capsys):
    """A soft link leads to any path of the file: the whole file is checked when opened."""
    secret = victim(tmp_path / "victim.h5")
    src = d4rl_file(tmp_path / "d4rl.hdf5")
    with h5py.File(src, "a") as f:
        del f["observations"]
        f["zz/hidden"] = h5py.ExternalLink(str(secret), "/secret")
        f["observations"] = h5py.SoftLink("/zz/hidden")
    _both(capsys, tmp_path, "d4rl-hdf5", src, "/zz/hidden", "external link")


def test_honest_soft_and_hard_links_still_convert(tmp_path):
    src = d4rl_file(tmp_path / "d4rl.hdf5")
    with h5py.File(src, "a") as f:
        f["infos/qpos"] = np.arange(12.0).reshape(6, 2)
        f["infos/alias"] = h5py.SoftLink("/infos/qpos")  # listed once
        f["metadata/same_group"] = f["infos"]  # a second name, no cycle
    report = rlds_writer.convert("d4rl-hdf5", src, tmp_path / "out")
    assert report.episodes == 2
    steps = next(iter(rlds_writer.open_dataset(tmp_path / "out").episodes("train")))["steps"]
    np.testing.assert_array_equal(steps["infos"]["qpos"], np.arange(12.0).reshape(6, 2)[:3])


# ------------------------------------------------------------ item 11: cycles, fps 0


@pytest.mark.parametrize("link", ["hard", "soft"])
def test_d4rl_group_linking_to_itself_is_one_line(link, tmp_path, capsys):
    src = d4rl_file(tmp_path / "d4rl.hdf5")
    with h5py.File(src, "a") as f:
        f["infos/qpos"] = np.zeros((6, 2))
        f["infos/loop"] = f["infos"] if link == "hard" else h5py.SoftLink("/infos")
    _both(capsys, tmp_path, "d4rl-hdf5", src, r"/infos/loop links back to /infos", "cycle")


def test_lerobot_fps_zero_is_one_line(tmp_path, capsys):
    video = {"cam": {"dtype": "video", "shape": [8, 8, 3], "names": None}}
    src = lerobot_dir(tmp_path / "lerobot", fps=0, extra_features=video)
    _both(capsys, tmp_path, "lerobot", src, r"meta/info\.json: fps is 0", "positive")


@pytest.mark.parametrize("fps", [-5, "30", None, 1e400])
def test_lerobot_bad_fps_values_are_one_line(fps, tmp_path):
    video = {"cam": {"dtype": "video", "shape": [8, 8, 3], "names": None}}
    src = lerobot_dir(tmp_path / "lerobot", fps=fps, extra_features=video)
    if fps == 1e400:  # json writes Infinity
        info = json.loads((src / "meta" / "info.json").read_text())
        assert info["fps"] == float("inf")
    _python_error(lambda: rlds_writer.convert("lerobot", src, tmp_path / "out"), "fps")


def test_honest_lerobot_directory_converts(tmp_path):
    src = lerobot_dir(tmp_path / "lerobot")
    report = rlds_writer.convert("lerobot", src, tmp_path / "out")
    assert (report.episodes, report.steps) == (2, 6)


# ------------------------------------------------------------ item 10: declared sizes


def test_npz_with_a_forged_header_is_one_line(tmp_path, capsys):
    arrays = episode_arrays()
    src = tmp_path / "npz"
    src.mkdir()
    members = {f"{k}.npy": npy_bytes(v) for k, v in arrays.items()}
    # 2**40 float64 declared, 120 bytes of data.
    members["observations.npy"] = npy_header("<f8", (2**40,)) + arrays["observations"].tobytes()
    npz_members(src / "0.npz", members)
    expected = r"observations\.npy declares float64\[1099511627776\] \(8\.0 TiB\) but holds 120 B"
    _both(capsys, tmp_path, "npz-dir", src, re.escape(str(src / "0.npz")), expected)
    result, stderr = run_cli_measured("convert", "--from", "npz-dir", str(src), str(tmp_path / "m"))
    print(f"npz header of 2**40 floats: child growth {result['growth']}")
    assert result["code"] == 1 and result["growth"] < MEMORY_BOUND, (result, stderr)
    assert re.search(expected, stderr) and len(stderr.strip().splitlines()) == 1, stderr


def test_npy_file_with_a_forged_header_is_one_line(tmp_path, capsys):
    src = tmp_path / "npy"
    (src / "ep0").mkdir(parents=True)
    for key, value in episode_arrays().items():
        np.save(src / "ep0" / f"{key}.npy", value)
    forged = npy_header("<f4", (2**36, 4)) + b"\0" * 64
    (src / "ep0" / "actions.npy").write_bytes(forged)
    _both(capsys, tmp_path, "npz-dir", src, r"actions\.npy declares float32\[68719476736,4\]")


def test_npz_object_array_is_refused_without_unpickling(tmp_path, capsys):
    src = tmp_path / "npz"
    src.mkdir()
    arrays = {f"{k}.npy": npy_bytes(v) for k, v in episode_arrays().items()}
    arrays["observations.npy"] = npy_header("|O", (2,)) + b"\x80\x04N."  # a pickle
    npz_members(src / "0.npz", arrays)
    _both(capsys, tmp_path, "npz-dir", src, r"observations\.npy is object\[2\]", "pickle")


def test_npz_deflate_bomb_is_refused_within_bounded_memory(tmp_path, capsys):
    src = tmp_path / "npz"
    src.mkdir()
    deflate_bomb(src / "0.npz", 1536 << 20)  # 1.5 GiB of zeros in about 1.5 MB
    result, stderr = run_cli_measured("convert", "--from", "npz-dir", str(src), str(tmp_path / "o"))
    print(f"npz deflate bomb: child baseline {result['baseline']}, growth {result['growth']}")
    assert result["code"] == 1 and result["growth"] < MEMORY_BOUND, (result, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "0.npz: observations.npy declares float64[201326592]" in lines[0]
    assert "decompression bomb" in lines[0]
    _python_error(lambda: rlds_writer.convert("npz-dir", src, tmp_path / "py"), "observations")


def test_max_inflation_lets_a_genuine_compressible_file_through(tmp_path, monkeypatch, capsys):
    from rlds_writer.interop import source_limits

    # The allowance is 64 MiB; lowered here so that a small file shows the rule.
    monkeypatch.setattr(source_limits, "INFLATION_ALLOWANCE", 1 << 20)
    src = tmp_path / "npz"
    src.mkdir()
    arrays = episode_arrays(n=1 << 13)
    arrays["observations"] = np.zeros((1 << 13, 128))  # 8 MiB of zeros, about 8 kB deflated
    arrays["actions"][:] = arrays["rewards"][:] = 0
    np.savez_compressed(src / "0.npz", **arrays)
    _python_error(
        lambda: rlds_writer.convert("npz-dir", src, tmp_path / "a"),
        r"observations\.npy declares float64\[8192,128\]",
        "--max-inflation",
    )
    report = rlds_writer.convert("npz-dir", src, tmp_path / "b", max_inflation=5000)
    assert report.steps == 1 << 13
    argv = ["convert", "--from", "npz-dir", str(src), str(tmp_path / "c")]
    assert main([*argv, "--max-inflation", "5000"]) == 0
    _cli_error(capsys, [*argv, "--max-inflation", "0"], "positive ratio")
    lerobot = ["convert", "--from", "lerobot", str(src), str(tmp_path / "d")]
    _cli_error(
        capsys,
        [*lerobot, "--max-inflation", "5"],
        "applies to --from d4rl-hdf5, npz-dir and hdf5-episodes only",
    )


def _huge_unallocated(f, key, rows, row_shape=(), dtype="f4"):
    """A chunked dataset declaring `rows` rows, no chunk written: the file stays small."""
    if key in f:
        del f[key]
    f.create_dataset(key, shape=(rows, *row_shape), dtype=dtype, chunks=(1024, *row_shape))


def test_d4rl_dataset_declaring_2_36_rows_is_refused_within_bounded_memory(tmp_path, capsys):
    src = d4rl_file(tmp_path / "d4rl.hdf5")
    with h5py.File(src, "a") as f:
        for key, shape, dtype in [
            ("observations", (3,), "f8"),
            ("actions", (2,), "f4"),
            ("rewards", (), "f4"),
            ("terminals", (), "bool"),
            ("timeouts", (), "bool"),
        ]:
            _huge_unallocated(f, key, 2**36, shape, dtype)
    assert src.stat().st_size < 1 << 20
    expected = "observations declares float64[68719476736,3]"
    result, stderr = run_cli_measured(
        "convert", "--from", "d4rl-hdf5", str(src), str(tmp_path / "o")
    )
    print(f"d4rl 2**36 rows: child baseline {result['baseline']}, growth {result['growth']}")
    assert result["code"] == 1 and result["growth"] < MEMORY_BOUND, (result, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and str(src) in lines[0], stderr
    _python_error(
        lambda: rlds_writer.convert("d4rl-hdf5", src, tmp_path / "p"), re.escape(expected)
    )


def test_hdf5_episode_dataset_declaring_2_36_rows_is_refused(tmp_path, capsys):
    src = hdf5_episodes_file(tmp_path / "demos.hdf5")
    with h5py.File(src, "a") as f:
        _huge_unallocated(f, "data/demo_0/obs", 2**36, (3,), "f8")
    result, stderr = run_cli_measured(
        "convert", "--from", "hdf5-episodes", str(src), str(tmp_path / "o")
    )
    print(f"hdf5-episodes 2**36 rows: child growth {result['growth']}")
    assert result["code"] == 1 and result["growth"] < MEMORY_BOUND, (result, stderr)
    assert "data/demo_0/obs declares float64[68719476736,3]" in stderr
    _both(capsys, tmp_path, "hdf5-episodes", src, "data/demo_0/obs declares")


def test_lerobot_task_index_of_10_11_is_one_line_within_bounded_memory(tmp_path, capsys):
    src = lerobot_dir(tmp_path / "lerobot", tasks={"reach": 10**11})
    result, stderr = run_cli_measured("convert", "--from", "lerobot", str(src), str(tmp_path / "o"))
    print(f"tasks.parquet index 10**11: child growth {result['growth']}")
    assert result["code"] == 1 and result["growth"] < MEMORY_BOUND, (result, stderr)
    expected = r"tasks\.parquet: task_index 100000000000 of task 'reach'"
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(expected, lines[0]), stderr
    _both(capsys, tmp_path, "lerobot", src, expected)


def test_lerobot_frame_with_an_unknown_task_index_is_one_line(tmp_path, capsys):
    src = lerobot_dir(tmp_path / "lerobot", tasks={"reach": 0, "push": 1})
    import pyarrow.parquet as pq

    data = src / "data" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(data)
    i = table.column_names.index("task_index")
    import pyarrow as pa

    table = table.set_column(i, "task_index", pa.array([0, 0, 0, 7, 7, 7], pa.int64()))
    pq.write_table(table, data)
    _both(capsys, tmp_path, "lerobot", src, r"task_index 7 is not in meta/tasks\.parquet")


def test_marker_check_sees_the_victim():
    """The victim check is not vacuous: the marker's bytes are found where they are."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        Path(d, "x").write_bytes(b"ab" + np.float64(MARKER).tobytes())
        assert marker_in(Path(d))


def test_a_file_name_with_a_newline_still_gives_one_line(tmp_path, capsys):
    src = tmp_path / "npz"
    src.mkdir()
    members = {f"{k}.npy": npy_bytes(v) for k, v in episode_arrays().items()}
    members["observations.npy"] = npy_header("<f8", (2**40,))
    npz_members(src / "evil\nname.npz", members)
    line = _cli_error(
        capsys, ["convert", "--from", "npz-dir", str(src), str(tmp_path / "o")], r"evil\\nname"
    )
    assert "declares float64[1099511627776]" in line
