"""record.pettingzoo: the PettingZoo wrappers.

`pettingzoo_wrappers` (`RecordRLDSParallel`, `RecordRLDSAEC`: one RLDS episode
per agent) and `pettingzoo_joint` (the opt-in joint layout, one RLDS episode
per env episode).

May import: the recording core, `rlds_writer.store`, `rlds_writer.errors`.
Never another adapter.
"""

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        name: ("rlds_writer.record.pettingzoo.pettingzoo_wrappers", name)
        for name in (
            "RecordRLDSParallel",
            "RecordRLDSAEC",
            "RecordingWrapper",
            "default_agent_group",
        )
    },
)
