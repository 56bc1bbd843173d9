"""16-bit PNGs (uint16 `Image` features) read without TensorFlow.

Pillow cannot decode 16-bit RGB, grey+alpha or RGBA PNGs; `read/png.py` does.
Every decoded array is compared with `tf.io.decode_png(..., dtype=tf.uint16)`
on PNGs written by TensorFlow (adaptive filters), by our encoder and by a
reference writer here that uses every filter type and Adam7 interlacing.
"""

from __future__ import annotations

import os
import struct
import zlib

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from gymnasium import spaces
from helpers_core import EpisodeSpec, load_episodes, write_with_rlds_writer, write_with_tfds
from hypothesis import event, given, settings
from hypothesis import strategies as st

import rlds_writer
from rlds_writer.errors import DecodeError, UnsupportedFeatureError
from rlds_writer.read import png
from rlds_writer.read.decode import Decoder
from rlds_writer.store.features.features import load_features
from rlds_writer.store.images.image_codecs import encode_png

_COLOUR = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type
_ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2)]
_ADAM7 += [(0, 1, 1, 2)]


def _chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def _filtered(rows: np.ndarray, bpp: int, rng: np.random.Generator, filters=range(5)) -> bytes:
    """Rows filtered as the PNG spec writes them, each with a random filter type."""
    r = rows.astype(np.int32)
    a = np.zeros_like(r)
    a[:, bpp:] = r[:, :-bpp]
    b = np.zeros_like(r)
    b[1:] = r[:-1]
    c = np.zeros_like(r)
    c[1:, bpp:] = r[:-1, :-bpp]
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    predictors = [np.zeros_like(r), a, b, (a + b) // 2, paeth]
    out = b""
    for y, kind in enumerate(rng.choice(list(filters), len(r))):
        out += bytes([kind]) + ((r[y] - predictors[kind][y]) % 256).astype(np.uint8).tobytes()
    return out


def _reference_png(
    image: np.ndarray, seed: int, interlace: bool = False, trns=None, filters=range(5)
) -> bytes:
    """A 16-bit PNG with random filter types per row, optionally Adam7-interlaced."""
    h, w, c = image.shape
    rng = np.random.default_rng(seed)
    big_endian = image.astype(">u2")
    passes = _ADAM7 if interlace else [(0, 0, 1, 1)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = big_endian[y0::dy, x0::dx]
        if sub.size:
            rows = sub.view(np.uint8).reshape(sub.shape[0], -1)
            raw += _filtered(rows, 2 * c, rng, filters)
    header = struct.pack(">IIBBBBB", w, h, 16, _COLOUR[c], 0, 0, int(interlace))
    extra = [] if trns is None else [_chunk(b"tRNS", np.asarray(trns, ">u2").tobytes())]
    stream = zlib.compress(raw)
    idat = [_chunk(b"IDAT", stream[i : i + 50]) for i in range(0, len(stream), 50)]  # split
    return b"".join([png.SIGNATURE, _chunk(b"IHDR", header), *extra, *idat, _chunk(b"IEND", b"")])


def _filter_types(data: bytes) -> set[int]:
    parsed = png.parse(data, "x")
    raw = zlib.decompress(b"".join(bytes(p) for p in parsed.idat))
    stride = 1 + parsed.width * 2 * png._SAMPLES[parsed.color_type]
    return {raw[i * stride] for i in range(parsed.height)}


def _ours(data: bytes, channels=None) -> np.ndarray:
    return png.decode(png.parse(data, "cam"), channels, "cam")


def _tf(data: bytes, channels=None) -> np.ndarray:
    return tf.io.decode_png(data, channels=channels or 0, dtype=tf.uint16).numpy()


def _smooth(shape, seed: int) -> np.ndarray:
    h, w, c = shape
    ramp = np.add.outer(np.arange(h), np.arange(w)) * 257
    planes = [(ramp * (i + 1) + 4099 * i) % 65536 for i in range(c)]
    noise = np.random.default_rng(seed).integers(0, 9, shape)
    return ((np.stack(planes, -1) + noise) % 65536).astype(np.uint16)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(1, 1), (1, 17), (23, 1), (37, 29)])
@pytest.mark.parametrize("smooth", [False, True])
def test_tensorflow_encoded_16bit_pngs_decode_to_tensorflows_pixels(channels, shape, smooth):
    full = shape + (channels,)
    rng = np.random.default_rng(sum(full))
    image = _smooth(full, 1) if smooth else rng.integers(0, 65536, full, dtype=np.uint16)
    data = tf.io.encode_png(image).numpy()
    decoded = _ours(data)
    assert decoded.dtype == np.uint16
    np.testing.assert_array_equal(decoded, _tf(data))
    np.testing.assert_array_equal(decoded, image)


def test_tensorflows_adaptive_filters_use_every_filter_type_and_decode_exactly():
    image = np.random.default_rng(0).integers(0, 65536, (64, 64, 3), dtype=np.uint16)
    data = tf.io.encode_png(image).numpy()
    assert _filter_types(data) == {0, 1, 2, 3, 4}  # so Average and Paeth rows are covered
    np.testing.assert_array_equal(_ours(data), _tf(data))


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("interlace", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 2), (1, 13), (11, 1), (9, 13), (17, 40)])
def test_every_filter_type_and_adam7_decode_like_tensorflow(channels, interlace, shape):
    full = shape + (channels,)
    seed = sum(full) + interlace
    image = np.random.default_rng(seed).integers(0, 65536, full, dtype=np.uint16)
    for source in (image, _smooth(full, seed)):
        data = _reference_png(source, seed, interlace)
        np.testing.assert_array_equal(_tf(data), source)
        np.testing.assert_array_equal(_ours(data), source)


@pytest.mark.parametrize("filters", [(2,), (0, 1, 2), (3,), (4,)])
def test_rows_of_one_filter_kind_decode_like_tensorflow(filters):
    # All "Up" and None/Sub/Up rows take faster paths than the diagonal one.
    image = _smooth((13, 21, 3), len(filters))
    data = _reference_png(image, 5, filters=filters)
    assert _filter_types(data) == set(filters)
    np.testing.assert_array_equal(_tf(data), image)
    np.testing.assert_array_equal(_ours(data), image)


@pytest.mark.parametrize(
    ("stored", "wanted", "trns"),
    [
        (1, 3, None),
        (1, 4, None),
        (1, 4, [2]),
        (2, 1, None),
        (2, 3, None),
        (2, 4, None),
        (3, 4, None),
        (3, 4, [1, 2, 3]),
        (3, 3, [1, 2, 3]),
        (4, 3, None),
    ],
)
def test_channel_conversions_match_tensorflow(stored, wanted, trns):
    rng = np.random.default_rng(stored * 10 + wanted)
    image = rng.integers(0, 4, (6, 7, stored), dtype=np.uint16)
    if trns is not None:
        image[::2, 1] = trns  # the transparent colour does occur
    data = _reference_png(image, 0, trns=trns)
    expected = _tf(data, wanted)
    assert expected.shape[-1] == wanted
    if trns is not None and wanted == 4:
        assert 0 < (expected[..., 3] == 0).sum() < expected[..., 3].size  # both kinds of pixel
    np.testing.assert_array_equal(_ours(data, wanted), expected)


def test_rgb_read_as_grey_is_refused_naming_the_field():
    data = tf.io.encode_png(np.zeros((2, 2, 3), np.uint16)).numpy()
    with pytest.raises(UnsupportedFeatureError, match="^cam: an RGB 16-bit PNG read as 1"):
        _ours(data, 1)


def _decoder(tmp_path, image_feature) -> tuple[Decoder, tfds.features.FeaturesDict]:
    features = tfds.features.FeaturesDict({"steps": tfds.features.Dataset({"cam": image_feature})})
    features.save_config(os.fspath(tmp_path))
    return Decoder(load_features(tmp_path / "features.json")), features


def _record(*images: bytes) -> bytes:
    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=list(images)))
    return tf.train.Example(
        features=tf.train.Features(feature={"steps/cam": feature})
    ).SerializeToString()


@pytest.mark.parametrize(
    ("dtype", "stored_dtype", "channels"),
    [
        (np.uint16, np.uint8, 3),  # 8-bit PNG in a uint16 feature: TensorFlow widens by 257
        (np.uint16, np.uint8, 1),
        (np.uint8, np.uint16, 3),  # 16-bit PNG in a uint8 feature: the high byte
        (np.uint8, np.uint16, 4),
        (np.uint8, np.uint16, 1),
        (np.float32, np.uint16, 4),  # float32 Images are 4 uint8 channels, bitcast
    ],
)
def test_png_of_another_bit_depth_decodes_as_tfds_decodes_it(
    tmp_path, dtype, stored_dtype, channels
):
    stored = np.random.default_rng(channels).integers(
        0, np.iinfo(stored_dtype).max + 1, (5, 6, channels), dtype=stored_dtype
    )
    shape = (5, 6, 1 if dtype == np.float32 else channels)
    decoder, features = _decoder(tmp_path, tfds.features.Image(shape=shape, dtype=dtype))
    record = _record(tf.io.encode_png(stored).numpy())
    ours = decoder.decode(record)["steps"]["cam"]
    steps = tfds.as_numpy(features.deserialize_example(record))["steps"]
    theirs = np.stack([step["cam"] for step in steps])
    assert ours.dtype == theirs.dtype == dtype
    np.testing.assert_array_equal(ours.view(np.uint8), theirs.view(np.uint8))


def _hostile(kind: str) -> bytes:
    good = tf.io.encode_png(
        np.random.default_rng(0).integers(0, 65536, (8, 8, 3), dtype=np.uint16)
    ).numpy()
    idat_at = good.index(b"IDAT") - 4
    (idat_len,) = struct.unpack_from(">I", good, idat_at)
    idat_end = idat_at + 12 + idat_len

    def ihdr(w, h, depth=16, colour=2):
        return _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0))

    def with_idat(header: bytes, data: bytes) -> bytes:
        return png.SIGNATURE + header + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")

    if kind == "truncated IDAT":
        return with_idat(ihdr(8, 8), good[idat_at + 8 : idat_end - 4][:-30])
    if kind == "truncated file":
        return good[: idat_end - 10]
    if kind == "wrong CRC":
        return good[: idat_end - 1] + bytes([good[idat_end - 1] ^ 1]) + good[idat_end:]
    if kind == "over the pixel limit":
        return with_idat(ihdr(100000, 100000), zlib.compress(b"\0" * 1000))
    if kind == "two headers":
        return png.SIGNATURE + ihdr(8, 8) + good[8:]
    if kind == "huge declared size":
        return with_idat(ihdr(16000, 16000), zlib.compress(b"\0" * 1000))
    if kind == "zlib bomb":
        return with_idat(ihdr(8, 8), zlib.compress(b"\0" * (64 << 20), 9))
    if kind == "palette of 16 bits":
        return with_idat(ihdr(8, 8, colour=3), zlib.compress(b"\0" * 8 * 97))
    if kind == "bad filter type":
        return with_idat(ihdr(8, 8), zlib.compress(b"\x07" + b"\0" * (8 * 49 - 1)))
    if kind == "not zlib":
        return with_idat(ihdr(8, 8), b"\x00\x01garbage" * 20)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("truncated IDAT", "holds .* of the 392 bytes its header declares"),
        ("truncated file", "PNG chunk .* the file ends before them"),
        ("wrong CRC", "PNG chunk b'IDAT' at byte 33 fails its CRC check"),
        ("huge declared size", r"image is 16000x16000 \(1465 MB decoded from 74 stored bytes\)"),
        ("over the pixel limit", "image is 100000x100000 .* over the 64 MB an image of open"),
        ("two headers", "PNG has a second IHDR chunk"),
        ("zlib bomb", "inflates past the 392 bytes its header declares"),
        ("palette of 16 bits", "bit depth 16, colour type 3: expected"),
        ("bad filter type", "row 0 has filter type 7, expected 0-4"),
        ("not zlib", "not a valid zlib stream"),
    ],
)
def test_hostile_16bit_pngs_give_a_one_line_error_naming_the_field(tmp_path, kind, match):
    feature = tfds.features.Image(shape=(None, None, 3), dtype=np.uint16)
    decoder, _ = _decoder(tmp_path, feature)
    with pytest.raises(DecodeError, match=match) as caught:
        decoder.decode(_record(_hostile(kind)), "shard.tfrecord, record 0")
    message = str(caught.value)
    assert message.startswith("shard.tfrecord, record 0: steps/cam: ")
    assert "\n" not in message
    if kind == "zlib bomb":
        # libpng reads the rows it needs and only warns about the rest; a stream
        # that inflates past the declared image is refused here on purpose.
        return
    with pytest.raises(tf.errors.InvalidArgumentError):  # TensorFlow refuses them too
        tf.io.decode_png(_hostile(kind), dtype=tf.uint16)


def test_a_suggested_palette_in_an_rgb_png_is_ignored_as_libpng_does():
    image = np.arange(12, dtype=np.uint16).reshape(2, 2, 3) * 5000
    good = tf.io.encode_png(image).numpy()
    with_palette = good[:33] + _chunk(b"PLTE", bytes(range(6))) + good[33:]
    np.testing.assert_array_equal(_tf(with_palette), image)
    np.testing.assert_array_equal(_ours(with_palette), image)
    unknown = good[:33] + _chunk(b"ZZZZ", b"") + good[33:]
    with pytest.raises(DecodeError, match="unknown critical chunk b'ZZZZ'"):
        _ours(unknown)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_png(unknown, dtype=tf.uint16)


def test_a_bad_crc_on_an_ancillary_chunk_is_skipped_as_libpng_does():
    image = np.arange(12, dtype=np.uint16).reshape(2, 2, 3) * 5000
    good = tf.io.encode_png(image).numpy()
    text = _chunk(b"tEXt", b"k\0v")
    damaged = good[:33] + text[:-1] + bytes([text[-1] ^ 1]) + good[33:]
    np.testing.assert_array_equal(_tf(damaged), image)
    np.testing.assert_array_equal(_ours(damaged), image)


def test_our_encoders_uint16_pngs_decode_exactly():
    image = _smooth((31, 17, 3), 0)
    for channels in (1, 2, 3, 4):
        source = image[..., :1].repeat(channels, -1)
        data = encode_png(source)
        np.testing.assert_array_equal(_ours(data), source)
        np.testing.assert_array_equal(_ours(data), _tf(data))


def _config():
    return rlds_writer.DatasetConfig(
        name="cams16",
        observation_info={
            "rgb": tfds.features.Image(shape=(12, 10, 3), dtype=np.uint16),
            "rgba": tfds.features.Image(shape=(12, 10, 4), dtype=np.uint16),
            "depth": tfds.features.Image(shape=(12, 10, 1), dtype=np.uint16),
        },
        action_info=tfds.features.Tensor(shape=(2,), dtype=np.float32),
        reward_info=np.float32,
        discount_info=np.float32,
    )


def _episodes() -> list[EpisodeSpec]:
    rng = np.random.default_rng(3)
    out = []
    for length in (3, 2):
        observations = [
            {
                "rgb": _smooth((12, 10, 3), t) if t % 2 else rng.integers(0, 65536, (12, 10, 3)),
                "rgba": rng.integers(0, 65536, (12, 10, 4)),
                "depth": _smooth((12, 10, 1), t),
            }
            for t in range(length + 1)
        ]
        observations = [{k: v.astype(np.uint16) for k, v in o.items()} for o in observations]
        actions = [rng.normal(size=2).astype(np.float32) for _ in range(length)]
        ones = [np.float32(1)] * length
        out.append(EpisodeSpec(observations, actions, ones, ones))
    return out


@pytest.mark.parametrize("writer", ["tfds", "rlds_writer"])
def test_uint16_rgb_and_rgba_datasets_read_the_same_with_and_without_tensorflow(tmp_path, writer):
    config, episodes = _config(), _episodes()
    write = write_with_tfds if writer == "tfds" else write_with_rlds_writer
    write(tmp_path / "ds", config, episodes)
    from_tfds = load_episodes(tmp_path / "ds")
    ours = list(rlds_writer.open_dataset(tmp_path / "ds")["train"])
    assert len(ours) == len(from_tfds) == len(episodes)
    for our_ep, tf_ep, episode in zip(ours, from_tfds, episodes):
        for key in ("rgb", "rgba", "depth"):
            expected = np.stack([o[key] for o in episode.observations])
            theirs = np.stack([s["observation"][key] for s in tf_ep["steps"]])
            got = our_ep["steps"]["observation"][key]
            assert got.dtype == theirs.dtype == np.uint16
            np.testing.assert_array_equal(theirs, expected)
            np.testing.assert_array_equal(got, expected)


def test_torch_path_gives_uint16_image_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    from rlds_writer.read.torch_data import WindowDataset, collate

    episodes = _episodes()
    write_with_rlds_writer(tmp_path / "ds", _config(), episodes)
    loader = torch.utils.data.DataLoader(
        WindowDataset(tmp_path / "ds", size=2), batch_size=2, collate_fn=collate
    )
    batch = next(iter(loader))
    rgb = batch["observation"]["rgb"]
    assert rgb.dtype == torch.uint16 and tuple(rgb.shape) == (2, 2, 12, 10, 3)
    expected = np.stack([o["rgb"] for o in episodes[0].observations])
    np.testing.assert_array_equal(rgb[0].numpy(), expected[:2])
    np.testing.assert_array_equal(rgb[1].numpy(), expected[1:3])


class _HdrCameraEnv(gym.Env):
    """A 16-bit RGB camera, as HDR and some robot cameras give."""

    observation_space = spaces.Box(0, 65535, (10, 12, 3), np.uint16)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self):
        return _smooth((10, 12, 3), self.t) ^ self.np_random.integers(0, 4, (10, 12, 3), np.uint16)

    def step(self, action):
        self.t += 1
        return self._frame(), 0.0, False, self.t >= 3, {}


def test_gymnasium_uint16_rgb_camera_is_a_16bit_png_image_both_readers_decode(tmp_path):
    env = rlds_writer.RecordRLDS(_HdrCameraEnv(), tmp_path / "ds")
    frames = [env.reset(seed=0)[0]]
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(0)
        frames.append(obs)
        done = term or trunc
    env.close()
    builder = tfds.builder_from_directory(os.fspath(tmp_path / "ds"))
    feature = builder.info.features["steps"]["observation"]
    assert isinstance(feature, tfds.features.Image) and feature.np_dtype == np.uint16
    (from_tfds,) = load_episodes(tmp_path / "ds")
    (ours,) = rlds_writer.open_dataset(tmp_path / "ds")["train"]
    expected = np.stack(frames)
    theirs = np.stack([step["observation"] for step in from_tfds["steps"]])
    np.testing.assert_array_equal(theirs, expected)
    np.testing.assert_array_equal(ours["steps"]["observation"], expected)


_VALID = _reference_png(_smooth((9, 11, 3), 0), 0, interlace=True)


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(1, 255)), max_size=4),
    cut=st.integers(0, len(_VALID)),
)
def test_damaged_16bit_pngs_raise_only_our_errors(flips, cut):
    data = bytearray(_VALID)
    for at, mask in flips:
        data[at] ^= mask
    data = bytes(data[:cut])
    try:
        image = _ours(data)
    except (DecodeError, UnsupportedFeatureError) as e:
        assert str(e).startswith("cam: ") and "\n" not in str(e)
    else:
        assert image.dtype == np.uint16 and image.ndim == 3


@settings(max_examples=300, deadline=None)
@given(
    width=st.integers(1, 12),
    height=st.integers(1, 12),
    colour=st.sampled_from([0, 2, 3, 4, 6, 5]),
    depth=st.sampled_from([16, 16, 8]),
    interlace=st.sampled_from([0, 1, 1, 2]),
    extra=st.sampled_from([0, 0, 0, -1, 1, -30, 30]),
    seed=st.integers(0, 2**32 - 1),
)
def test_crafted_16bit_pngs_with_valid_crcs_decode_or_raise_only_our_errors(
    width, height, colour, depth, interlace, extra, seed
):
    # Damage behind valid CRCs: odd headers, image data of the wrong size, any filter byte.
    rng = np.random.default_rng(seed)
    bpp = 2 * {0: 1, 2: 3, 4: 2, 6: 4}.get(colour, 1)
    rows, kinds = [], []
    for x0, y0, dx, dy in _ADAM7 if interlace else [(0, 0, 1, 1)]:
        w, h = len(range(x0, width, dx)), len(range(y0, height, dy))
        for _ in range(h if w else 0):
            kinds.append(int(rng.integers(0, 5) if rng.random() > 0.02 else rng.integers(5, 256)))
            rows.append(bytes([kinds[-1]]) + rng.bytes(w * bpp))
    raw = b"".join(rows)
    raw = raw[: len(raw) + extra] if extra < 0 else raw + rng.bytes(extra)
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    data = b"".join(
        [png.SIGNATURE, _chunk(b"IHDR", header)]
        + [_chunk(b"IDAT", zlib.compress(raw)), _chunk(b"IEND", b"")]
    )
    valid = colour in _COLOUR.values() and depth == 16 and interlace < 2 and max(kinds) < 5
    if valid and extra == 0:
        event("decodes")
        image = _ours(data)
        assert image.shape[:2] == (height, width) and image.dtype == np.uint16
        np.testing.assert_array_equal(image, _tf(data))
        return
    with pytest.raises((DecodeError, UnsupportedFeatureError)) as caught:
        _ours(data)
    assert str(caught.value).startswith("cam: ") and "\n" not in str(caught.value)
