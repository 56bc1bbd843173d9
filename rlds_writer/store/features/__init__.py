"""store.features: the feature model, and how one field's values become wire bytes.

`features` (one vocabulary of leaf kinds), `feature_walk` (the one walk over
feature specs), `feature_defs` (TFDS's feature kinds defined without TFDS),
`field_specs` (how the writer encodes each leaf), `field_encoding` (one
field's values to protobuf wire bytes), `wire` (the `tf.train.Example` wire
primitives) and `end_reasons` (the `end_reason` field).

May import: `rlds_writer.errors`, `store.episodes`. Never the images, the
writer or the formats.
"""
