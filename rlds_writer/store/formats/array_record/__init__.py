"""store.formats.array_record: array_record shards (riegeli files with random access)."""
