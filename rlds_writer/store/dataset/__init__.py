"""store.dataset: a dataset directory: its layout, names, lock, and the `Dataset` handle.

`layout` (files and shard names as TFDS writes them), `names` (the check of
names that become file names), `locate` (is this path a dataset?),
`locking` (one writer per directory), `json_values` (dataset_info.json's
text, JSON-safe metadata) and `dataset` (`Dataset`: a directory opened once).

Public here: `Dataset`, `SplitListing`, `open_handle`.

May import: `rlds_writer.errors`, `store.storage`, `store.formats` (the
registry), `store.features`.
"""

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        name: ("rlds_writer.store.dataset.dataset", name)
        for name in ("Dataset", "SplitListing", "open_handle")
    },
)
