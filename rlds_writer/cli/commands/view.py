"""`rlds-writer view`: browse a dataset's episodes in a web page served on 127.0.0.1."""

from __future__ import annotations

import argparse
import sys
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "view",
        help="browse episodes in your web browser: cameras, plots, instructions (local server)",
        description="Serve a page on 127.0.0.1 that lists the dataset's episodes (sortable and "
        "filterable by length, return, ending, instruction and metadata) and plays one: every "
        "camera and a plot per numeric step field, driven by one step clock. The episode list "
        "is built from one scan and cached beside the dataset (viewer_index_<split>.json). "
        "Nothing is loaded from outside the machine. Ctrl-C stops it.",
    )
    p.add_argument("path", help="dataset directory (local, or s3://, gs://, ...)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one, printed)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; anything else lets other machines "
        "read the dataset: the viewer has no login)",
    )
    p.add_argument("--open", action="store_true", help="open the page in your web browser")
    p.add_argument(
        "--cache-mb",
        type=int,
        default=256,
        help="memory for recently viewed episodes' stored frames and values (default 256)",
    )
    p.add_argument(
        "--no-index-cache",
        action="store_true",
        help="build the episode list in memory only (write no viewer_index_<split>.json)",
    )
    p.set_defaults(func=run)


class _Progress:
    """One terminal line, rewritten as the index is built (a final line elsewhere)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self.last = 0.0
        self.shown = False

    def __call__(self, split: str, done: int, total: int) -> None:
        now = time.monotonic()
        if self.tty and (now - self.last > 0.1 or done == total):
            self.last = now
            sys.stderr.write(f"\rindexing {split}: {done}/{total} episodes ")
            sys.stderr.flush()
            self.shown = True
        if done == total and not self.tty:
            sys.stderr.write(f"indexed {split}: {total} episodes\n")

    def finish(self, scanned: int) -> None:
        if self.shown:
            sys.stderr.write("\n")
        if scanned:
            seconds = time.monotonic() - self.started
            sys.stderr.write(f"episode index: {scanned} episodes scanned in {seconds:.1f} s\n")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from rlds_writer.view.server import ViewerServer, is_loopback
    from rlds_writer.view.source import ViewerSource

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.cache_mb < 1:
        raise ValueError(f"--cache-mb must be at least 1, got {args.cache_mb}")
    if not is_loopback(args.host):
        print(
            f"rlds-writer view: warning: --host {args.host} lets other machines on the network "
            "read this dataset through the viewer, which has no login; use 127.0.0.1 unless you "
            "mean that",
            file=sys.stderr,
        )
    progress = _Progress()
    source = ViewerSource(
        args.path,
        progress=progress,
        index_cache=not args.no_index_cache,
        cache_bytes=args.cache_mb << 20,
    )
    progress.finish(source.index.scanned)
    try:
        server = ViewerServer((args.host, args.port), source, log=args.verbose)
    except OSError as e:
        raise OSError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    episodes = sum(len(split) for split in source.index.splits.values())
    print(f"serving {source.path} ({episodes} episodes) at {server.url}", flush=True)
    print("press Ctrl-C to stop", flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        source.close()
    print("stopped", flush=True)
    return 0
