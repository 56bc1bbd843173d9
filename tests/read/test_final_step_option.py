"""`open_dataset(final_step="drop")`: training views without RLDS's observation-only last step."""

from __future__ import annotations

import numpy as np
import pytest

import rlds_writer


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("final") / "ds"
    env = rlds_writer.EnvLogger(rlds_writer.Catch(rows=5, columns=5, seed=0), data_directory=path)
    for _ in range(3):
        ts = env.reset()
        while not ts.last():
            ts = env.step(1)
    env.close()
    return path


def test_drop_leaves_out_exactly_the_final_step_of_every_episode(dataset):
    kept = list(rlds_writer.open_dataset(dataset).episodes())
    dropped = rlds_writer.open_dataset(dataset, final_step="drop").episodes()
    assert len(dropped) == len(kept)
    for full, short in zip(kept, dropped, strict=True):
        n = len(full["steps"]["is_last"])
        assert len(short["steps"]["is_last"]) == n - 1
        assert not short["steps"]["is_last"].any()
        np.testing.assert_array_equal(short["steps"]["action"], full["steps"]["action"][:-1])
        np.testing.assert_array_equal(
            short["steps"]["observation"], full["steps"]["observation"][:-1]
        )


def test_steps_windows_and_lengths_agree_with_the_dropped_view(dataset):
    reader = rlds_writer.open_dataset(dataset, final_step="drop")
    episodes = reader.episodes()
    lengths = episodes.episode_lengths()
    assert list(lengths) == [len(e["steps"]["action"]) for e in episodes]
    assert len(list(episodes.steps())) == lengths.sum() == episodes.num_steps
    assert len(list(episodes.windows(2))) == len(episodes.window_index(2))
    assert not any(w["is_last"].any() for w in episodes.windows(2))


def test_transitions_still_use_the_final_observation(dataset):
    full = rlds_writer.open_dataset(dataset).episodes().qlearning_dataset()
    dropped = rlds_writer.open_dataset(dataset, final_step="drop").episodes().qlearning_dataset()
    assert full.keys() == dropped.keys()
    for key in full:
        np.testing.assert_array_equal(full[key], dropped[key])


def test_a_bad_final_step_value_names_the_choices(dataset):
    with pytest.raises(ValueError, match=r"final_step must be one of \('keep', 'drop'\)"):
        rlds_writer.open_dataset(dataset, final_step="trim")
