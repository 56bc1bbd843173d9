"""`rlds-writer validate`: decode every episode through TFDS and check the RLDS invariants."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate",
        help="decode every episode through TFDS and check the RLDS invariants",
        description="Decode every episode with tfds.builder_from_directory and check: shard "
        "files match dataset_info.json; is_first only on step 0, is_last only on the final "
        "step, is_terminal only on a final step; step fields of equal length. Exits 1 and "
        "names the episode and step of the first violation.",
    )
    p.add_argument("path", help="dataset directory (local, or s3://, gs://, ...)")
    p.add_argument("--split", action="append", help="split to check (repeatable; default all)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--max-violations", type=int, default=20, help="stop after this many (default 20)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rlds_writer.errors import counted
    from rlds_writer.maintain.validation import describe_violation, validate

    result = validate(args.path, splits=args.split, max_violations=args.max_violations)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for split, s in result["splits"].items():
            if s["episodes"] is None:
                print(f"{split}: not decoded (its shard files are damaged)")
            else:
                episodes, steps = counted(s["episodes"], "episode"), counted(s["steps"], "step")
                print(f"{split}: {episodes}, {steps} decoded")
        for note in result["notes"]:
            print(f"note: {note}")
        if result["ok"]:
            print(f"{result['path']}: valid")
        else:
            for v in result["violations"]:
                print(f"violation: {describe_violation(v)}")
    if not result["ok"]:
        first = describe_violation(result["first_violation"])
        print(f"rlds-writer validate: invalid: first violation at {first}", file=sys.stderr)
        return 1
    return 0
