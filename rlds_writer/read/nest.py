"""Nested dicts of columns (an episode, its steps): flattened, mapped, cut into rows.

A decoded episode is a nest: dicts of dicts whose leaves are arrays (or lists),
`steps` holding one column per field. Readers, statistics, the video tool and
every exporter walk these the same way; the helpers live here, apart from the
decoding that builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Sets `tree[path[0]][path[1]]... = value`, making the dicts on the way."""
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def flatten(tree: Mapping[str, Any], prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """The leaves of a nest as `(path, value)` pairs, in the nest's order.

    Args:
      tree: the nest.
      prefix: a path put before every path returned.

    Returns:
      One `(path, leaf)` per leaf; an empty dict gives none.
    """
    out = []
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.extend(flatten(v, prefix + (k,)))
        else:
            out.append((prefix + (k,), v))
    return out


def map_tree(fn: Callable[[Any], Any], tree: Mapping[str, Any]) -> dict[str, Any]:
    """The nest with `fn` applied to every leaf (the dicts are new, the keys kept)."""
    return {k: map_tree(fn, v) if isinstance(v, Mapping) else fn(v) for k, v in tree.items()}


def rows(tree: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Turns a nested dict of step columns into one nested dict per step.

    Columns of different lengths give as many rows as the shortest.
    """
    keys = list(tree)
    columns = [rows(v) if isinstance(v, Mapping) else list(v) for v in tree.values()]
    return [dict(zip(keys, values)) for values in zip(*columns)]
