"""view: `rlds-writer view`, a dataset browser served to the user's own web browser.

A layer above `read` and `maintain`: `source.py` opens the dataset and follows
its commits, `fields.py` sorts its features into cameras, plots, texts and
metadata (and says why the rest is left out), `episode_index.py` builds the
episode list from one scan (cached beside the statistics cache),
`listing.py` filters, sorts and pages it, `episode_data.py` gives one
episode's frames as stored and its numbers downsampled and exact, and
`server.py` serves the page (`static/`, shipped in the package) and its JSON
API on 127.0.0.1.

Public here: `ViewerSource`, `start`.

May import: `rlds_writer.errors`, `store`, `read`, `maintain`. Never `record`,
`interop` or `cli`.
"""

from __future__ import annotations

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "ViewerSource": ("rlds_writer.view.source", "ViewerSource"),
        "start": ("rlds_writer.view.server", "start"),
    },
)
