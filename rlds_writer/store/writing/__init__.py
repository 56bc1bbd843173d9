"""store.writing: `DatasetWriter` and what it owns.

`writer` (finished episodes in, shards and dataset_info.json out),
`dataset_setup` (the directory made ready: created, overwritten, appended to),
`encoding` (the episode encoder), `split_shards` (each split's shards and the
listing it commits) and `exit_close` (what is open at exit is closed).

May import: every other room of `store`.
"""
