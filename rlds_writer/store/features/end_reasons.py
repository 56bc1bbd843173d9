"""Why an episode ended: the `end_reason` field and its values.

The env terminated or truncated the episode, or the recorder cut it short
(`reset()` or `close()` mid-episode, a refused value, interpreter exit); RLDS's
`is_terminal`/`is_last` cannot tell a cut from a truncation, this field does
(docs/rlds-semantics.md).
"""

from __future__ import annotations

# Episode-level Text field saying why an episode ended: the env terminated or
# truncated it, or the recorder cut it short (reset or close mid-episode, a
# refused value, interpreter exit). Recorders declare it unless the user gave a
# full DatasetConfig without it; readers treat a missing field as unknown.
END_REASON = "end_reason"
TERMINATED, TRUNCATED, CUT_SHORT = "terminated", "truncated", "cut_short"
END_REASONS = (TERMINATED, TRUNCATED, CUT_SHORT)
