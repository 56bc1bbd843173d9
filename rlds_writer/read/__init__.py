"""read: the TF-free reading path.

`open_dataset` returns a `DatasetReader` (splits, episodes decoded to numpy
exactly as TFDS decodes them, random access by index); it reads each shard
through its file format's reader (`store/formats/shards.py`: `FileFormat.open_reader`).
Under it are record decoding (`decode.py`; `nest.py` holds the nested-dict helpers many modules
share), images (`images.py`, `png.py`), TFDS split syntax (`splits.py`),
RLDS steps as transitions (`transitions.py`), the PyTorch datasets
(`torch_data.py`, `torch_transitions.py`) and the Ray Data datasource
(`ray_data.py`). `info`, `validate`, `stats`,
`show` and the exporters read records through here.

Public here: `open_dataset`, `DatasetReader`.

May import: `rlds_writer.errors`, `rlds_writer.store`. Never `record`,
`maintain`, `interop` or `cli`.
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "open_dataset": ("rlds_writer.read.reader", "open_dataset"),
        "DatasetReader": ("rlds_writer.read.reader", "DatasetReader"),
    },
)
