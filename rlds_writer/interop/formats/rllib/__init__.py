"""RLlib's offline episodes, both ways: `importer.py` (`convert --from rllib-episodes`, items
decoded as data by `state.py`, no pickle) and `exporter.py` (`export --to rllib-episodes`)."""

from __future__ import annotations

from rlds_writer.interop.plugin import (
    ACTION_SPACE,
    EPISODES_PER_FILE,
    OBSERVATION_SPACE,
    Exporter,
    Importer,
    Option,
)

FORMATS = (
    Importer(
        "rllib-episodes",
        f"{__name__}.importer:convert",
        "RLlib offline episode output",
        "the directory given to RLlib's config.offline_data(output=...)",
        extra="rllib,convert",
        order=30,
    ),
    Exporter(
        "rllib-episodes",
        f"{__name__}.exporter:export",
        "RLlib offline input",
        "a new directory for config.offline_data(input_=[DEST])",
        extra="rllib,convert",
        order=20,
        options=(
            OBSERVATION_SPACE,
            ACTION_SPACE,
            Option(
                "layout",
                "one row per episode (read with input_read_episodes=True; default) or RLlib's "
                "column layout, one row per transition",
                choices=("episodes", "columns"),
            ),
            EPISODES_PER_FILE,
        ),
    ),
)
