"""Transitions `(o, a, r, o', terminated, truncated)` from RLDS episodes, without TensorFlow.

The rules (docs/sharing.md, "Transitions"), for an episode of `n` RLDS steps:

* step `t` holds observation `o_t` and the action `a_t`, reward `r_t` and
  discount `d_t` that followed it; the final step (`is_last`) holds only the
  last observation (RLDS leaves its action and reward undefined), so an
  episode of `n` steps gives `n - 1` transitions, `t = 0 .. n-2`, with
  `next_observation = o_{t+1}`. The final step is a `next_observation`, never a
  transition of its own; a one-step episode (reset, then nothing) gives none.
* transitions never pair across episodes: each episode is cut on its own.
* `terminated` is True only on the last transition of an episode whose final
  step has `is_terminal`; `truncated` is True only on the last transition of
  an episode that ended without it (time limit, reset, close). Exactly one of
  the two is set on an episode's last transition, neither elsewhere (when a
  Gymnasium env reported both, RLDS stores the termination only).
* episodes cut short by the recorder (their episode-level `end_reason` field,
  which our recorders write, reads `cut_short`) are kept as truncated
  (`cut_short="truncated"`, the default) or left out (`cut_short="drop"`).
* other step fields (step metadata) come as `step_metadata` (the values of step
  `t`, recorded with `o_t`) and `next_step_metadata` (those of step `t+1`:
  what the env reported with `o_{t+1}`, e.g. Gymnasium's `info` from `step()`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from rlds_writer.read.nest import flatten, map_tree
from rlds_writer.store.features import end_reasons

__all__ = [
    "CUT_SHORT_MODES",
    "END_FIELDS",
    "episode_end",
    "episode_transitions",
    "iter_transitions",
    "qlearning_dataset",
    "transition_batches",
]

# Episode-level fields that may say why an episode ended (the recorder's
# field, plus names other tools use); the value `cut_short` marks an episode
# the recorder ended itself.
END_FIELDS = (end_reasons.END_REASON, "end", "episode_end")
CUT_SHORT_MODES = ("truncated", "drop")
_STANDARD = ("observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal")


def _text(value: Any) -> str:
    value = np.asarray(value).reshape(-1)[0] if np.ndim(value) else value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value.item() if isinstance(value, np.generic) else value)


def episode_end(episode: Mapping[str, Any]) -> str:
    """How an episode ended: "terminated", "truncated" or "cut_short".

    Uses the episode-level end field when the dataset records one
    (`END_FIELDS`), else the final step's `is_terminal` flag (a cut-short
    episode then reads as "truncated": nothing on disk tells them apart).
    """
    for where in (episode, episode.get("episode_metadata") or {}):
        for name in END_FIELDS:
            if name in where and not isinstance(where[name], Mapping):
                value = _text(where[name]).strip().lower().replace(" ", "_")
                if value in end_reasons.END_REASONS:
                    return value
    terminal = episode.get("steps", {}).get("is_terminal")
    if terminal is not None and len(terminal) and bool(terminal[-1]):
        return "terminated"
    return "truncated"


def _check_mode(cut_short: str) -> None:
    if cut_short not in CUT_SHORT_MODES:
        raise ValueError(
            f"cut_short must be one of {CUT_SHORT_MODES}, got {cut_short!r}: "
            "'truncated' keeps episodes the recorder ended as truncated, 'drop' leaves them out"
        )


def episode_transitions(
    episode: Mapping[str, Any], *, cut_short: str = "truncated"
) -> dict[str, Any] | None:
    """The transitions of one decoded episode, as arrays with a leading axis of `n - 1`.

    Args:
      episode: an episode as the reader decodes it (`{"steps": {...}, ...}`).
      cut_short: "truncated" (keep an episode the recorder cut short, as
        truncated) or "drop" (return None for it).

    Returns:
      A dict with `observation`, `action`, `reward`, `next_observation`,
      `terminated`, `truncated`, `discount` (ones if the dataset has none),
      `step_metadata` and `next_step_metadata` (dicts, maybe empty); values are
      views into the episode's arrays where possible. None when the episode is
      dropped. An episode of one step gives arrays of length 0.
    """
    _check_mode(cut_short)
    end = episode_end(episode)
    if end == "cut_short" and cut_short == "drop":
        return None
    steps = episode.get("steps") or {}
    if "observation" not in steps:
        raise ValueError("episode has no steps/observation; transitions need observations")
    n = len(flatten({"o": steps["observation"]})[0][1])
    t = max(n - 1, 0)

    def head(tree: Any) -> Any:
        return map_tree(lambda a: a[:t], tree) if isinstance(tree, Mapping) else tree[:t]

    def tail(tree: Any) -> Any:
        return map_tree(lambda a: a[1 : t + 1], tree) if isinstance(tree, Mapping) else tree[1:]

    terminated = np.zeros(t, dtype=np.bool_)
    truncated = np.zeros(t, dtype=np.bool_)
    if t:
        if end == "terminated":
            terminated[-1] = True
        else:
            truncated[-1] = True
    reward = steps.get("reward")
    discount = steps.get("discount")
    extra = {k: v for k, v in steps.items() if k not in _STANDARD}
    return {
        "observation": head(steps["observation"]),
        "action": head(steps["action"]) if "action" in steps else None,
        "reward": head(reward) if reward is not None else np.zeros(t, np.float32),
        "discount": head(discount) if discount is not None else np.ones(t, np.float32),
        "next_observation": tail(steps["observation"]),
        "terminated": terminated,
        "truncated": truncated,
        "step_metadata": {k: head(v) for k, v in extra.items()},
        "next_step_metadata": {k: tail(v) for k, v in extra.items()},
    }


def transition_batches(
    episodes: Iterable[Mapping[str, Any]], *, cut_short: str = "truncated"
) -> Iterator[dict[str, Any]]:
    """Yields the transitions of each episode in turn, one dict of arrays per episode.

    Episodes without transitions (one step) and dropped ones yield nothing.
    See `episode_transitions` for the fields and `cut_short`.
    """
    _check_mode(cut_short)
    for episode in episodes:
        batch = episode_transitions(episode, cut_short=cut_short)
        if batch is not None and len(batch["terminated"]):
            yield batch


def iter_transitions(
    episodes: Iterable[Mapping[str, Any]], *, cut_short: str = "truncated"
) -> Iterator[dict[str, Any]]:
    """Yields one dict per transition (see `episode_transitions` for the fields)."""
    for batch in transition_batches(episodes, cut_short=cut_short):
        if batch["action"] is None:
            batch = {k: v for k, v in batch.items() if k != "action"}
        for i in range(len(batch["terminated"])):
            yield _row(batch, i)


def _row(tree: Mapping[str, Any], i: int) -> dict[str, Any]:
    # Not decode.rows: empty dicts (no step metadata) must still give every row.
    return {k: _row(v, i) if isinstance(v, Mapping) else v[i] for k, v in tree.items()}


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, Mapping):
        return {k: _concat([p[k] for p in parts]) for k in first}
    return np.concatenate(parts, axis=0)


def qlearning_dataset(
    episodes: Iterable[Mapping[str, Any]],
    *,
    cut_short: str = "truncated",
    step_metadata: bool = False,
) -> dict[str, Any]:
    """All transitions of a selection as one dict of arrays, named as D4RL's `qlearning_dataset`.

    Args:
      episodes: decoded episodes (e.g. `open_dataset(path).episodes("train")`).
      cut_short: "truncated" or "drop" (see `episode_transitions`).
      step_metadata: also return `step_metadata` / `next_step_metadata`.

    Returns:
      `observations`, `actions`, `next_observations`, `rewards`, `terminals`,
      `timeouts` (truncations), `discounts` and `episode_ids` (index of each
      transition's episode among the episodes read, dropped ones included).
      A dict observation gives a dict of arrays. Arrays are copies.

    Raises:
      ValueError: when there are no transitions at all.
    """
    _check_mode(cut_short)
    parts: list[dict[str, Any]] = []
    for index, episode in enumerate(episodes):
        batch = episode_transitions(episode, cut_short=cut_short)
        if batch is None or not len(batch["terminated"]):
            continue
        batch["episode_ids"] = np.full(len(batch["terminated"]), index, np.int64)
        if not step_metadata:
            batch.pop("step_metadata")
            batch.pop("next_step_metadata")
        parts.append(batch)
    if not parts:
        raise ValueError("no transitions: every episode has one step or was dropped")
    out = _concat([{k: v for k, v in p.items() if v is not None} for p in parts])
    names = {
        "observation": "observations",
        "action": "actions",
        "next_observation": "next_observations",
        "reward": "rewards",
        "terminated": "terminals",
        "truncated": "timeouts",
        "discount": "discounts",
    }
    return {names.get(k, k): v for k, v in out.items()}
