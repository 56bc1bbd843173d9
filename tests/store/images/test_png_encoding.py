"""Our PNG encoder is lossless: TensorFlow and Pillow decode the exact pixels."""

from __future__ import annotations

import io

import numpy as np
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from rlds_writer.store.images.image_codecs import encode_png


@settings(max_examples=40, deadline=None)
@given(
    height=st.integers(1, 40),
    width=st.integers(1, 40),
    channels=st.sampled_from([1, 3, 4]),
    seed=st.integers(0, 2**31 - 1),
    smooth=st.booleans(),
)
def test_png_decodes_to_the_exact_pixels(height, width, channels, seed, smooth):
    rng = np.random.default_rng(seed)
    if smooth:
        ramp = np.arange(height * width * channels, dtype=np.int64) % 256
        image = ramp.reshape(height, width, channels).astype(np.uint8)
    else:
        image = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    data = encode_png(image)
    np.testing.assert_array_equal(tf.io.decode_png(data, channels=channels).numpy(), image)
    pil = np.asarray(Image.open(io.BytesIO(data)))
    np.testing.assert_array_equal(pil.reshape(image.shape), image)


def test_png_of_a_non_contiguous_view_encodes_the_view():
    base = np.arange(8 * 10 * 3, dtype=np.uint8).reshape(8, 10, 3)
    view = base[::2, ::3]
    decoded = tf.io.decode_png(encode_png(view)).numpy()
    np.testing.assert_array_equal(decoded, view)
