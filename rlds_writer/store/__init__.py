"""store: the disk format and the dataset writer, in rooms named for what they hold.

- `storage/`: the storage seam (local disks, object stores) and how files are written;
- `formats/`: the shard file formats, one folder each (`tfrecord/`, `array_record/`);
- `dataset/`: a dataset directory's layout, names, lock, and the `Dataset` handle;
- `features/`: the feature model and one field's values as wire bytes;
- `episodes/`: a finished episode as the store receives it, and its memory;
- `images/`: PNG and JPEG frames encoded off the env thread;
- `writing/`: `DatasetWriter` and what it owns (setup, encoder, shards per split);
- `repair/`: crash recovery and `merge`.

Public here: `DatasetWriter` (episodes to a dataset directory), `MergeReport`
and `writer_directory` (`merge` itself is `rlds_writer.merge`).

May import: `rlds_writer.errors`. Nothing here imports `record`, `read`,
`maintain`, `interop` or `cli`; the rooms' own rules are in each room's
`__init__.py` and tests/package/test_layers.py.
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

# Modules that were in store/ before 0.2 (CHANGELOG.md), and where they are now.
_MOVED_MODULES = {
    name: f"rlds_writer.store.{room}.{name}"
    for name, room in {
        "storage_remote": "storage",
        "object_path": "storage",
        "local_copies": "storage",
        "file_io": "storage",
        "shard_format": "formats",
        "shards": "formats",
        "tfrecord": "formats.tfrecord",
        "tfrecord_reader": "formats.tfrecord",
        "tfrecord_shards": "formats.tfrecord",
        "write_ahead": "formats.tfrecord",
        "array_record_shards": "formats.array_record",
        "layout": "dataset",
        "names": "dataset",
        "locate": "dataset",
        "locking": "dataset",
        "json_values": "dataset",
        "feature_walk": "features",
        "feature_defs": "features",
        "field_specs": "features",
        "field_encoding": "features",
        "wire": "features",
        "end_reasons": "features",
        "episode_data": "episodes",
        "chunk_spares": "episodes",
        "shared_frames": "episodes",
        "image_codecs": "images",
        "frame_stream": "images",
        "image_processes": "images",
        "image_worker": "images",
        "writer": "writing",
        "dataset_setup": "writing",
        "split_shards": "writing",
        "exit_close": "writing",
        "encoding": "writing",
        "recovery": "repair",
        "merge": "repair",
    }.items()
}

lazy_exports(
    globals(),
    {
        "DatasetWriter": ("rlds_writer.store.writing.writer", "DatasetWriter"),
        "MergeReport": ("rlds_writer.store.repair.merge", "MergeReport"),
        "writer_directory": ("rlds_writer.store.repair.merge", "writer_directory"),
    },
    submodules=(
        "storage",
        "formats",
        "dataset",
        "features",
        "episodes",
        "images",
        "writing",
        "repair",
    ),
    moved=_MOVED_MODULES,
)
