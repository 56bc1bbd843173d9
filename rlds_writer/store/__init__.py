"""store: the disk format and the dataset writer.

Everything that knows how bytes sit on disk lives here: the dataset directory
layout and shard names, the TFRecord frame, the protobuf wire primitives, the
feature model (`features.py`: one vocabulary of feature kinds and one walk
over feature specs, for `features.json` and for TFDS's feature objects), the
episode encoder, the shard file formats (`shards.py`: one `FileFormat` object
per format, writing, reading, walking and repairing its shards), the
background `DatasetWriter`,
the directory lock, crash recovery and `merge` (the writer's append mode and
the RLlib recorder need both).

Public here: `DatasetWriter` (episodes to a dataset directory), `MergeReport`
and `writer_directory` (`merge` itself is `rlds_writer.merge`: the module
`store.merge` holds it).

May import: `rlds_writer.errors` and other `store` modules. Nothing here
imports `record`, `read`, `maintain`, `interop` or `cli`.
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "DatasetWriter": ("rlds_writer.store.writer", "DatasetWriter"),
        "MergeReport": ("rlds_writer.store.merge", "MergeReport"),
        "writer_directory": ("rlds_writer.store.merge", "writer_directory"),
    },
)
