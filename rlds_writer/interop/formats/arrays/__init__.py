"""Episodes as arrays, in: `importer.py` (`convert --from npz-dir` and `--from hdf5-episodes`)."""

from __future__ import annotations

from rlds_writer.interop.plugin import MAX_INFLATION, Importer, Option

_MAP = Option(
    "mapping",
    "which key holds a field, e.g. observation/image=obs/pixels (fields: "
    "observation[/name], action, reward, discount, terminated, truncated, step/<name>, "
    "episode/<name>; repeatable)",
    flag="--map",
    action="append",
    metavar="FIELD=KEY",
)

FORMATS = (
    Importer(
        "npz-dir",
        f"{__name__}.importer:convert_npz",
        "episodes as .npz files (or directories of .npy files)",
        "a directory of them, one per episode",
        order=50,
        options=(_MAP, MAX_INFLATION),
    ),
    Importer(
        "hdf5-episodes",
        f"{__name__}.importer:convert_hdf5",
        "HDF5 files of episode groups",
        "an .hdf5 file with one group per episode",
        extra="convert",
        order=60,
        options=(
            _MAP,
            Option(
                "episodes_group",
                "the group whose child groups are episodes (default data)",
            ),
            MAX_INFLATION,
        ),
    ),
)
