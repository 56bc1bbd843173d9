"""store.episodes: a finished episode as the store receives it, and the memory it lives in.

`episode_data` (`Episode`, its per-field columns, `BufferPool`),
`shared_frames` (frame buffers in shared memory) and `chunk_spares` (large-row
chunks kept for the next recording of the process).

May import: nothing of ours but `rlds_writer.errors`.
"""
