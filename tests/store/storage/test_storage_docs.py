"""docs/storage.md's python blocks run as one script against moto S3 and the GCS emulator.

`s3://my-bucket` and `gs://my-bucket` in the blocks become fresh buckets on
the test servers; nothing reaches any address but 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "storage.md"
_FENCE = re.compile(r"(<!-- not-run: [^>]*-->\n)?```python\n(.*?)```", re.S)


@pytest.mark.slow
def test_storage_doc_blocks_run_against_the_emulators(s3_bucket, gcs_bucket, tmp_path):
    blocks = [body for skip, body in _FENCE.findall(DOC.read_text()) if not skip]
    assert blocks, "docs/storage.md has no python block"
    script = "\n".join(blocks)
    script = script.replace("s3://my-bucket", s3_bucket.url)
    script = script.replace("gs://my-bucket", gcs_bucket.url)
    (tmp_path / "storage_doc.py").write_text(script)
    env = {**os.environ, **s3_bucket.env, **gcs_bucket.env, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "storage_doc.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    import fsspec

    names = fsspec.filesystem("gs").ls(f"{gcs_bucket.name}/catch", detail=False)
    assert any(".tfrecord-" in name for name in names), names
