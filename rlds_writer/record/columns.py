"""The per-field columns of the episode buffer: how each kind of value is kept between steps.

`make_column` picks the column of a field by the kind of value it keeps:

- scalar numbers (`record/scalar_columns.py`): Python lists cast at the
  episode's end, or (float32, float64 and int64, where the C step is built) a
  buffer packed at the step;
- small fixed-shape rows, text and TFDS-encoded values (`record/row_columns.py`):
  a row of bytes per step (one buffer, with the C step), or the values in a list;
- large rows and images (`record/chunk_columns.py`): recycled chunks from the
  recorder's `BufferPool`, or frames encoded while the episode runs.

Every value is checked at the step (`record.values`) and copied: envs often
reuse their arrays.
"""

from __future__ import annotations

from typing import Any

from rlds_writer.record.chunk_columns import (
    FramedRowsColumn,
    LargeArrayColumn,
    _ImageColumn,
    _StreamedImageColumn,
)
from rlds_writer.record.row_columns import LARGE_ROW, _ArrayColumn, _ListColumn
from rlds_writer.record.scalar_columns import scalar_column
from rlds_writer.store.episodes.episode_data import BufferPool
from rlds_writer.store.features import field_specs
from rlds_writer.store.images import frame_stream


def make_column(
    field: field_specs.FieldSpec,
    pool: BufferPool,
    stream: frame_stream.FrameStream | None = None,
) -> Any:
    """The column that keeps `field`'s values between steps."""
    if stream is not None:
        return _StreamedImageColumn(field, stream)
    if field.kind in (field_specs.PNG, field_specs.JPEG) and None not in field.shape:
        return _ImageColumn(field, pool)
    if field.kind in (field_specs.FLOAT, field_specs.INT) and field.shape == ():
        return scalar_column(field)
    if field.kind in (field_specs.FLOAT, field_specs.INT, field_specs.BYTES, field_specs.ZLIB):
        if field.row_nbytes >= LARGE_ROW:
            if FramedRowsColumn.takes(field):
                return FramedRowsColumn(field, pool)
            return LargeArrayColumn(field, pool)
        return _ArrayColumn(field)
    return _ListColumn(field)
