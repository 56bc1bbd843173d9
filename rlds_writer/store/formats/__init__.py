"""store.formats: the shard file formats, one folder per format.

`shard_format` says what a format is (the `FileFormat` interface) and
`shards` is the one registry of formats by name (built-in ones and plugins).
`tfrecord/` holds the TFRecord format with its C helpers (CRC-32C, zeros
written ahead); `array_record/` the array_record format.

May import: `rlds_writer.errors` and `store.storage`. Never the dataset's
layout (which imports the registry), the features, the writer or repair; a
format never imports another format.
"""
