"""An export that stops halfway and waits to be killed, for tests/interop/test_export_killed.py.

    python tests/export_kill_child.py SRC DEST FORMAT MARKER AFTER

Runs `rlds_writer.export(SRC, DEST, to=FORMAT)` (one episode per file where
the format has files of episodes); when the exporter asks for episode AFTER,
every earlier one has been handed to the format's writer: it writes MARKER
and sleeps, so the test can SIGKILL it there. With AFTER -1 it runs to the end.
"""

from __future__ import annotations

import importlib
import sys
import time


def main() -> None:
    src, dest, target, marker, after = sys.argv[1:6]
    after = int(after)
    from rlds_writer.interop import export as export_lib

    module = importlib.import_module(export_lib.FORMATS[target].code.partition(":")[0])
    name = "numbered_episodes" if hasattr(module, "numbered_episodes") else "source_episodes"
    real = getattr(module, name)

    def pausing(*args, **kwargs):
        for i, item in enumerate(real(*args, **kwargs)):
            if i == after:
                with open(marker, "w") as f:
                    f.write(str(i))
                time.sleep(600)
            yield item

    setattr(module, name, pausing)
    options = {"episodes_per_file": 1} if target in ("rllib-episodes", "hf") else {}
    report = export_lib.export(src, dest, to=target, **options)
    print(report.summary())


if __name__ == "__main__":
    main()
