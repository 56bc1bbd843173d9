"""The episode list: one split's index rows filtered, sorted and cut into pages.

A query comes from the page's URL parameters (all optional): `sort` (`id`,
`length`, `return`, `ending`, `instruction` or `meta:<field>`), `order`
(`asc`/`desc`), `min_length`, `max_length`, `min_return`, `max_return`,
`ending` (comma-separated endings), `text` (a substring of the instruction or
any per-step text, any case), `meta` (`field=text`: the episode-level field's
value contains the text), `offset` and `limit`. Bad values are a `ValueError`
naming the parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlds_writer.view.episode_index import ENDINGS, SplitIndex

MAX_LIMIT = 500
SORTS = ("id", "length", "return", "ending", "instruction")


@dataclasses.dataclass(frozen=True)
class Query:
    """A parsed list query (see the module docstring)."""

    sort: str = "id"
    descending: bool = False
    min_length: int | None = None
    max_length: int | None = None
    min_return: float | None = None
    max_return: float | None = None
    endings: tuple[str, ...] = ()
    text: str = ""
    meta: tuple[str, str] | None = None
    offset: int = 0
    limit: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Query:
        """Reads a query from URL parameters; raises ValueError naming a bad one."""
        sort = params.get("sort", "id") or "id"
        if sort not in SORTS and not sort.startswith("meta:"):
            raise ValueError(
                f"sort: expected one of {', '.join(SORTS)} or meta:<field>, got {sort!r}"
            )
        order = params.get("order", "asc") or "asc"
        if order not in ("asc", "desc"):
            raise ValueError(f"order: expected asc or desc, got {order!r}")
        endings = tuple(e for e in (params.get("ending") or "").split(",") if e)
        for ending in endings:
            if ending not in ENDINGS:
                raise ValueError(f"ending: expected some of {', '.join(ENDINGS)}, got {ending!r}")
        meta = None
        if params.get("meta"):
            key, sep, value = params["meta"].partition("=")
            if not sep or not key:
                raise ValueError(f"meta: expected field=text, got {params['meta']!r}")
            meta = (key.strip(), value.strip())
        limit = _number(params, "limit", int, 50)
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit: expected 1..{MAX_LIMIT}, got {limit}")
        offset = _number(params, "offset", int, 0)
        if offset < 0:
            raise ValueError(f"offset: expected 0 or more, got {offset}")
        return cls(
            sort=sort,
            descending=order == "desc",
            min_length=_number(params, "min_length", int, None),
            max_length=_number(params, "max_length", int, None),
            min_return=_number(params, "min_return", float, None),
            max_return=_number(params, "max_return", float, None),
            endings=endings,
            text=(params.get("text") or "").strip(),
            meta=meta,
            offset=offset,
            limit=limit,
        )


def _number(params: Mapping[str, str], name: str, kind: type, default: Any) -> Any:
    text = (params.get(name) or "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {text!r}") from None
    if kind is float and value != value:
        raise ValueError(f"{name}: expected a number, got {text!r}")
    return value


def order(index: SplitIndex, query: Query) -> np.ndarray:
    """The ids of the episodes the query keeps, in its order."""
    keep = np.ones(len(index), bool)
    if query.min_length is not None:
        keep &= index.lengths >= query.min_length
    if query.max_length is not None:
        keep &= index.lengths <= query.max_length
    if query.min_return is not None:
        keep &= index.returns >= query.min_return  # NaN (no reward) is never kept
    if query.max_return is not None:
        keep &= index.returns <= query.max_return
    if query.endings:
        codes = [ENDINGS.index(e) for e in query.endings]
        keep &= np.isin(index.endings, codes)
    if query.text:
        needle = query.text.casefold()
        keep &= np.fromiter((needle in t for t in index.search_text), bool, len(index))
    if query.meta is not None:
        key, value = query.meta
        needle = value.casefold()
        keep &= np.fromiter(
            (key in r["metadata"] and needle in _text(r["metadata"][key]) for r in index.rows),
            bool,
            len(index),
        )
    ids = np.flatnonzero(keep)
    key = _sort_key(index, query.sort, ids)
    if key is not None:
        # Stable: ties keep episode order, in either direction.
        ranks = np.argsort(key, kind="stable")
        if query.descending:
            ranks = _stable_descending(key, ranks)
        ids = ids[ranks]
    elif query.descending:
        ids = ids[::-1]
    return ids


def _stable_descending(key: np.ndarray, ascending: np.ndarray) -> np.ndarray:
    """Descending by key, ties in episode order (reverse the groups, not within them)."""
    sorted_keys = key[ascending]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    groups = np.split(ascending, starts[1:])
    return np.concatenate(groups[::-1]) if groups else ascending


def _text(value: Any) -> str:
    return str(value).casefold()


def _sort_key(index: SplitIndex, sort: str, ids: np.ndarray) -> np.ndarray | None:
    if sort == "id":
        return None
    if sort == "length":
        return index.lengths[ids]
    if sort == "return":
        values = index.returns[ids]
        return np.where(np.isnan(values), -np.inf, values)  # no reward sorts first
    if sort == "ending":
        return index.endings[ids]
    if sort == "instruction":
        return np.array([index.rows[i]["instruction"].casefold() for i in ids], dtype=object)
    field = sort[len("meta:") :]
    values = [index.rows[i]["metadata"].get(field) for i in ids]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) == len(values):
        return np.array(values, np.float64)
    return np.array([_text("" if v is None else v) for v in values], dtype=object)


def page(index: SplitIndex, query: Query) -> dict[str, Any]:
    """One page of the list: `total`, `matched`, `offset`, `limit` and the `episodes`."""
    ids = order(index, query)
    chosen = ids[query.offset : query.offset + query.limit]
    return {
        "split": index.split,
        "total": len(index),
        "matched": int(len(ids)),
        "offset": query.offset,
        "limit": query.limit,
        "episodes": [{"id": int(i), **index.rows[i]} for i in chosen],
    }


def neighbour(index: SplitIndex, query: Query, episode: int, step: int) -> int | None:
    """The episode `step` places after (or before, for -1) `episode` in the query's order.

    An episode the filters leave out goes to the first (or last) one they keep.
    """
    ids = order(index, query)
    if not len(ids):
        return None
    where = np.flatnonzero(ids == episode)
    if not len(where):
        return int(ids[0] if step > 0 else ids[-1])
    position = int(where[0]) + step
    return int(ids[position]) if 0 <= position < len(ids) else None
