"""`rlds-writer show`: one episode's image observations as an animated GIF (or MP4)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show",
        help="render an episode's image observations (and scalar fields) as a GIF or MP4",
        description="Read one episode without TensorFlow and write its image-like step fields "
        "side by side, with a strip per scalar step field (reward, a scalar action, numeric "
        "step metadata) and a cursor at the current step. .gif needs nothing more; .mp4 "
        "needs PyAV (pip install av).",
    )
    p.add_argument("path", help="dataset directory (local, or s3://, gs://, ...)")
    p.add_argument("--episode", type=int, default=0, help="episode index in the split")
    p.add_argument("--split", default="train", help="split (TFDS split syntax)")
    p.add_argument("--out", required=True, help="output file, .gif or .mp4")
    p.add_argument(
        "--field", action="append", help="image field to show, e.g. observation/image (repeatable)"
    )
    p.add_argument("--fps", type=float, default=10.0, help="frames per second")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.maintain.episode_video import render_episode

    done = render_episode(
        args.path,
        args.out,
        episode=args.episode,
        split=args.split,
        fields=args.field,
        fps=args.fps,
    )
    width, height = done["size"]
    print(
        f"{done['out']}: {done['frames']} frames of {width}x{height} ({', '.join(done['fields'])})"
    )
    return 0
