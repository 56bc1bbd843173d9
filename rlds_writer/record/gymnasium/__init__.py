"""record.gymnasium: the Gymnasium wrappers.

`gymnasium_wrapper` (`RecordRLDS`, one `gymnasium.Env`) and `gymnasium_vector`
(`RecordRLDSVector`, each sub-env of a vector env). What they share with the
PettingZoo wrappers (`Recording`) is in the core, `record/gymnasium_recording.py`.

May import: the recording core, `rlds_writer.store`, `rlds_writer.errors`.
Never another adapter.
"""

from rlds_writer._exports import lazy_exports

lazy_exports(
    globals(),
    {
        "RecordRLDS": ("rlds_writer.record.gymnasium.gymnasium_wrapper", "RecordRLDS"),
        "RecordRLDSVector": ("rlds_writer.record.gymnasium.gymnasium_vector", "RecordRLDSVector"),
    },
)
