"""store.images: PNG and JPEG frames encoded off the env thread.

`image_codecs` (the codecs), `frame_stream` (frames encoded while their
episode runs), `image_processes` and `image_worker` (the encoding processes
reading frames from shared memory).

May import: `rlds_writer.errors`, `store.episodes`, `store.features` (the wire
primitives). Never the writer.
"""
