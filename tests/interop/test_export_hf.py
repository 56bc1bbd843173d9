"""`rlds-writer export --to hf`: checked by loading the result with Hugging Face `datasets`."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
datasets = pytest.importorskip("datasets")

import rlds_writer  # noqa: E402
from rlds_writer import cli  # noqa: E402


def _record_cartpole(path):
    """Time-limited and terminated episodes, then one cut short by close()."""
    env = rlds_writer.RecordRLDS(
        gym.make("CartPole-v1", max_episode_steps=10),
        path,
        step_fn=lambda o, a, r, te, tr, info: {"info": {"pole": np.float32(o[2])}},
        episode_fn=lambda o, a, r, te, tr, info: {"label": "random"},
    )
    env.action_space.seed(0)
    for episode in range(4):
        env.reset(seed=episode)
        for t in range(50):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated or (episode == 3 and t == 2):
                break
    env.close()


def test_transitions_and_episodes_load_with_datasets_as_the_reader_gives_them(tmp_path, capsys):
    _record_cartpole(tmp_path / "rlds")
    dest = tmp_path / "hf"
    assert cli.main(["export", "--to", "hf", str(tmp_path / "rlds"), str(dest)]) == 0
    assert "4 episodes" in capsys.readouterr().out
    loaded = datasets.load_dataset(str(dest), cache_dir=str(tmp_path / "cache"))["train"]
    assert loaded.features["observation"] == datasets.List(datasets.Value("float32"), length=4)
    assert loaded.features["info"]["pole"] == datasets.Value("float32")
    table = loaded.with_format("numpy")[:]
    q = (
        rlds_writer.open_dataset(tmp_path / "rlds")
        .episodes("train")
        .qlearning_dataset(step_metadata=True)
    )
    pairs = {
        "observation": "observations",
        "action": "actions",
        "reward": "rewards",
        "next_observation": "next_observations",
        "terminated": "terminals",
        "truncated": "timeouts",
        "discount": "discounts",
        "episode_index": "episode_ids",
    }
    for column, key in pairs.items():
        np.testing.assert_array_equal(table[column], q[key], err_msg=column)
    poles = np.array([info["pole"] for info in loaded["info"]], np.float32)
    np.testing.assert_array_equal(poles, q["step_metadata"]["info"]["pole"])

    episodes = datasets.load_dataset(str(dest), "episodes", cache_dir=str(tmp_path / "cache"))
    rows = list(episodes["train"])
    assert [r["end"] for r in rows][-1] == "cut_short"
    assert all(r["label"] == "random" for r in rows)
    assert sum(r["num_transitions"] for r in rows) == len(loaded)

    report = rlds_writer.interop.export.export_hf(
        tmp_path / "rlds", tmp_path / "hf2", cut_short="drop"
    )
    assert (report.episodes, report.skipped) == (3, 1)
    capsys.readouterr()
    assert cli.main(["export", "--to", "hf", str(tmp_path / "rlds"), str(dest)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an empty directory" in err[0], err


class _Camera(gym.Env):
    """An env with a dict observation holding an RGB image."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "rgb": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def _obs(self):
        return {
            "pos": self.pos.copy(),
            "rgb": self.np_random.integers(0, 256, (16, 16, 3), np.uint8),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = np.zeros(2, np.float32)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.pos += action
        self.t += 1
        return self._obs(), 1.0, self.t >= 3, False, {}


def test_dict_and_image_observations_become_dict_and_image_features(tmp_path):
    env = rlds_writer.RecordRLDS(_Camera(), tmp_path / "rlds")
    for seed in range(2):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(1)
            done = terminated or truncated
    env.close()
    leaves = rlds_writer.open_dataset(tmp_path / "rlds").features.step_leaves
    assert {leaf.key: leaf.class_name for leaf in leaves}["steps/observation/rgb"] == "Image"
    rlds_writer.interop.export.export_hf(tmp_path / "rlds", tmp_path / "hf", episodes_per_file=1)
    assert len(list((tmp_path / "hf" / "transitions").glob("*.parquet"))) == 2
    loaded = datasets.load_dataset(str(tmp_path / "hf"), cache_dir=str(tmp_path / "cache"))
    train = loaded["train"]
    assert isinstance(train.features["observation"]["rgb"], datasets.Image)
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    row = 0
    for original in originals:
        steps = original["steps"]
        for t in range(len(steps["reward"]) - 1):
            item = train[row]
            np.testing.assert_array_equal(
                np.asarray(item["observation"]["rgb"]), steps["observation"]["rgb"][t]
            )
            np.testing.assert_array_equal(
                np.asarray(item["next_observation"]["rgb"]), steps["observation"]["rgb"][t + 1]
            )
            np.testing.assert_array_equal(
                item["observation"]["pos"], steps["observation"]["pos"][t]
            )
            row += 1
    assert row == len(train)


# --------------------------------------- datasets TFDS wrote (RL Unplugged's layouts)


def _stored_images(path):
    """Each episode's stored PNG/JPEG observation bytes, as TFDS reads them undecoded."""
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(path))
    skip = {"steps": {"observation": tfds.decode.SkipDecoding()}}
    ds = builder.as_dataset(split="train", decoders=skip)
    return [[bytes(step["observation"].numpy()) for step in episode["steps"]] for episode in ds]


def _parquet_image_bytes(dest, column):
    import pyarrow.parquet as pq

    files = sorted((dest / "transitions").glob("*.parquet"))
    return [row["bytes"] for f in files for row in pq.read_table(f).column(column).to_pylist()]


def test_one_channel_atari_frames_export_as_grey_images_with_their_stored_png(tmp_path, capsys):
    from helpers_rlu import write_atari_like

    write_atari_like(tmp_path / "rlds", [4, 3])
    dest = tmp_path / "hf"
    assert cli.main(["export", "--to", "hf", str(tmp_path / "rlds"), str(dest)]) == 0, (
        capsys.readouterr().err
    )
    assert "2 episodes (5 transitions" in capsys.readouterr().out
    train = datasets.load_dataset(str(dest), cache_dir=str(tmp_path / "cache"))["train"]
    assert isinstance(train.features["observation"], datasets.Image)
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    frames = [o["steps"]["observation"] for o in originals]
    expected = [f[t] for f in frames for t in range(len(f) - 1)]
    following = [f[t + 1] for f in frames for t in range(len(f) - 1)]
    assert len(train) == len(expected) == 5
    for row, now, after in zip(train, expected, following, strict=True):
        assert row["observation"].mode == "L"  # one channel: a grey image, (H, W)
        np.testing.assert_array_equal(np.asarray(row["observation"]), now[:, :, 0])
        np.testing.assert_array_equal(np.asarray(row["next_observation"]), after[:, :, 0])
    # The PNGs TFDS stored are handed on byte for byte, not decoded and encoded again.
    stored = _stored_images(tmp_path / "rlds")
    assert _parquet_image_bytes(dest, "observation") == [s for e in stored for s in e[:-1]]
    assert _parquet_image_bytes(dest, "next_observation") == [s for e in stored for s in e[1:]]


@pytest.mark.parametrize("encoding", ["png", "jpeg"])
def test_colour_frames_keep_their_stored_png_or_jpeg_bytes(tmp_path, encoding):
    from helpers_rlu import write_atari_like

    write_atari_like(tmp_path / "rlds", [3, 2], channels=3, encoding=encoding)
    dest = tmp_path / "hf"
    rlds_writer.interop.export.export_hf(tmp_path / "rlds", dest)
    stored = _stored_images(tmp_path / "rlds")
    assert stored[0][0][:3] == (b"\x89PN" if encoding == "png" else b"\xff\xd8\xff")
    assert _parquet_image_bytes(dest, "observation") == [s for e in stored for s in e[:-1]]
    train = datasets.load_dataset(str(dest), cache_dir=str(tmp_path / "cache"))["train"]
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    first = np.asarray(train[0]["observation"])
    assert first.shape == (84, 84, 3)
    if encoding == "png":
        np.testing.assert_array_equal(first, originals[0]["steps"]["observation"][0])


def test_recorded_one_channel_frames_from_config_from_env_export(tmp_path):
    """`config_from_env` stores uint8 (H, W, 1) observations as PNG `Image`s."""
    from helpers_envs import Grey

    env = rlds_writer.RecordRLDS(Grey(), tmp_path / "rlds")
    for seed in range(2):
        env.reset(seed=seed)
        for _ in range(3):
            env.step(0)
    env.close()
    leaves = rlds_writer.open_dataset(tmp_path / "rlds").features.step_leaves
    assert {leaf.key: leaf.class_name for leaf in leaves}["steps/observation"] == "Image"
    rlds_writer.interop.export.export_hf(tmp_path / "rlds", tmp_path / "hf")
    train = datasets.load_dataset(str(tmp_path / "hf"), cache_dir=str(tmp_path / "cache"))
    originals = list(rlds_writer.open_dataset(tmp_path / "rlds").episodes("train"))
    np.testing.assert_array_equal(
        np.asarray(train["train"][1]["next_observation"]),
        originals[0]["steps"]["observation"][2][:, :, 0],
    )


def test_every_episode_has_a_row_and_an_index_that_names_it_in_both_tables(tmp_path):
    """One-step episodes are in the episodes table; a dropped episode leaves a gap."""
    from helpers_rlu import write_atari_like

    ends = ["terminated", "truncated", "cut_short", "terminated", "truncated"]
    write_atari_like(tmp_path / "rlds", [3, 1, 4, 2, 1], ends=ends, channels=3)
    dest = tmp_path / "hf"
    report = rlds_writer.interop.export.export_hf(tmp_path / "rlds", dest, cut_short="drop")
    assert (report.episodes, report.transitions, report.skipped) == (4, 3, 1)
    cache = str(tmp_path / "cache")
    episodes = list(datasets.load_dataset(str(dest), "episodes", cache_dir=cache)["train"])
    assert [(e["episode_index"], e["num_transitions"], e["end"]) for e in episodes] == [
        (0, 2, "terminated"),
        (1, 0, "truncated"),
        (3, 1, "terminated"),
        (4, 0, "truncated"),
    ]
    assert [e["episode_id"] for e in episodes] == [100, 101, 103, 104]
    train = datasets.load_dataset(str(dest), cache_dir=cache)["train"]
    q = rlds_writer.open_dataset(tmp_path / "rlds").episodes("train")
    q = q.qlearning_dataset(cut_short="drop")
    assert train["episode_index"] == list(q["episode_ids"]) == [0, 0, 3]
    # One file per episode written: the indices stay the source's.
    rlds_writer.interop.export.export_hf(tmp_path / "rlds", tmp_path / "hf1", episodes_per_file=1)
    assert len(list((tmp_path / "hf1" / "episodes").glob("*.parquet"))) == 5
    rows = list(datasets.load_dataset(str(tmp_path / "hf1"), "episodes", cache_dir=cache)["train"])
    assert [r["episode_index"] for r in rows] == [0, 1, 2, 3, 4]


def test_sixteen_bit_depth_images_export_as_arrays_of_their_values(tmp_path):
    """A uint16 `Image` (a depth camera) has no Hugging Face `Image` form: an array.

    An episode-level grey image (a goal frame) is an `Image` of the episodes table.
    """
    import tensorflow_datasets as tfds
    from helpers_core import EpisodeSpec, write_with_tfds
    from tensorflow_datasets.rlds import rlds_base

    config = rlds_base.DatasetConfig(
        name="depth",
        observation_info={
            "depth": tfds.features.Image(shape=(6, 5, 1), dtype=np.uint16),
            "rgb": tfds.features.Image(shape=(6, 5, 3), dtype=np.uint8),
        },
        action_info=np.int64,
        reward_info=np.float32,
        episode_metadata_info={"goal": tfds.features.Image(shape=(6, 5, 1), dtype=np.uint8)},
    )
    rng = np.random.default_rng(3)
    goal = rng.integers(0, 256, (6, 5, 1), dtype=np.uint8)
    observations = [
        {
            "depth": rng.integers(0, 65536, (6, 5, 1), dtype=np.uint16),
            "rgb": rng.integers(0, 256, (6, 5, 3), dtype=np.uint8),
        }
        for _ in range(3)
    ]
    episode = EpisodeSpec(
        observations, [np.int64(0)] * 2, [np.float32(1)] * 2, [], episode_metadata={"goal": goal}
    )
    write_with_tfds(tmp_path / "rlds", config, [episode])
    rlds_writer.interop.export.export_hf(tmp_path / "rlds", tmp_path / "hf")
    train = datasets.load_dataset(str(tmp_path / "hf"), cache_dir=str(tmp_path / "cache"))
    train = train["train"]
    assert train.features["observation"]["depth"] == datasets.Array3D((6, 5, 1), "uint16")
    assert isinstance(train.features["observation"]["rgb"], datasets.Image)
    for t in range(2):
        row = train[t]
        np.testing.assert_array_equal(
            row["next_observation"]["depth"], observations[t + 1]["depth"]
        )
        np.testing.assert_array_equal(np.asarray(row["observation"]["rgb"]), observations[t]["rgb"])
    episodes = datasets.load_dataset(
        str(tmp_path / "hf"), "episodes", cache_dir=str(tmp_path / "cache")
    )["train"]
    np.testing.assert_array_equal(np.asarray(episodes[0]["goal"]), goal[:, :, 0])


def test_stored_bytes_a_plain_decoder_reads_differently_are_decoded_and_written_as_png(
    tmp_path,
):
    """Palette PNGs, grey PNGs of a colour field, CMYK JPEGs: TFDS converts them on decoding,
    Pillow would not, so their pixels go on as TFDS decodes them (a new PNG)."""
    import io

    from helpers_rlu import write_atari_like
    from PIL import Image

    from rlds_writer.interop.formats.hf.exporter import _image_values
    from rlds_writer.read.images import check_stored, decode_image

    write_atari_like(tmp_path / "rlds", [2], channels=3)
    leaves = rlds_writer.open_dataset(tmp_path / "rlds").features.step_leaves
    (leaf,) = [leaf for leaf in leaves if leaf.key == "steps/observation"]
    assert leaf.shape == (84, 84, 3)
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (84, 84, 3), dtype=np.uint8)

    def encoded(image, fmt):
        out = io.BytesIO()
        image.save(out, format=fmt)
        return out.getvalue()

    plain = encoded(Image.fromarray(rgb), "PNG")
    others = [
        encoded(Image.fromarray(rgb).convert("P"), "PNG"),
        encoded(Image.fromarray(rgb[:, :, 0]), "PNG"),
        encoded(Image.fromarray(rgb).convert("CMYK"), "JPEG"),
    ]
    assert check_stored(plain, leaf)
    values = _image_values([plain, *others], leaf)
    assert values[0]["bytes"] == plain
    for data, value in zip(others, values[1:], strict=True):
        assert not check_stored(data, leaf)
        assert value["bytes"] != data
        with Image.open(io.BytesIO(value["bytes"])) as image:
            assert image.format == "PNG" and image.mode == "RGB"
            np.testing.assert_array_equal(np.asarray(image), decode_image(data, leaf))
