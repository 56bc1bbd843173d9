"""Images stored as TFDS `Image` features: PNG (default), JPEG, depth images.

Datasets are recorded with the Gymnasium recorder and read back through TFDS
(`builder_from_directory(...).as_dataset()`) and through our TF-free reader.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from gymnasium import spaces
from helpers_core import load_episodes

import rlds_writer
from rlds_writer import RecordRLDS
from rlds_writer.errors import SpecError
from rlds_writer.record import spaces as spaces_lib
from rlds_writer.store.images.image_codecs import encode_jpeg, encode_png


class _CameraEnv(gym.Env):
    """Two RGB cameras, a grey camera, a uint16 and a float32 depth image."""

    def __init__(self, size: int = 24, steps: int = 5):
        self.size, self.steps = size, steps
        s = size
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (s, s, 3), np.uint8),
                "wrist_image": spaces.Box(0, 255, (s, s, 3), np.uint8),
                "grey": spaces.Box(0, 255, (s, s, 1), np.uint8),
                "depth_u16": spaces.Box(0, 65535, (s, s, 1), np.uint16),
                "depth_f32": spaces.Box(-np.inf, np.inf, (s, s, 1), np.float32),
                "state": spaces.Box(-1.0, 1.0, (7,), np.float32),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        rng, s = self.np_random, self.size
        # Smooth images (a gradient plus a little noise) as cameras give; JPEG
        # of pure noise is a poor test of closeness.
        ramp = np.add.outer(np.arange(s), np.arange(s)).astype(np.int64) * 4 + self.t * 7
        rgb = np.stack([ramp, ramp // 2, 255 - ramp % 256], axis=-1) % 256
        noise = rng.integers(0, 3, (s, s, 3))
        return {
            "image": (rgb + noise).clip(0, 255).astype(np.uint8),
            "wrist_image": (255 - rgb).astype(np.uint8),
            "grey": (ramp[..., None] % 256).astype(np.uint8),
            "depth_u16": rng.integers(0, 65536, (s, s, 1), dtype=np.uint16),
            "depth_f32": rng.normal(size=(s, s, 1)).astype(np.float32),
            "state": rng.uniform(-1, 1, 7).astype(np.float32),
        }

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.steps, {}


def _stack(episode, key):
    return np.stack([obs[key] for obs in episode])


def test_png_default_stores_images_and_depth_as_image_features_exactly(tmp_path, record_episodes):
    want = record_episodes(_CameraEnv(), tmp_path / "ds").observations
    steps = tfds.builder_from_directory(os.fspath(tmp_path / "ds")).info.features["steps"]
    obs = steps.feature["observation"]
    for key, dtype in [
        ("image", np.uint8),
        ("wrist_image", np.uint8),
        ("grey", np.uint8),
        ("depth_u16", np.uint16),
        ("depth_f32", np.float32),
    ]:
        assert isinstance(obs[key], tfds.features.Image), key
        assert obs[key].encoding_format == "png" and obs[key].np_dtype == dtype
    assert isinstance(obs["state"], tfds.features.Tensor)

    got_tfds = load_episodes(tmp_path / "ds")
    got_ours = list(rlds_writer.open_dataset(tmp_path / "ds")["train"])
    assert len(got_tfds) == len(got_ours) == len(want)
    for tf_ep, our_ep, episode in zip(got_tfds, got_ours, want):
        for key in ("image", "wrist_image", "grey", "depth_u16", "depth_f32"):
            expected = _stack(episode, key)
            from_tfds = np.stack([s["observation"][key] for s in tf_ep["steps"]])
            np.testing.assert_array_equal(from_tfds, expected, err_msg=key)
            np.testing.assert_array_equal(our_ep["steps"]["observation"][key], expected)
            assert our_ep["steps"]["observation"][key].dtype == expected.dtype


def test_jpeg_images_decode_the_same_in_tfds_and_our_reader(tmp_path, record_episodes):
    recording = record_episodes(
        _CameraEnv(), tmp_path / "ds", image_encoding="jpeg", jpeg_quality=90
    )
    want = recording.observations
    obs = (
        tfds.builder_from_directory(os.fspath(tmp_path / "ds"))
        .info.features["steps"]
        .feature["observation"]
    )
    assert obs["image"].encoding_format == "jpeg"
    assert obs["grey"].encoding_format == "jpeg"
    # JPEG cannot hold uint16 or float32: depth stays lossless PNG.
    assert obs["depth_u16"].encoding_format == "png"
    assert obs["depth_f32"].encoding_format == "png"

    got_tfds = load_episodes(tmp_path / "ds")
    got_ours = list(rlds_writer.open_dataset(tmp_path / "ds")["train"])
    for tf_ep, our_ep, episode in zip(got_tfds, got_ours, want):
        for key in ("image", "wrist_image", "grey"):
            from_tfds = np.stack([s["observation"][key] for s in tf_ep["steps"]])
            np.testing.assert_array_equal(our_ep["steps"]["observation"][key], from_tfds)
            error = np.abs(from_tfds.astype(int) - _stack(episode, key).astype(int))
            assert error.mean() < 3, key  # lossy, but close at quality 90
        np.testing.assert_array_equal(
            our_ep["steps"]["observation"]["depth_f32"], _stack(episode, "depth_f32")
        )


def test_jpeg_quality_changes_the_bytes_written(tmp_path):
    image = _CameraEnv(size=64).reset(seed=0)[0]["image"]
    small, large = encode_jpeg(image, 30), encode_jpeg(image, 95)
    assert len(small) < len(large)
    assert _jpeg_error(large, image) <= 1.1 * _tf_jpeg_error(image, 95) + 0.2


def _jpeg_error(data: bytes, image: np.ndarray) -> float:
    decoded = tf.io.decode_jpeg(data, channels=image.shape[-1]).numpy()
    assert decoded.shape == image.shape
    return float(np.abs(decoded.astype(int) - image.astype(int)).mean())


def _tf_jpeg_error(image: np.ndarray, quality: int) -> float:
    """The error of TensorFlow's own encoder, what TFDS writes: our bar."""
    return _jpeg_error(tf.io.encode_jpeg(image, quality=quality).numpy(), image)


@pytest.mark.parametrize("quality", [1, 50, 75, 95, 100])
@pytest.mark.parametrize("shape", [(8, 8, 3), (37, 23, 3), (5, 5, 1), (33, 17, 1)])
def test_jpeg_decodes_to_the_pixels_of_tensorflows_encoder(shape, quality):
    # TFDS encodes JPEG Images with tf.io.encode_jpeg: ours must give the same pixels.
    image = np.random.default_rng(quality).integers(0, 256, shape, dtype=np.uint8)
    ours = tf.io.decode_jpeg(encode_jpeg(image, quality)).numpy()
    theirs = tf.io.decode_jpeg(tf.io.encode_jpeg(image, quality=quality)).numpy()
    np.testing.assert_array_equal(ours, theirs)


def _pillow_jpeg(image: np.ndarray, quality: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def test_jpeg_encoding_threads_each_get_their_own_bytes():
    # Each thread encodes into its own in-memory file; images of different
    # sizes at once must never see each other's bytes (a longer earlier JPEG
    # must not leave its tail in a shorter one).
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    images = [
        rng.integers(0, 256, (8 + 29 * (i % 5), 16 + 7 * (i % 3), 3), dtype=np.uint8)
        for i in range(60)
    ]
    with ThreadPoolExecutor(4) as pool:
        encoded = list(pool.map(lambda im: encode_jpeg(im, 90), images))
    for image, data in zip(images, encoded):
        ours = tf.io.decode_jpeg(data).numpy()
        theirs = tf.io.decode_jpeg(tf.io.encode_jpeg(image, quality=90)).numpy()
        np.testing.assert_array_equal(ours, theirs)
        assert data == _pillow_jpeg(image, 90)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_uint16_png_decodes_to_the_exact_values(channels):
    rng = np.random.default_rng(channels)
    image = rng.integers(0, 65536, (9, 13, channels), dtype=np.uint16)
    # TensorFlow cannot be asked for 2 channels; 0 keeps the stored ones.
    wanted = 0 if channels == 2 else channels
    decoded = tf.io.decode_png(encode_png(image), channels=wanted, dtype=tf.uint16).numpy()
    np.testing.assert_array_equal(decoded, image)


def test_float32_png_is_tfds_bitcast_form():
    rng = np.random.default_rng(0)
    depth = rng.normal(size=(11, 7, 1)).astype(np.float32)
    depth[0, 0, 0] = np.nan
    feature = tfds.features.Image(shape=(11, 7, 1), dtype=np.float32)
    decoded = feature.decode_example(tf.constant(encode_png(depth))).numpy()
    np.testing.assert_array_equal(decoded.view(np.uint32), depth.view(np.uint32))


def test_image_encoding_options_choose_the_feature():
    box = spaces.Box(0, 255, (16, 16, 3), np.uint8)
    jpeg = spaces_lib.feature_from_space(box, image_encoding="jpeg", jpeg_quality=80)
    assert isinstance(jpeg, tfds.features.Image) and jpeg.encoding_format == "jpeg"
    assert jpeg.jpeg_quality == 80
    four = spaces_lib.feature_from_space(
        spaces.Box(0, 255, (16, 16, 4), np.uint8), image_encoding="jpeg"
    )
    assert four.encoding_format == "png"  # JPEG has no alpha channel
    for encoding in ("bytes", "zlib", "none"):
        tensor = spaces_lib.feature_from_space(box, image_encoding=encoding)
        assert isinstance(tensor, tfds.features.Tensor)
        assert str(tensor._encoding.value) == encoding
    # Values inferred from step_fn/info get the same rule.
    inferred = spaces_lib.feature_from_values(
        [np.zeros((16, 16, 3), np.uint8)], "steps/cam", "jpeg"
    )
    assert inferred.encoding_format == "jpeg"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"image_encoding": "webp"}, "image_encoding: expected one of png, jpeg"),
        ({"image_encoding": "jpeg", "jpeg_quality": 0}, "jpeg_quality: expected 1..100"),
        ({"image_encoding": "jpeg", "jpeg_quality": "high"}, "jpeg_quality: expected an int"),
    ],
)
def test_bad_image_options_are_refused_with_the_fix(kwargs, match):
    box = spaces.Box(0, 255, (16, 16, 3), np.uint8)
    with pytest.raises(SpecError, match=match):
        spaces_lib.feature_from_space(box, **kwargs)
    with pytest.raises(SpecError, match=match):
        rlds_writer.config_from_spaces(box, spaces.Discrete(2), **kwargs)


def test_config_from_env_takes_the_image_options():
    import dm_env
    from dm_env import specs

    class Env(dm_env.Environment):
        def observation_spec(self):
            return {
                "rgb": specs.Array((16, 16, 3), np.uint8),
                "depth": specs.Array((16, 16, 1), np.uint16),
            }

        def action_spec(self):
            return specs.Array((7,), np.float32)

        def reset(self):  # pragma: no cover - specs only
            raise NotImplementedError

        def step(self, action):  # pragma: no cover - specs only
            raise NotImplementedError

    config = rlds_writer.config_from_env(Env(), "robot", image_encoding="jpeg", jpeg_quality=70)
    assert config.observation_info["rgb"].encoding_format == "jpeg"
    assert config.observation_info["rgb"].jpeg_quality == 70
    assert config.observation_info["depth"].encoding_format == "png"
    assert config.observation_info["depth"].np_dtype == np.uint16


@pytest.mark.parametrize("image_encoding", ["png", "jpeg", "bytes"])
def test_converters_store_images_as_asked(tmp_path, image_encoding):
    from rlds_writer.interop.episodes import SourceEpisode, write_episodes

    rng = np.random.default_rng(7)
    episodes = [
        SourceEpisode(
            observations={
                "rgb": rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8),
                "depth": rng.integers(0, 65536, (4, 16, 16, 1), dtype=np.uint16),
            },
            actions=rng.normal(size=(3, 7)).astype(np.float32),
            rewards=np.ones(3, np.float32),
            terminated=True,
        )
        for _ in range(2)
    ]
    kwargs = {} if image_encoding == "png" else {"image_encoding": image_encoding}
    write_episodes(lambda: iter(episodes), tmp_path / "ds", name="conv", source="test", **kwargs)
    obs = (
        tfds.builder_from_directory(os.fspath(tmp_path / "ds"))
        .info.features["steps"]
        .feature["observation"]
    )
    if image_encoding == "bytes":
        assert isinstance(obs["rgb"], tfds.features.Tensor)
        assert isinstance(obs["depth"], tfds.features.Tensor)
    else:
        assert obs["rgb"].encoding_format == image_encoding
        assert obs["depth"].encoding_format == "png" and obs["depth"].np_dtype == np.uint16
    got_tfds = load_episodes(tmp_path / "ds")
    got_ours = list(rlds_writer.open_dataset(tmp_path / "ds")["train"])
    for tf_ep, our_ep, src in zip(got_tfds, got_ours, episodes):
        for key in ("rgb", "depth"):
            from_tfds = np.stack([s["observation"][key] for s in tf_ep["steps"]])
            np.testing.assert_array_equal(our_ep["steps"]["observation"][key], from_tfds)
            if image_encoding != "jpeg":
                np.testing.assert_array_equal(from_tfds, src.observations[key])


class _OneFrameBufferEnv(gym.Env):
    """Draws every frame into the same array, as many renderers do."""

    observation_space = spaces.Box(0, 255, (16, 16, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self):
        self.frame = np.zeros((16, 16, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        self.frame[:] = 0
        return self.frame, {}

    def step(self, action):
        self.t += 1
        self.frame[:] = 40 * self.t
        return self.frame, 0.0, False, self.t >= 5, {}


@pytest.mark.parametrize("image_encoding", ["png", "jpeg", "bytes"])
def test_frames_drawn_into_one_reused_array_are_recorded_as_they_were(tmp_path, image_encoding):
    env = RecordRLDS(_OneFrameBufferEnv(), tmp_path / "ds", image_encoding=image_encoding)
    for seed in range(2):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(0)
            done = term or trunc
    env.close()
    for episode in load_episodes(tmp_path / "ds"):
        means = [float(step["observation"].mean()) for step in episode["steps"]]
        # JPEG is lossy, but a flat frame decodes to within a level of its value.
        assert means == pytest.approx([0, 40, 80, 120, 160, 200], abs=1)


def test_write_episode_takes_encoded_images_beside_arrays(tmp_path):
    config = rlds_writer.DatasetConfig(
        name="mixed",
        observation_info=tfds.features.Image(shape=(16, 16, 3)),
        action_info=np.int64,
        reward_info=np.float32,
    )
    png = encode_png(np.full((16, 16, 3), 7, np.uint8))
    frames = [np.full((16, 16, 3), 3, np.uint8), png, np.full((16, 16, 3), 9, np.uint8)]
    with rlds_writer.TFDSBackendWriter(tmp_path / "ds", config) as writer:
        writer.write_episode({"observation": frames, "action": [1, 0], "reward": [0.0, 1.0]})
    (episode,) = load_episodes(tmp_path / "ds")
    assert [int(s["observation"].mean()) for s in episode["steps"]] == [3, 7, 9]


@pytest.mark.parametrize("quality", [30, 95])
@pytest.mark.parametrize("channels", [1, 3])
def test_frames_filled_into_reused_pillow_images_encode_to_pillows_own_bytes(channels, quality):
    # The frame stream fills one Pillow image after another from the env's
    # frames and calls Pillow's encoder directly: the bytes must be those of
    # Image.save, strided frames and a reused image included.
    from rlds_writer.store.images.image_codecs import JpegFrames

    rng = np.random.default_rng(channels)
    codec = JpegFrames((40, 56, channels), quality)
    img = codec.new()
    for i in range(4):
        wide = rng.integers(0, 256, (40, 56, channels + 1), dtype=np.uint8)
        frame = wide[..., :channels] if i % 2 else np.ascontiguousarray(wide[..., :channels])
        codec.fill(img, frame)
        plain = np.ascontiguousarray(frame[..., 0] if channels == 1 else frame)
        assert codec.encode(img) == _pillow_jpeg(plain, quality)


def test_pillows_encoder_is_called_directly_here():
    # The saving the direct call buys (about a tenth of a camera frame's CPU)
    # is real only if its check passes with the Pillow we install.
    from rlds_writer.store.images import image_codecs

    assert image_codecs._direct_jpeg_args("RGB", 95) is not None
    assert image_codecs._direct_jpeg_args("L", 75) is not None


@pytest.mark.parametrize("surprise", ["other bytes", "an error"])
def test_a_pillow_whose_direct_encoding_differs_is_used_through_save(monkeypatch, surprise):
    from rlds_writer.store.images import image_codecs

    def changed_internals(img, args, fd):
        if surprise == "an error":
            raise TypeError("encoder() argument 7 must be a tuple")
        return b"\xff\xd8 other bytes"

    monkeypatch.setattr(image_codecs, "_direct_args", {})
    monkeypatch.setattr(image_codecs, "_encode_direct", changed_internals)
    image = np.random.default_rng(5).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    assert encode_jpeg(image, 90) == _pillow_jpeg(image, 90)
    assert image_codecs._direct_args == {("RGB", 90): None}
