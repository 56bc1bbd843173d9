"""store.formats.tfrecord: TFRecord shards (framing, reading, writing, zeros written ahead)."""
