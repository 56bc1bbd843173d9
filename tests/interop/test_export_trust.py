"""Minari and RLlib interop take nothing from a dataset but data.

* A dataset naming code (an env id `module:Id`, a Minari env spec whose
  `entry_point` is a planted module's function) is exported, and converted
  from Minari, without that code ever running: the planted module writes a
  marker file when imported and when called, and the marker must not appear.
* A dataset recorded from the user's own env, which the exporting process has
  not registered, exports from a fresh shell (`rlds-writer export` in a new
  subprocess) with its `Box`, `Discrete`, `Dict` and image spaces, and the
  result loads in `minari.load_dataset` and RLlib's own episode class with
  every value equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_core import skip_without_format

gym = pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari")

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402

# The checkout whose rlds_writer the tests import: the subprocesses run the same code.
ROOT = Path(rlds_writer.__file__).resolve().parents[1]

PLANTED = """
import pathlib
pathlib.Path({marker!r}, "imported").write_text("the dataset's module was imported")

def boom(**kwargs):
    pathlib.Path({marker!r}, "called").write_text("the dataset's entry point ran")
    raise SystemExit("entry point ran")
"""


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / "minari_root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module `rlds_planted` on sys.path that leaves files in `markers/` when it runs."""
    markers = tmp_path / "markers"
    markers.mkdir()
    code = tmp_path / "planted"
    code.mkdir()
    (code / "rlds_planted.py").write_text(PLANTED.format(marker=str(markers)))
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.delitem(sys.modules, "rlds_planted", raising=False)
    yield markers
    assert "rlds_planted" not in sys.modules
    assert not list(markers.iterdir()), [p.name for p in markers.iterdir()]


def _hostile_spec(env_id: str = "Planted-v0") -> str:
    return json.dumps(
        {
            "id": env_id,
            "entry_point": "rlds_planted:boom",
            "reward_threshold": None,
            "nondeterministic": False,
            "max_episode_steps": 7,
            "order_enforce": True,
            "disable_env_checker": False,
            "kwargs": {},
            "additional_wrappers": [
                {"name": "Boom", "entry_point": "rlds_planted:boom", "kwargs": {}}
            ],
            "vector_entry_point": "rlds_planted:boom",
        }
    )


def _record_cartpole(path, episodes=2):
    env = rlds_writer.RecordRLDS(gym.make("CartPole-v1", max_episode_steps=6), path)
    for seed in range(episodes):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(seed % 2)
            done = terminated or truncated
    env.close()


def _edit_metadata(path, **changes):
    meta_path = Path(path) / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta.update(changes)
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "metadata",
    [
        {"env_id": "rlds_planted:Planted-v0"},
        {"minari": {"env_spec": _hostile_spec()}},
        {"minari": {"env_spec": _hostile_spec("rlds_planted:Planted-v0")}},
        {"env_id": "Planted-v0", "env_spec": _hostile_spec()},
    ],
    ids=["env_id", "minari_env_spec", "both", "recorded_env_spec"],
)
def test_exports_never_import_or_call_what_the_dataset_names(
    tmp_path, minari_root, planted, capsys, metadata
):
    _record_cartpole(tmp_path / "rlds")
    _edit_metadata(tmp_path / "rlds", **{"env_id": None, "env_spec": None, **metadata})

    argv = ["export", "--to", "minari", str(tmp_path / "rlds"), "planted/run-v0"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "is not registered in this process" in out
    dataset = minari.load_dataset("planted/run-v0")
    written = minari_root / "planted" / "run-v0" / "data" / "metadata.json"
    if metadata.keys() == {"env_id"}:  # an id alone: nothing to carry
        assert "no env spec" in out
        assert dataset.spec.env_spec is None
        assert "rlds_planted" not in written.read_text()
    else:
        # The recorded spec goes on as text, its entry points unimported: making the
        # env (`recover_environment()`) is the recipient's call, not the export's.
        assert "was exported as text" in out and "'rlds_planted:boom'" in out
        spec = dataset.spec.env_spec
        assert (spec.id, spec.entry_point, spec.max_episode_steps) == (
            "Planted-v0",
            "rlds_planted:boom",
            7,
        )
        assert [w.entry_point for w in spec.additional_wrappers] == ["rlds_planted:boom"]
        assert json.loads(json.loads(written.read_text())["env_spec"])["id"] == "Planted-v0"
    # The spaces are the ones the recorder wrote as text, exactly CartPole's.
    cartpole = gym.make("CartPole-v1")
    assert dataset.spec.observation_space == cartpole.observation_space
    assert dataset.spec.action_space == gym.spaces.Discrete(2)

    skip_without_format("export", "rllib-episodes")  # the Minari part above has run
    argv = ["export", "--to", "rllib-episodes", str(tmp_path / "rlds"), str(tmp_path / "rl")]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert list((tmp_path / "rl").glob("*.parquet"))


def test_a_minari_spec_of_a_registered_env_keeps_only_its_id_kwargs_and_limit(
    tmp_path, minari_root, planted
):
    """A spec naming CartPole-v1 but a planted entry point gives the registered CartPole."""
    _record_cartpole(tmp_path / "rlds")
    spec = json.loads(_hostile_spec("CartPole-v1"))
    spec["kwargs"] = {"sutton_barto_reward": True}
    _edit_metadata(
        tmp_path / "rlds", env_id=None, env_spec=None, minari={"env_spec": json.dumps(spec)}
    )
    rlds_writer.interop.export.export_minari(tmp_path / "rlds", "cartpole/rec-v0")
    dataset = minari.load_dataset("cartpole/rec-v0")
    got = dataset.spec.env_spec
    assert got.entry_point == gym.spec("CartPole-v1").entry_point
    assert got.additional_wrappers == () and got.vector_entry_point != "rlds_planted:boom"
    assert got.kwargs["sutton_barto_reward"] is True and got.max_episode_steps == 7
    env = dataset.recover_environment()
    assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 7
    env.close()


def _minari_dataset(tmp_path, minari_root, dataset_id):
    """A clean Minari dataset written by the exporter; returns its metadata.json path."""
    _record_cartpole(tmp_path / "clean")
    rlds_writer.interop.export.export_minari(tmp_path / "clean", dataset_id)
    return minari_root.joinpath(*dataset_id.split("/"), "data", "metadata.json")


def test_convert_from_minari_keeps_a_hostile_env_spec_as_text_only(
    tmp_path, minari_root, planted, capsys
):
    meta_path = _minari_dataset(tmp_path, minari_root, "planted/spec-v0")
    meta = json.loads(meta_path.read_text())
    meta["env_spec"] = meta["eval_env_spec"] = _hostile_spec()
    meta_path.write_text(json.dumps(meta))

    back = tmp_path / "back"
    assert cli.main(["convert", "--from", "minari", "planted/spec-v0", str(back)]) == 0
    stored = json.loads((back / "metadata.json").read_text())["minari"]
    # The spec is text, shown as it was, never an object anything makes.
    assert isinstance(stored["env_spec"], str) and "rlds_planted:boom" in stored["env_spec"]
    assert stored["action_space"] == "Discrete(2)"
    assert len(list(rlds_writer.open_dataset(back).episodes("train"))) == 2

    # Exporting the converted dataset again carries the spec on as text (unregistered here).
    capsys.readouterr()
    assert cli.main(["export", "--to", "minari", str(back), "planted/again-v0"]) == 0
    assert "'Planted-v0' is not registered" in capsys.readouterr().out
    spec = minari.load_dataset("planted/again-v0").spec.env_spec
    assert spec.entry_point == "rlds_planted:boom"


def test_convert_from_minari_refuses_metadata_that_would_make_its_env(
    tmp_path, minari_root, planted, capsys
):
    """Without spaces in metadata.json Minari itself would gym.make the env spec."""
    meta_path = _minari_dataset(tmp_path, minari_root, "planted/nospace-v0")
    meta = json.loads(meta_path.read_text())
    meta["env_spec"] = _hostile_spec()
    del meta["observation_space"]
    meta_path.write_text(json.dumps(meta))

    argv = ["convert", "--from", "minari", "planted/nospace-v0", str(tmp_path / "back")]
    assert cli.main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(meta_path) in lines[0], lines
    assert "no observation_space" in lines[0] and "runs code" in lines[0]
    assert not (tmp_path / "back").exists()


# ------------------------------------------------- a custom env nobody registered

CUSTOM_ENV = '''
import gymnasium as gym
import numpy as np


class Custom(gym.Env):
    """Dict observations (a Box, a small RGB camera, a Discrete mode), Discrete actions."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-2.5, 2.5, (2,), np.float32),
            "camera": gym.spaces.Box(0, 255, (12, 10, 3), np.uint8),
            "mode": gym.spaces.Discrete(3),
        }
    )
    action_space = gym.spaces.Discrete(4)

    def _obs(self):
        return {
            "pos": self.np_random.uniform(-2.5, 2.5, 2).astype(np.float32),
            "camera": self.np_random.integers(0, 256, (12, 10, 3), dtype=np.uint8),
            "mode": int(self.np_random.integers(3)),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action) - 1.5, self.t >= 3 + self.t % 2, False, {}


gym.register("RLDSCustom-v0", entry_point="rlds_custom_env:Custom", max_episode_steps=5)
'''


@pytest.fixture
def custom_env(tmp_path, monkeypatch):
    """The user's env module, registered in this process only."""
    code = tmp_path / "user_code"
    code.mkdir()
    (code / "rlds_custom_env.py").write_text(CUSTOM_ENV)
    monkeypatch.syspath_prepend(str(code))
    import rlds_custom_env  # noqa: F401

    yield code
    gym.registry.pop("RLDSCustom-v0", None)
    sys.modules.pop("rlds_custom_env", None)


def _fresh_export(*args, pythonpath=()):
    """`rlds-writer export ...` in a new process: nothing registered, only our code on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, pythonpath)]))
    result = subprocess.run(
        [sys.executable, "-m", "rlds_writer", "export", *map(str, args), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_recorded_env_spec_reaches_minari_so_the_recipient_can_make_the_env(
    tmp_path, minari_root, custom_env, capsys
):
    """Recorded where the env was registered, exported where it is not, made by the recipient."""
    env = rlds_writer.RecordRLDS(gym.make("RLDSCustom-v0", max_episode_steps=4), tmp_path / "rlds")
    env.reset(seed=0)
    for _ in range(3):
        env.step(1)
    env.close()
    recorded = json.loads((tmp_path / "rlds" / "metadata.json").read_text())
    assert json.loads(recorded["env_spec"])["entry_point"] == "rlds_custom_env:Custom"

    gym.registry.pop("RLDSCustom-v0")  # the exporting process does not know the env
    argv = ["export", "--to", "minari", str(tmp_path / "rlds"), "user/carried-v0"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert "its recorded env spec (entry point 'rlds_custom_env:Custom') was exported" in (
        capsys.readouterr().out
    )
    dataset = minari.load_dataset("user/carried-v0")
    spec = dataset.spec.env_spec
    assert (spec.id, spec.entry_point, spec.max_episode_steps) == (
        "RLDSCustom-v0",
        "rlds_custom_env:Custom",
        4,
    )
    # The recipient, whose Python can import the env's package, chooses to make it.
    made = dataset.recover_environment()
    assert made.spec.id == "RLDSCustom-v0" and made.spec.max_episode_steps == 4
    assert made.action_space == gym.spaces.Discrete(4)
    obs, _ = made.reset(seed=0)
    assert obs["camera"].shape == (12, 10, 3)
    made.close()


# Slow: CLI exports from a fresh shell, loaded by Minari and RLlib (18 s under load).
@pytest.mark.slow
def test_an_unregistered_custom_env_exports_from_a_fresh_shell(tmp_path, minari_root, custom_env):
    env = rlds_writer.RecordRLDS(gym.make("RLDSCustom-v0"), tmp_path / "rlds")
    for seed in range(3):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(seed + 1)
            done = terminated or truncated
    env.close()
    spaces = env.env.observation_space, env.env.action_space
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    assert json.loads((tmp_path / "rlds" / "metadata.json").read_text())["env_id"] == (
        "RLDSCustom-v0"
    )

    out = _fresh_export("--to", "minari", tmp_path / "rlds", "user/custom-v0")
    assert "3 episodes" in out and "'RLDSCustom-v0' is not registered" in out
    dataset = minari.load_dataset("user/custom-v0")
    assert (dataset.spec.observation_space, dataset.spec.action_space) == spaces
    # The recorded spec, as text: the shell that exported it never imported the env.
    assert dataset.spec.env_spec.entry_point == "rlds_custom_env:Custom"
    for original, episode in zip(originals, dataset.iterate_episodes(), strict=True):
        steps = original["steps"]
        for key in ("pos", "camera", "mode"):
            np.testing.assert_array_equal(episode.observations[key], steps["observation"][key])
        np.testing.assert_array_equal(episode.actions, steps["action"][:-1])
        np.testing.assert_array_equal(episode.rewards, steps["reward"][:-1])

    # Where the env is registered (here, or with --env-id module:Id), the spec goes too.
    out = _fresh_export(
        "--to",
        "minari",
        tmp_path / "rlds",
        "user/custom-v1",
        "--env-id",
        "rlds_custom_env:RLDSCustom-v0",
        pythonpath=[custom_env],
    )
    assert "not registered" not in out
    recovered = minari.load_dataset("user/custom-v1").recover_environment()
    assert recovered.spec.id == "RLDSCustom-v0" and recovered.action_space == spaces[1]
    recovered.close()

    pytest.importorskip("tensorflow")  # before RLlib, which would turn off eager mode
    pytest.importorskip("ray.rllib")
    import msgpack
    import msgpack_numpy
    import pyarrow.parquet as pq
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    out = _fresh_export("--to", "rllib-episodes", tmp_path / "rlds", tmp_path / "rl")
    items = [
        item
        for file in sorted((tmp_path / "rl").glob("*.parquet"))
        for item in pq.read_table(file).column("item").to_pylist()
    ]
    assert len(items) == len(originals) == 3
    for original, item in zip(originals, items):
        # Our own output: RLlib's reader decodes it as RLlib does.
        episode = SingleAgentEpisode.from_state(
            msgpack.unpackb(item, object_hook=msgpack_numpy.decode, strict_map_key=False)
        )
        assert (episode.observation_space, episode.action_space) == spaces
        steps = original["steps"]
        observations = episode.get_observations()
        for key in ("pos", "camera", "mode"):
            got = np.stack([o[key] for o in observations])
            np.testing.assert_array_equal(got, steps["observation"][key])
        np.testing.assert_array_equal(episode.get_actions(), steps["action"][:-1])
        np.testing.assert_allclose(episode.get_rewards(), steps["reward"][:-1])
        assert episode.is_terminated == bool(steps["is_terminal"][-1])


def test_explicit_spaces_apply_and_are_checked_against_the_data(tmp_path, minari_root, capsys):
    """A dataset without recorded spaces (e.g. from D4RL) takes them from the command line."""
    _record_cartpole(tmp_path / "rlds")
    _edit_metadata(tmp_path / "rlds", env_id=None, observation_space=None, action_space=None)
    argv = ["export", "--to", "minari", str(tmp_path / "rlds")]
    assert cli.main([*argv, "plain/box-v0"]) == 0
    assert "pass --action-space 'Discrete(N)'" in capsys.readouterr().out
    assert minari.load_dataset("plain/box-v0").spec.action_space.shape == ()

    assert cli.main([*argv, "plain/discrete-v0", "--action-space", "Discrete(2)"]) == 0
    assert minari.load_dataset("plain/discrete-v0").spec.action_space == gym.spaces.Discrete(2)

    assert cli.main([*argv, "plain/bad-v0", "--observation-space", "Box(0, 1, (3,), float32)"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "steps/observation" in lines[0] and "float32[4]" in lines[0]
    assert cli.main([*argv, "plain/bad-v0", "--action-space", "__import__('os')"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "action_space" in lines[0], lines
    assert not (minari_root / "plain" / "bad-v0").exists()


def test_recorded_spaces_that_do_not_fit_the_data_fall_back_to_the_features(tmp_path, minari_root):
    _record_cartpole(tmp_path / "rlds")
    _edit_metadata(
        tmp_path / "rlds",
        env_id=None,
        observation_space="Box(0, 1, (9,), float32)",
        action_space="Discrete(2" + ")" * 5000,
    )
    report = rlds_writer.interop.export.export_minari(tmp_path / "rlds", "plain/misfit-v0")
    notes = " ".join(report.notes)
    assert "the recorded observation space" in notes and "float32[4]" in notes
    assert "the recorded action space" in notes
    spec = minari.load_dataset("plain/misfit-v0").spec
    assert spec.observation_space == gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
