"""store.storage: the storage seam, and how the store touches files through it.

`storage` (one `Storage` per file system: local disks, and every fsspec
`scheme://` through `storage_remote`), `object_path` (`as_path`: the subset of
`pathlib` the store uses, for local and remote paths alike), `file_io`
(durable, exclusive and atomic writes, never through a link) and
`local_copies` (whole local copies of remote shards, for readers that open
paths only).

May import: `rlds_writer.errors`. Nothing else of ours.
"""
