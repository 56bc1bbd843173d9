"""Fields of kinds the encoder has no wire form for, through TFDS's own encoder and serializer.

TFDS's `encode_example` and `ExampleSerializer` (imported only when such a
field is recorded) give these fields' map entries, which the episode encoder
(`store.writing.encoding`) joins with the parts it writes itself.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from rlds_writer import errors
from rlds_writer.store.features.field_encoding import example_entries
from rlds_writer.store.features.field_specs import FieldSpec


def encode_fallback(
    field: FieldSpec, values: Any, pool: Executor | None, serializers: dict[str, Any]
) -> bytes:
    """Encodes one field through TFDS's own encoder and serializer: its map entry.

    Args:
      field: the field (`field.tfds_feature` encodes it).
      values: its column (one value per step) or, for an episode field, its value.
      pool: threads that encode the steps' values, or None.
      serializers: field key -> its `ExampleSerializer`, kept by the caller.
    """
    import tensorflow_datasets as tfds
    import tree
    from tensorflow_datasets.core import example_serializer
    from tensorflow_datasets.core.features import sequence_feature

    feature = field.tfds_feature
    try:
        if field.in_steps:
            if pool is not None and len(values) > 1:
                encoded = list(pool.map(feature.encode_example, values))
            else:
                encoded = [feature.encode_example(v) for v in values]
            info = tfds.features.Sequence(feature).get_serialized_info()
            if encoded:
                encoded = sequence_feature.stack_nested(encoded)
            else:
                encoded = tree.map_structure(sequence_feature.build_empty_np, info)
        else:
            encoded = feature.encode_example(values)
            info = feature.get_serialized_info()
    except Exception as e:  # noqa: BLE001
        raise errors.EncodingError(f"{field.key}: TFDS could not encode the value ({e})") from e
    serializer = serializers.get(field.key)
    if serializer is None:
        serializer = example_serializer.ExampleSerializer(_nest(field.path, info))
        serializers[field.key] = serializer
    return example_entries(serializer.serialize_example(_nest(field.path, encoded)))


def _nest(path: tuple[str, ...], value: Any) -> Any:
    for name in reversed(path):
        value = {name: value}
    return value
