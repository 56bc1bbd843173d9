"""store.repair: whole directories made right: crash `recovery` and `merge`.

May import: `rlds_writer.errors`, `store.storage`, `store.formats`, `store.dataset`.
Never the writer (the writer imports these: append mode recovers first).
"""
