"""`convert --from rllib-episodes` reads RLlib's episode items as data: no pickle, ever.

msgpack-numpy decodes arrays of dtype object with `pickle.loads`, and RLlib's
`SingleAgentEpisode.from_state` loads `Box` bounds with `allow_pickle=True`.
Crafted Parquet files carry pickles that would create a marker file; the
conversion must refuse them in one line naming the file and the column, with
the marker absent. The item decoder is then fuzzed with hypothesis (crafted
msgpack-numpy maps, mutated real items, random bytes): each run ends in a
value or a `SourceError`, and no pickle ever runs.

The in-suite runs are short (`RLDS_FUZZ_EXAMPLES`, default 200 examples per
test). For a long local run::

    RLDS_FUZZ_EXAMPLES=20000 nice -n 19 python -m pytest -q -x \
        tests/test_rllib_items.py -k fuzz -p no:cacheprovider
"""

from __future__ import annotations

import base64
import io
import pickle
import zlib

import numpy as np
import pytest
from helpers_core import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

# TensorFlow first: RLlib's try_import_tf() disables TF2 behaviour (eager
# execution) for the whole process when it is the one that imports TensorFlow.
pytest.importorskip("tensorflow")
gym = pytest.importorskip("gymnasium")
msgpack = pytest.importorskip("msgpack")
msgpack_numpy = pytest.importorskip("msgpack_numpy")
pytest.importorskip("ray.rllib")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from rlds_writer import cli  # noqa: E402
from rlds_writer.errors import SourceError  # noqa: E402
from rlds_writer.interop.formats.rllib import importer as rllib_episodes  # noqa: E402
from rlds_writer.interop.formats.rllib import state as rllib_state  # noqa: E402

FUZZ = fuzz_settings(200)


class _Marker:
    """Unpickling it creates the file `path` (what a hostile pickle could do instead)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _object_array(marker):
    array = np.empty(2, dtype=object)
    array[:] = [_Marker(marker), "x"]
    return array


def _state(seed=0):
    """A real episode state, as RLlib's OfflineSingleAgentEnvRunner writes it."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    env = gym.make("CartPole-v1", max_episode_steps=4)
    obs, _ = env.reset(seed=seed)
    episode = SingleAgentEpisode(
        observation_space=env.observation_space, action_space=env.action_space
    )
    episode.add_env_reset(observation=obs, infos={})
    done = False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(1)
        done = terminated or truncated
        episode.add_env_step(
            obs, 1, reward, infos={"x": float(obs[0])}, terminated=terminated, truncated=truncated
        )
    return episode.get_state()


def _pack(state):
    return msgpack.packb(state, default=msgpack_numpy.encode)


def _write(path, items):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"item": items}), path)
    return path


def _pickled_bounds(marker):
    buf = io.BytesIO()
    np.save(buf, _object_array(marker), allow_pickle=True)
    return base64.b64encode(zlib.compress(buf.getvalue())).decode("ascii")


def _in_info(state, marker):
    state["infos"]["data"][1] = {"x": 0.5, "payload": _object_array(marker)}


def _in_observation(state, marker):
    state["observations"]["data"][0] = _object_array(marker)


def _in_space(state, marker):
    state["_observation_space"]["low"] = _pickled_bounds(marker)


def _structured(state, marker):
    state["rewards"]["data"] = np.zeros(len(state["rewards"]["data"]), [("a", "<f4")])


@pytest.mark.parametrize(
    "craft, needle",
    [
        (_in_info, "dtype object"),
        (_in_observation, "dtype object"),
        (_in_space, "_observation_space"),
        (_structured, "kind b'V'"),
    ],
    ids=["info", "observation", "space_bounds", "structured"],
)
def test_a_pickle_in_an_item_is_refused_in_one_line_and_never_runs(tmp_path, capsys, craft, needle):
    marker = tmp_path / "unpickled"
    states = [_state(0), _state(1)]
    # The importer reads the spaces of the first episode only.
    craft(states[0 if craft is _in_space else 1], marker)
    src = tmp_path / "out" / "cartpole" / "run-0" / "part-0.parquet"
    _write(src, [_pack(s) for s in states])
    assert not marker.exists()
    # Reading the item the way the old code did would run the pickle:
    with pytest.raises(Exception):  # noqa: B017 - any failure after it ran is fine
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        state = msgpack.unpackb(
            _pack(states[0 if craft is _in_space else 1]),
            object_hook=msgpack_numpy.decode,
            strict_map_key=False,
        )
        SingleAgentEpisode.from_state(state)
        raise RuntimeError("read")
    if craft is not _structured:
        assert marker.exists()
        marker.unlink()

    dest = tmp_path / "rlds"
    assert cli.main(["convert", "--from", "rllib-episodes", str(tmp_path / "out"), str(dest)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(src) in lines[0] and "column 'item'" in lines[0], lines[0]
    assert needle in lines[0], lines[0]
    assert not marker.exists()


def test_an_object_dtype_with_an_empty_kind_is_refused_too(tmp_path):
    """A forged map claiming an empty kind but an object dtype is refused by its dtype."""
    forged = msgpack.packb(
        {b"nd": True, b"type": "|O", b"kind": b"", b"shape": [1], b"data": b"\x00" * 8}
    )
    with pytest.raises(SourceError, match="dtype '\\|O'"):
        rllib_state.decode_item(forged)


def test_clean_items_decode_as_msgpack_numpy_does():
    state = _state(3)
    ours = rllib_state.decode_item(_pack(state))
    theirs = msgpack.unpackb(_pack(state), object_hook=msgpack_numpy.decode, strict_map_key=False)
    for key in ("observations", "actions", "rewards"):
        np.testing.assert_array_equal(
            np.asarray(ours[key]["data"]), np.asarray(theirs[key]["data"])
        )
    assert ours["infos"]["data"] == theirs["infos"]["data"]
    episode = rllib_episodes._episode(ours)
    np.testing.assert_array_equal(episode.observations, np.asarray(theirs["observations"]["data"]))


# ----------------------------------------------------------------------- fuzzing


@pytest.fixture(scope="module")
def real_items():
    return [_pack(_state(seed)) for seed in range(2)]


@pytest.fixture(scope="module")
def fuzz_marker(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "unpickled"


_INTS = st.integers(-(2**63), 2**64 - 1)  # what msgpack can pack
_DTYPES = ["<f4", "<f8", "|b1", "<i8", "|u1", "<U3", "|S2", ">i4", "|O", "V8", "<M8[s]", "|S0"]


@st.composite
def nd_maps(draw, marker):
    """msgpack-numpy maps, honest or forged (object kinds carry a marker-making pickle)."""
    kind = draw(st.sampled_from([b"", b"O", b"V", b"x", ""]))
    nd = draw(st.sampled_from([True, False, 1, None]))
    descr = draw(st.one_of(st.sampled_from(_DTYPES), st.binary(max_size=6), _INTS))
    if kind == b"O" or draw(st.booleans()) and draw(st.booleans()):
        data = pickle.dumps(_object_array(marker))
    else:
        data = draw(st.binary(max_size=64))
    shape = draw(
        st.one_of(
            st.lists(st.integers(-2, 9), max_size=3),
            st.just([len(data) // 4]),
            _INTS,
            st.none(),
        )
    )
    out = {b"nd": nd, b"kind": kind, b"type": descr, b"shape": shape, b"data": data}
    keys = draw(st.sets(st.sampled_from(list(out)), min_size=1))
    return {k: out[k] for k in keys}


def _values(marker):
    leaves = st.one_of(
        nd_maps(marker),
        _INTS,
        st.floats(),
        st.text(max_size=8),
        st.binary(max_size=8),
        st.none(),
        st.booleans(),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(st.text(max_size=4), _INTS), inner, max_size=4),
        ),
        max_leaves=12,
    )


def _decode_and_convert(item):
    """What the importer does with one item; returns the episode, or the SourceError."""
    try:
        state = rllib_state.decode_item(item)
        if isinstance(state, dict) and "observations" in state:
            return rllib_episodes._episode(state)
        return state
    except SourceError as e:
        assert "\n" not in str(e)
        return e


@FUZZ
@given(data=st.data())
def test_fuzz_crafted_msgpack_numpy_maps_never_unpickle(fuzz_marker, data):
    value = data.draw(_values(fuzz_marker))
    _decode_and_convert(msgpack.packb(value))
    assert not fuzz_marker.exists()


@FUZZ
@given(data=st.data())
def test_fuzz_real_states_with_crafted_values_raise_only_source_errors(
    real_items, fuzz_marker, data
):
    state = rllib_state.decode_item(data.draw(st.sampled_from(real_items)))
    for _ in range(data.draw(st.integers(1, 3))):
        field = data.draw(st.sampled_from(["observations", "actions", "rewards", "infos"]))
        buffer = state[field]
        part = data.draw(st.sampled_from(["data", "lookback", "finalized", "row"]))
        value = data.draw(_values(fuzz_marker))
        if part == "row" and isinstance(buffer["data"], list) and buffer["data"]:
            buffer["data"][data.draw(st.integers(0, len(buffer["data"]) - 1))] = value
        else:
            buffer[part if part != "row" else "data"] = value
    _decode_and_convert(msgpack.packb(state, default=msgpack_numpy.encode))
    assert not fuzz_marker.exists()


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_items_raise_only_source_errors(real_items, data):
    item = bytearray(data.draw(st.sampled_from(real_items)))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(item) - 1))
        op = data.draw(st.sampled_from(["byte", "cut", "insert"]))
        if op == "byte":
            item[at] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del item[at : at + data.draw(st.integers(1, 16))]
        else:
            item[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        if not item:
            item += b"\x80"
    _decode_and_convert(bytes(item))


@FUZZ
@given(item=st.binary(max_size=256))
def test_fuzz_random_bytes_raise_only_source_errors(item):
    _decode_and_convert(item)
