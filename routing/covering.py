"""Exact filter covering: does one filter match everything another does?

Route summarization leaves out a filter when another filter of the same
origin covers it, so "covers" must never say yes wrongly (an event would be
lost) and should not say no wrongly (routes would not shrink). This module
decides it exactly, over the topics that can really exist: the 250-byte and
128-level limits and the ``$`` rule included.

How: ``general`` fails to cover ``specific`` exactly when some valid topic is
matched by ``specific`` and not by ``general``. Such a topic either has a
level count ``general`` does not accept, or one level where ``general``
rejects a value ``specific`` allows. One deviation suffices, so we search for
the cheapest one: for each level count ``n`` that ``specific`` accepts, fill
every level with its cheapest allowed value (shortest byte length), then try
to make one level a rejected value at the least extra cost, and check the
total against the byte limit. This is O(levels), with no enumeration.
"""

from __future__ import annotations

from typing import Final

from routing.filters import STAR, Filter, Prefix, Token, as_filter
from routing.topics import MAX_LEVELS, MAX_TOPIC_BYTES

_IMPOSSIBLE: Final = MAX_TOPIC_BYTES * 4  # larger than any topic can be


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _can_appear_in_topic(text: str) -> bool:
    return "*" not in text and ">" not in text


def _token_at(flt: Filter, i: int) -> Token | None:
    """The constraint ``flt`` puts on level ``i`` (None: it accepts no such level)."""
    if i < len(flt.levels):
        return flt.levels[i]
    return STAR if flt.rest is not None else None


def _accepts_count(flt: Filter, n: int) -> bool:
    if flt.rest is None:
        return n == len(flt.levels)
    return n >= len(flt.levels) + flt.rest.min_levels


def _accepts_value(flt: Filter, i: int, value: str) -> bool:
    token = _token_at(flt, i)
    if token is None:
        return False
    if i == 0 and flt.excludes_system and value.startswith("$"):
        return False
    if token.__class__ is str:
        return token == value
    return token is STAR or value.startswith(token.prefix)  # type: ignore[union-attr]


def _cheapest(specific: Filter, i: int) -> int:
    """Bytes of the shortest value ``specific`` allows at level ``i``."""
    token = _token_at(specific, i)
    assert token is not None
    if token.__class__ is str:
        return _size(token) if _can_appear_in_topic(token) else _IMPOSSIBLE  # type: ignore[arg-type]
    prefix = "" if token is STAR else token.prefix  # type: ignore[union-attr]
    return max(_size(prefix), 1)  # `*` at level 0 takes a non-`$` value, `$*` takes `$`


def _cheapest_rejected(general: Filter, specific: Filter, i: int) -> int:
    """Bytes of the shortest value ``specific`` allows at ``i`` and ``general`` rejects."""
    token = _token_at(specific, i)
    assert token is not None
    if token.__class__ is str:
        if not _can_appear_in_topic(token) or _accepts_value(general, i, token):  # type: ignore[arg-type]
            return _IMPOSSIBLE
        return _size(token)  # type: ignore[arg-type]
    prefix = "" if token is STAR else token.prefix  # type: ignore[union-attr]
    # At level 0 `specific`'s `*` (or `>`/`#`) takes only non-`$` values and a `$`
    # prefix only `$` ones; `general`'s `*` (or `>`/`#`) there rejects every `$` value.
    other = _token_at(general, i)
    if other is None:
        return _IMPOSSIBLE  # handled as a level-count deviation
    if other is STAR:
        return _size(prefix) if i == 0 and prefix.startswith("$") else _IMPOSSIBLE
    if other.__class__ is str:
        if prefix:
            return _size(prefix) + (1 if prefix == other else 0)
        return 1  # some one-character level differs from any literal
    assert isinstance(other, Prefix)
    if prefix.startswith(other.prefix):
        return _IMPOSSIBLE
    return _size(prefix) if prefix else 1  # `prefix` itself, or a character != other[0]


def covers(general: Filter | str, specific: Filter | str) -> bool:
    """True exactly when every valid topic ``specific`` matches, ``general`` matches.

    Takes parsed filters (any mix of dialects) or native filter strings.
    """
    g = as_filter(general)
    s = as_filter(specific)
    if s.rest is None:
        counts = range(len(s.levels), len(s.levels) + 1)
    else:
        counts = range(max(len(s.levels) + s.rest.min_levels, 1), MAX_LEVELS + 1)
    base = -1  # bytes of the cheapest n-level topic: separators included
    best_extra = _IMPOSSIBLE
    filled = 0  # levels folded into base and best_extra so far
    # Past both filters' fixed levels every further level is the same (a wildcard level of
    # ``specific`` against ``general``'s rest, or against nothing): it adds the same bytes
    # and the same possible deviation, so a longer topic can only be a costlier one.
    settled = max(len(s.levels), len(g.levels))
    for n in counts:
        if n < 1:
            continue
        while filled < n:
            cheapest = _cheapest(s, filled)
            base += cheapest + 1
            best_extra = min(best_extra, _cheapest_rejected(g, s, filled) - cheapest)
            filled += 1
        if base > MAX_TOPIC_BYTES:
            return True  # no longer topic is valid: no counterexample exists
        if not _accepts_count(g, n):
            return False
        if base + best_extra <= MAX_TOPIC_BYTES:
            return False
        if filled > settled and g.rest is not None:
            return True  # every longer count is accepted, and dearer: no counterexample
    return True
