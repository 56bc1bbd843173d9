"""`rlds-writer export --to d3rlpy`: checked with the real d3rlpy, in its own venv.

d3rlpy 2.8.1 pins gymnasium 1.0.0, so it runs in the consumer venv of
tests/consumer_venv.py (`d3rlpy_python` fixture); tests/d3rlpy_consumer.py,
run there, loads the exported file with `ReplayBuffer.load`, dumps what
d3rlpy sees (episodes and the transitions its own transition picker makes)
and trains DiscreteBC. The comparisons with the source dataset and
`qlearning_dataset()` run here.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from consumer_venv import run_consumer  # noqa: E402
from d3rlpy_consumer import expert_action  # noqa: E402
from helpers_docs import FENCE, ROOT, RUN1_SETUP  # noqa: E402
from helpers_envs import Rover  # noqa: E402

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402
from rlds_writer.read.transitions import episode_end  # noqa: E402

CONSUMER = str(Path(__file__).resolve().parents[1] / "d3rlpy_consumer.py")


def _record_cartpole(path, episodes=5, cut_at=3):
    """CartPole: time limit 12, the pole falling, a one-step episode, a last one cut by close()."""
    env = rlds_writer.RecordRLDS(
        gym.make("CartPole-v1", max_episode_steps=12),
        path,
        step_fn=lambda o, a, r, te, tr, info: {"info": {"pole": np.float32(o[2])}},
    )
    env.action_space.seed(0)
    for episode in range(episodes):
        if episode == 1:
            env.reset(seed=99)  # ended by the next reset after one step: no transition
        env.reset(seed=episode)
        for t in range(100):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated or (episode == episodes - 1 and t == cut_at):
                break
    env.close()
    return list(rlds_writer.open_dataset(path).episodes("train"))


def _load(python, tmp_path, command, source):
    out = tmp_path / f"{Path(source).name}.npz"
    run_consumer(python, CONSUMER, command, str(source), str(out), cwd=tmp_path)
    dump = dict(np.load(out))
    return dump, json.loads(str(dump.pop("info")))


def _assert_matches_source(dump, info, episodes, q):
    """d3rlpy's episodes hold the RLDS steps; its transitions are qlearning_dataset()'s."""
    kept = [e for e in episodes if len(e["steps"]["is_last"]) > 1]
    assert len(info["episodes"]) == len(kept)
    for i, (episode, seen) in enumerate(zip(kept, info["episodes"])):
        steps = episode["steps"]
        n = len(steps["is_last"])
        terminated = bool(steps["is_terminal"][-1])
        assert seen["terminated"] is terminated
        assert seen["size"] == (n - 1 if terminated else n)
        assert seen["transition_count"] == n - 1
        size = seen["size"]
        np.testing.assert_array_equal(dump[f"episode{i}_observations"], steps["observation"][:size])
        np.testing.assert_array_equal(dump[f"episode{i}_actions"][:, 0], steps["action"][:size])
        np.testing.assert_array_equal(dump[f"episode{i}_rewards"][:, 0], steps["reward"][:size])
    assert info["transition_count"] == len(q["terminals"])
    np.testing.assert_array_equal(dump["transition_observation"], q["observations"])
    np.testing.assert_array_equal(dump["transition_action"][:, 0], q["actions"])
    np.testing.assert_array_equal(dump["transition_reward"][:, 0], q["rewards"])
    np.testing.assert_array_equal(dump["transition_terminal"], q["terminals"])
    alive = ~q["terminals"]  # d3rlpy's next observation after a termination is zeros
    np.testing.assert_array_equal(dump["transition_next"][alive], q["next_observations"][alive])
    assert not dump["transition_next"][q["terminals"]].any()
    # A timeout is the last transition of an episode that did not terminate.
    ends = np.cumsum([e["transition_count"] for e in info["episodes"]]) - 1
    timeouts = np.zeros(len(q["timeouts"]), bool)
    timeouts[[end for end, e in zip(ends, info["episodes"]) if not e["terminated"]]] = True
    np.testing.assert_array_equal(timeouts, q["timeouts"])


def test_d3rlpy_loads_the_export_with_every_transition_and_flag_of_qlearning_dataset(
    tmp_path, d3rlpy_python, capsys
):
    episodes = _record_cartpole(tmp_path / "rlds")
    ends = [episode_end(e) for e in episodes]
    assert {"terminated", "truncated", "cut_short"} <= set(ends)
    assert min(len(e["steps"]["is_last"]) for e in episodes) == 1

    dest = tmp_path / "cartpole.h5"
    assert cli.main(["export", "--to", "d3rlpy", str(tmp_path / "rlds"), str(dest)]) == 0
    out = capsys.readouterr().out
    assert "5 episodes" in out and "2 episodes cut short" in out and "ReplayBuffer.load" in out
    assert "step fields left out" in out and "'info'" in out

    dump, info = _load(d3rlpy_python, tmp_path, "load", dest)
    assert (info["action_space"], info["action_size"]) == ("DISCRETE", 2)
    q = rlds_writer.open_dataset(tmp_path / "rlds").episodes("train").qlearning_dataset()
    _assert_matches_source(dump, info, episodes, q)
    assert dump["transition_terminal"].sum() >= 1 and q["timeouts"].sum() >= 2

    # Dropping the cut-short episodes (the one-step one is one of them).
    report = rlds_writer.export(
        tmp_path / "rlds", tmp_path / "dropped.h5", to="d3rlpy", cut_short="drop"
    )
    assert (report.episodes, report.cut_short, report.skipped) == (4, 2, 2)
    dump, info = _load(d3rlpy_python, tmp_path, "load", tmp_path / "dropped.h5")
    kept = [e for e, end in zip(episodes, ends) if end != "cut_short"]
    q = rlds_writer.open_dataset(tmp_path / "rlds").episodes("train")
    q = q.qlearning_dataset(cut_short="drop")
    _assert_matches_source(dump, info, kept, q)

    # to_d3rlpy, in the same venv (rlds_writer installed beside d3rlpy), builds the same.
    dump_memory, info_memory = _load(d3rlpy_python, tmp_path, "to_d3rlpy", tmp_path / "rlds")
    q = rlds_writer.open_dataset(tmp_path / "rlds").episodes("train").qlearning_dataset()
    _assert_matches_source(dump_memory, info_memory, episodes, q)


def _record_expert(path, episodes=8, steps=60):
    """CartPole driven by `expert_action`, 10% random actions: some falls, mostly time limits."""
    env = rlds_writer.RecordRLDS(gym.make("CartPole-v1", max_episode_steps=steps), path)
    rng = np.random.default_rng(0)
    for seed in range(episodes):
        observation, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = expert_action(observation) if rng.random() > 0.1 else int(rng.integers(2))
            observation, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    env.close()


def test_discrete_bc_trained_on_the_export_imitates_the_expert_and_beats_random(
    tmp_path, d3rlpy_python
):
    _record_expert(tmp_path / "rlds")
    report = rlds_writer.interop.export.export_d3rlpy(tmp_path / "rlds", tmp_path / "expert.h5")
    assert report.episodes == 8 and report.truncated >= 1

    run_consumer(
        d3rlpy_python,
        CONSUMER,
        "train",
        str(tmp_path / "expert.h5"),
        str(tmp_path / "result.json"),
        cwd=tmp_path,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    before, after, returns = result["before"], result["after"], result["returns"]
    # Untrained, the policy agrees with the expert by chance; trained, on states
    # a random policy reaches (not in the data), it agrees and balances the pole.
    assert after["accuracy"] >= 0.9 and after["accuracy"] > before["accuracy"], result
    assert after["expert_probability"] >= before["expert_probability"] + 0.1, result
    assert returns["bc"] >= 150 and returns["bc"] >= 3 * returns["random"], result


def test_dict_observations_load_as_d3rlpy_tuple_observations(tmp_path, d3rlpy_python):
    env = rlds_writer.RecordRLDS(Rover(), tmp_path / "rlds")
    env.action_space.seed(1)
    for seed in range(2):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    env.close()
    episodes = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))

    report = rlds_writer.interop.export.export_d3rlpy(tmp_path / "rlds", tmp_path / "rover.h5")
    with h5py.File(tmp_path / "rover.h5") as h5:
        keys = json.loads(h5.attrs["observation_keys"])
    assert sorted(keys) == ["camera", "pos"] and any(str(keys) in n for n in report.notes)
    dump, info = _load(d3rlpy_python, tmp_path, "load", tmp_path / "rover.h5")
    assert (info["action_space"], info["action_size"]) == ("CONTINUOUS", 2)
    for i, episode in enumerate(episodes):
        steps = episode["steps"]
        assert info["episodes"][i] == {"size": 4, "terminated": True, "transition_count": 4}
        for j, key in enumerate(keys):
            np.testing.assert_array_equal(
                dump[f"episode{i}_observations_{j}"], steps["observation"][key][:4]
            )
        np.testing.assert_array_equal(dump[f"episode{i}_actions"], steps["action"][:4])
    for j, key in enumerate(keys):  # d3rlpy's transitions carry the tuple too
        column = np.concatenate([e["steps"]["observation"][key][:4] for e in episodes])
        np.testing.assert_array_equal(dump[f"transition_observation_{j}"], column)


class _Pixels(gym.Env):
    """84x84 RGB observations, the smallest d3rlpy's default pixel encoder takes."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, False, self.t >= 5, {}


def test_images_stored_channels_first_train_with_d3rlpys_pixel_encoder(tmp_path, d3rlpy_python):
    env = rlds_writer.RecordRLDS(_Pixels(), tmp_path / "rlds")
    env.observation_space.seed(0)
    for seed in range(2):
        env.reset(seed=seed)
        for _ in range(5):
            env.step(int(env.action_space.sample()))
    env.close()
    episodes = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))

    hwc = rlds_writer.interop.export.export_d3rlpy(tmp_path / "rlds", tmp_path / "hwc.h5")
    assert any("--channels-first" in note for note in hwc.notes)
    argv = ["export", "--to", "d3rlpy", str(tmp_path / "rlds"), str(tmp_path / "chw.h5")]
    assert cli.main([*argv, "--channels-first"]) == 0
    out = tmp_path / "fit.json"
    run_consumer(d3rlpy_python, CONSUMER, "fit", str(tmp_path / "chw.h5"), str(out), cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["observation_shape"] == [3, 84, 84] and result["encoder"] == "PixelEncoder"
    with h5py.File(tmp_path / "chw.h5") as h5:
        stored = h5["observations_0"][()]
    np.testing.assert_array_equal(stored.transpose(0, 2, 3, 1), episodes[0]["steps"]["observation"])


def test_to_d3rlpy_without_d3rlpy_says_to_use_its_venv(tmp_path):
    if importlib.util.find_spec("d3rlpy") is not None:
        pytest.skip("d3rlpy is importable here; the d3rlpy tests cover to_d3rlpy")
    _record_cartpole(tmp_path / "rlds", episodes=2)
    with pytest.raises(ImportError, match="d3rlpy.*separate venv") as caught:
        rlds_writer.interop.to_d3rlpy(tmp_path / "rlds")
    assert isinstance(caught.value, rlds_writer.RLDSWriterError)


class _Texty(gym.Env):
    observation_space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "note": gym.spaces.Text(8)}
    )
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.zeros(2, np.float32), "note": "hi"}, {}

    def step(self, action):
        return {"pos": np.ones(2, np.float32), "note": "ok"}, 1.0, True, False, {}


class _TwoArms(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Dict(
        {"left": gym.spaces.Discrete(3), "right": gym.spaces.Box(-1, 1, (1,), np.float32)}
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.ones(2, np.float32), 1.0, True, False, {}


@pytest.mark.parametrize(
    "env_class, needles",
    [
        (_Texty, ["steps/observation/note", "no d3rlpy form", "leave the field out"]),
        (_TwoArms, ["steps/action", "steps/action/left", "flatten the actions"]),
    ],
)
def test_fields_d3rlpy_cannot_hold_give_one_line_naming_the_field_and_no_file(
    tmp_path, capsys, env_class, needles
):
    env = rlds_writer.RecordRLDS(env_class(), tmp_path / "rlds")
    env.reset(seed=0)
    env.step(env.action_space.sample())
    env.close()
    dest = tmp_path / "out.h5"
    assert cli.main(["export", "--to", "d3rlpy", str(tmp_path / "rlds"), str(dest)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(n in err[0] for n in needles), err
    assert not any(tmp_path.glob("out.h5*"))


def test_existing_destination_and_foreign_options_are_one_line_errors(tmp_path, capsys):
    _record_cartpole(tmp_path / "rlds", episodes=2)
    dest = tmp_path / "taken.h5"
    dest.write_bytes(b"mine")
    argv = ["export", "--to", "d3rlpy", str(tmp_path / "rlds"), str(dest)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "taken.h5: exists" in err[0], err
    assert dest.read_bytes() == b"mine"
    for extra, needle in (
        (["--env-id", "CartPole-v1"], "--env-id applies"),
        (["--layout", "columns"], "--layout applies"),
    ):
        assert cli.main([*argv[:-1], str(tmp_path / "new.h5"), *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert cli.main(["export", "--to", "hf", str(tmp_path / "rlds"), "x", "--compression", "gzip"])
    assert "--compression applies to --to d3rlpy only" in capsys.readouterr().err


def test_compressed_export_holds_the_same_arrays(tmp_path):
    _record_cartpole(tmp_path / "rlds", episodes=3)
    rlds_writer.interop.export.export_d3rlpy(tmp_path / "rlds", tmp_path / "plain.h5")
    rlds_writer.interop.export.export_d3rlpy(
        tmp_path / "rlds", tmp_path / "gzip.h5", compression="gzip"
    )
    with h5py.File(tmp_path / "plain.h5") as plain, h5py.File(tmp_path / "gzip.h5") as packed:
        assert sorted(plain) == sorted(packed)
        assert packed["observations_0"].compression == "gzip"
        for key in plain:
            np.testing.assert_array_equal(plain[key][()], packed[key][()], err_msg=key)


def test_the_d3rlpy_venv_blocks_of_the_docs_run_there(tmp_path, d3rlpy_python):
    """docs/sharing.md's d3rlpy-side blocks, run with the d3rlpy venv's python on its data."""
    exec(RUN1_SETUP, {"DATA": str(tmp_path / "data")})  # the docs' own CartPole data
    rlds_writer.interop.export.export_d3rlpy(
        tmp_path / "data" / "run1", tmp_path / "run1_d3rlpy.h5"
    )
    blocks = [
        m["body"]
        for m in FENCE.finditer((ROOT / "docs" / "sharing.md").read_text())
        if m["lang"] == "python" and "in the d3rlpy venv" in (m["why"] or "")
    ]
    assert len(blocks) == 2  # ReplayBuffer.load + training, to_d3rlpy
    moved = {"data": f'"{tmp_path}/data/', "tmp": f'"{tmp_path}/'}
    script = re.sub(r'"/(data|tmp)/', lambda m: moved[m[1]], "\n".join(blocks))
    (tmp_path / "blocks.py").write_text(script + "\nprint('actions', list(actions))\n")
    out = run_consumer(d3rlpy_python, str(tmp_path / "blocks.py"), cwd=tmp_path)
    assert "DISCRETE" in out and "actions [" in out, out
