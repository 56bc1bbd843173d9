"""A format is a plugin: registered from outside the package, it works everywhere formats do.

The test declares a tiny format of its own (episodes as JSON lines, one file
per episode, both ways, with a `--reward-scale` option), registers it with
`rlds_writer.interop.register` and nothing else, then finds it in `convert
--help`/`export --help` and runs it end to end through the real command
line: JSON lines → RLDS (loaded back with TFDS) → JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pytest

import rlds_writer
from rlds_writer.cli.main import build_parser, main
from rlds_writer.interop import (
    EXPORT_FORMATS,
    FORMATS,
    Exporter,
    Importer,
    Option,
    register,
    registry,
    unregister,
)
from rlds_writer.interop.episodes import SourceEpisode, write_episodes
from rlds_writer.interop.export import ExportReport, open_source, source_episodes

SCALE = Option(
    "reward_scale", "multiply every reward by FACTOR (default 1)", type=float, metavar="FACTOR"
)


def convert_jsonl(src, dest, *, reward_scale=1.0, name=None, **write_kwargs):
    """Each `<i>.jsonl` file of `src` is an episode: one line per observation."""
    files = sorted(Path(src).glob("*.jsonl"))

    def episodes():
        for path in files:
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            yield SourceEpisode(
                observations=np.array([r["obs"] for r in rows], np.float32),
                actions=np.array([r["action"] for r in rows[:-1]], np.int64),
                rewards=np.array([r["reward"] for r in rows[:-1]], np.float32) * reward_scale,
                terminated=bool(rows[-1].get("done")),
            )

    return write_episodes(
        episodes, dest, name=name or "tiny", source=os.fspath(src), **write_kwargs
    )


def export_jsonl(
    src, dest, *, split="train", cut_short="truncated", reward_scale=1.0, progress=False
):
    reader = open_source(src, split)
    report = ExportReport(source=os.fspath(src), destination=os.fspath(dest), format="tiny-jsonl")
    Path(dest).mkdir()
    try:
        for episode, end in source_episodes(reader, split, report, cut_short=cut_short):
            steps = episode["steps"]
            lines = [
                {
                    "obs": steps["observation"][t].tolist(),
                    "action": int(steps["action"][t]),
                    "reward": float(steps["reward"][t]) * reward_scale,
                }
                for t in range(len(steps["is_last"]))
            ]
            lines[-1]["done"] = end == "terminated"
            text = "".join(json.dumps(line) + "\n" for line in lines)
            (Path(dest) / f"{report.episodes}.jsonl").write_text(text)
            report.episodes += 1
            report.transitions += len(lines) - 1
            report.terminated += end == "terminated"
            report.truncated += end != "terminated"
    finally:
        reader.close()
    return report


@pytest.fixture
def tiny_format():
    register(
        Importer(
            "tiny-jsonl",
            convert_jsonl,
            "tiny JSON-lines episodes",
            "a directory of <i>.jsonl files",
            options=(SCALE,),
        ),
        Exporter(
            "tiny-jsonl",
            export_jsonl,
            "tiny JSON-lines episodes",
            "a new directory of <i>.jsonl files",
            options=(SCALE,),
        ),
    )
    yield
    unregister("tiny-jsonl", "convert")
    unregister("tiny-jsonl", "export")


def _help(capsys, command):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def _source(tmp_path):
    src = tmp_path / "jsonl"
    src.mkdir()
    for i, length in enumerate((3, 5)):
        rows = [{"obs": [t, i], "action": t % 2, "reward": 1.0} for t in range(length)]
        rows[-1]["done"] = i == 0
        (src / f"{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def test_a_registered_format_is_in_the_help_and_runs_end_to_end(tmp_path, capsys, tiny_format):
    assert "tiny-jsonl" in FORMATS and "tiny-jsonl" in EXPORT_FORMATS
    for command, what in (("convert", "SRC is a directory"), ("export", "DEST is a new directory")):
        own = _help(capsys, command)
        assert f"tiny-jsonl tiny JSON-lines episodes; {what} of <i>.jsonl files" in own
        assert "--reward-scale FACTOR tiny-jsonl: multiply every reward by FACTOR" in own

    src, rlds = _source(tmp_path), tmp_path / "rlds"
    argv = ["convert", "--from", "tiny-jsonl", str(src), str(rlds), "--reward-scale", "2"]
    assert main(argv) == 0
    assert "2 episodes (8 steps;" in capsys.readouterr().out
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(rlds))
    by_length = {}
    for episode in builder.as_dataset(split="train"):
        steps = next(iter(tfds.as_numpy(episode["steps"].batch(100))))
        by_length[len(steps["reward"])] = steps
    assert sorted(by_length) == [3, 5]
    assert by_length[3]["reward"].tolist() == [2.0, 2.0, 0.0]  # scaled; zero on the final step
    assert by_length[3]["is_terminal"].tolist() == [False, False, True]
    assert by_length[5]["is_terminal"].tolist() == [False] * 5
    assert by_length[5]["observation"][:, 1].tolist() == [1.0] * 5

    out = tmp_path / "out"
    argv = ["export", "--to", "tiny-jsonl", str(rlds), str(out), "--reward-scale", "0.5"]
    assert main(argv) == 0
    assert "2 episodes (6 transitions; 1 terminated, 1 truncated)" in capsys.readouterr().out
    back = sorted(out.iterdir())
    assert [p.name for p in back] == ["0.jsonl", "1.jsonl"]
    # Staged like every export: nothing but the result next to it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jsonl", "out", "rlds"]
    rows = [json.loads(line) for p in back for line in p.read_text().splitlines()]
    assert sorted(r["obs"] for r in rows) == sorted(
        [float(t), float(i)] for i, n in enumerate((3, 5)) for t in range(n)
    )
    assert {r["reward"] for r in rows if "done" not in r} == {1.0}  # 1 * 2 * 0.5
    # And from Python, through the same dispatch.
    report = rlds_writer.export(rlds, tmp_path / "py", to="tiny-jsonl")
    assert report.episodes == 2 and report.format == "tiny-jsonl"


def test_its_flags_are_refused_for_other_formats_and_theirs_for_it(tmp_path, capsys, tiny_format):
    src = _source(tmp_path)
    argv = ["convert", "--from", "npz-dir", str(src), str(tmp_path / "a"), "--reward-scale", "2"]
    assert main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("rlds-writer convert: error: --reward-scale applies to --from tiny-jsonl only")
    argv = ["convert", "--from", "tiny-jsonl", str(src), str(tmp_path / "b"), "--drop-partial"]
    assert main(argv) == 1
    assert "--drop-partial applies to --from d4rl-hdf5 only" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_name_or_flag_taken_is_refused_at_registration(tiny_format):
    with pytest.raises(ValueError, match="'tiny-jsonl' is already registered"):
        register(Importer("tiny-jsonl", convert_jsonl, "again", "a directory"))
    clash = Option("reward_scale", "the same flag parsed differently", type=int)
    with pytest.raises(ValueError, match="--reward-scale is declared differently"):
        register(Importer("other-jsonl", convert_jsonl, "other", "a directory", options=(clash,)))
    common = Option("split", "a flag every export already has")
    with pytest.raises(ValueError, match="--split is one every export format takes"):
        register(Exporter("other-jsonl", export_jsonl, "other", "a directory", options=(common,)))
    assert "other-jsonl" not in FORMATS and "other-jsonl" not in EXPORT_FORMATS


def test_the_flags_every_format_takes_are_the_parsers_own():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for direction in ("convert", "export"):
        flags = {f for a in commands.choices[direction]._actions for f in a.option_strings}
        options = {o.cli_flag for o, _ in registry.options_of(direction)}
        assert flags - options == set(registry.COMMON_FLAGS[direction]), direction


def test_unregistered_it_is_gone(capsys):
    assert "tiny-jsonl" not in FORMATS and "tiny-jsonl" not in EXPORT_FORMATS
    assert "tiny-jsonl" not in _help(capsys, "convert")
