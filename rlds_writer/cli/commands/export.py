"""`rlds-writer export`: an RLDS dataset to another format (those of `interop.EXPORT_FORMATS`)."""

from __future__ import annotations

import argparse
import json
import sys

from rlds_writer.cli.commands import _formats
from rlds_writer.interop import EXPORT_FORMATS

_LEROBOT_OPTIONS = ("fps", "task", "task_field", "robot_type")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help=f"export an RLDS dataset to {_formats.names(EXPORT_FORMATS)}",
        description=_formats.paragraph(
            "Export an RLDS dataset (streamed, one episode at a time) for an offline-RL library."
        ),
        epilog=_formats.listing(EXPORT_FORMATS, "target formats (--to FORMAT DEST):", "DEST"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--to",
        dest="target",
        required=True,
        choices=list(EXPORT_FORMATS),
        metavar="FORMAT",
        help=f"target format: {_formats.names(EXPORT_FORMATS)} (listed below)",
    )
    p.add_argument("src", help="RLDS dataset directory")
    p.add_argument("dest", help="what to write (for each format: below)")
    p.add_argument("--split", default="train", help="split to export (default train)")
    p.add_argument(
        "--cut-short",
        choices=("truncated", "drop"),
        default="truncated",
        help="episodes the recorder cut short (close/reset mid-episode): export them as "
        "truncated (default) or drop them",
    )
    p.add_argument(
        "--env-id",
        help="minari: the registered Gymnasium env whose spec recover_environment() makes "
        "(module:Env-v0 imports module first; default: the dataset's env_id, if registered)",
    )
    p.add_argument(
        "--observation-space",
        metavar="SPACE",
        help="minari, rllib-episodes: the observation space as Gymnasium prints it, e.g. "
        '"Box(0, 255, (64, 64, 3), uint8)" (default: the dataset\'s)',
    )
    p.add_argument(
        "--action-space",
        metavar="SPACE",
        help='minari, rllib-episodes: the action space, e.g. "Discrete(4)" (default: the '
        "dataset's)",
    )
    p.add_argument(
        "--data-format",
        choices=("hdf5", "arrow"),
        default="hdf5",
        help="minari: storage format (default hdf5)",
    )
    p.add_argument(
        "--jpeg",
        action="store_true",
        help="minari: JPEG-encode image observations (lossy; default raw)",
    )
    p.add_argument(
        "--layout",
        choices=("episodes", "columns"),
        default="episodes",
        help="rllib-episodes: one row per episode (read with input_read_episodes=True; "
        "default) or RLlib's column layout, one row per transition",
    )
    p.add_argument(
        "--episodes-per-file",
        type=int,
        default=1000,
        help="rllib-episodes, hf: episodes per Parquet file (default 1000)",
    )
    p.add_argument(
        "--compression",
        choices=("gzip", "lzf"),
        help="d3rlpy: compress the HDF5 arrays (default none, as d3rlpy writes)",
    )
    p.add_argument(
        "--channels-first",
        action="store_true",
        help="d3rlpy: store image observations (C, H, W), as d3rlpy's pixel encoder takes them",
    )
    p.add_argument("--fps", type=int, help="lerobot: frames per second (default metadata or 10)")
    p.add_argument("--task", help="lerobot: the task text of every frame (default: env id or name)")
    p.add_argument(
        "--task-field",
        help="lerobot: a Text step or episode field holding the task (e.g. language_instruction)",
    )
    p.add_argument("--robot-type", help="lerobot: LeRobot's robot_type (default none)")
    p.add_argument(
        "--video",
        action="store_true",
        help="lerobot: RGB cameras as MP4 videos (lossy; needs PyAV) instead of PNG images",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.interop import export as exporters

    options = {
        "split": args.split,
        "cut_short": args.cut_short,
        "env_id": args.env_id,
        "progress": not args.no_progress and sys.stderr.isatty(),
    }
    if args.target != "minari" and (args.jpeg or args.data_format != "hdf5"):
        raise ValueError("--jpeg and --data-format apply to --to minari only")
    if args.target != "rllib-episodes" and args.layout != "episodes":
        raise ValueError("--layout applies to --to rllib-episodes only")
    if args.target == "minari":
        if args.episodes_per_file != 1000:
            raise ValueError("--episodes-per-file applies to --to rllib-episodes and hf only")
        options.update(data_format=args.data_format, jpeg_encoding=args.jpeg)
    else:
        options["episodes_per_file"] = args.episodes_per_file
    if args.target == "rllib-episodes":
        options["layout"] = args.layout
    if args.target != "d3rlpy" and (args.compression or args.channels_first):
        raise ValueError("--compression and --channels-first apply to --to d3rlpy only")
    lerobot = {k: getattr(args, k) for k in _LEROBOT_OPTIONS if getattr(args, k) is not None}
    if args.target != "lerobot" and (lerobot or args.video):
        flags = ", ".join("--" + k.replace("_", "-") for k in lerobot) or "--video"
        raise ValueError(f"{flags} apply to --to lerobot only")
    if args.target != "minari" and args.env_id:
        raise ValueError("--env-id applies to --to minari only")
    elif args.target != "minari":
        del options["env_id"]
    spaces = {"observation_space": args.observation_space, "action_space": args.action_space}
    if args.target in ("minari", "rllib-episodes"):
        options.update(spaces)
    elif any(spaces.values()):
        raise ValueError(
            "--observation-space and --action-space apply to --to minari and rllib-episodes only"
        )
    if args.target in ("d3rlpy", "lerobot"):
        if args.episodes_per_file != 1000:
            raise ValueError("--episodes-per-file applies to --to rllib-episodes and hf only")
        del options["episodes_per_file"]
    if args.target == "d3rlpy":
        options.update(compression=args.compression, channels_first=args.channels_first)
    if args.target == "lerobot":
        options.update(lerobot, video=args.video)
    report = exporters.export(args.src, args.dest, to=args.target, **options)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    return 0
