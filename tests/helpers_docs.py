"""What the tests of the docs' code blocks share: where the docs are, how a
block is fenced, and the recording docs/sharing.md's examples export."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A fenced block, optionally marked `<!-- not-run: reason -->` on the line before.
FENCE = re.compile(
    r"(?:<!-- not-run: (?P<why>[^>]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)```", re.S
)

# The CartPole recording docs/sharing.md's examples export (needs DATA set).
RUN1_SETUP = """
import os
import gymnasium as gym
import rlds_writer
run1 = rlds_writer.RecordRLDS(
    gym.make("CartPole-v1"), os.path.join(DATA, "run1"), name="run1",
    step_fn=lambda obs, action, reward, terminated, truncated, info: {"station": 3},
)
run1.reset(seed=0)
for t in range(300):
    _, _, terminated, truncated, _ = run1.step(t % 2)
    if terminated or truncated:
        run1.reset()
run1.close()
"""
