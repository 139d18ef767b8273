"""A set of filters asked one question per message: does any of them match this topic?

Topic ACLs ask it for every publish (the client's allow and deny rules) and every delivery
to a client with deny-subscribe rules. Their sets are small (a handful of rules name a
client) and the topics of a real stream are many (tens of thousands of distinct ones), so
a per-topic answer cache mostly misses and each miss walked a trie in Python. A small set
is instead compiled into one regular expression, so a question is a single ``fullmatch``
in C, whatever the topic; a large set keeps a ``SubscriptionTable`` with its match cache,
whose cost does not grow with the number of filters.

The expression follows ``Filter.matches_levels`` exactly (a property test holds them
together): a literal level is itself, ``*`` any one level, ``abc*`` one level starting
with ``abc``, native ``>`` one or more further levels and MQTT ``#`` zero or more; levels
may be empty (MQTT topics may have them), and a filter whose first level is a wildcard
kept away from system topics does not match a topic starting with ``$``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from routing.filters import STAR, Filter
from routing.table import SubscriptionTable

#: Up to this many filters, a set is one regular expression; past it, a trie.
REGEX_MAX_FILTERS = 32

_LEVEL = "[^/]*"


def filter_pattern(flt: Filter) -> str:
    """The regular expression (for ``fullmatch``) of the topics ``flt`` matches."""
    parts = []
    for token in flt.levels:
        if token.__class__ is str:
            parts.append(re.escape(token))  # type: ignore[arg-type]
        elif token is STAR:
            parts.append(_LEVEL)
        else:
            parts.append(re.escape(token.prefix) + _LEVEL)  # type: ignore[union-attr]
    body = "/".join(parts)
    rest = flt.rest
    if rest is not None:
        if not parts:
            body = "(?s:.*)"  # every topic has at least one level
        elif rest.min_levels:
            body += "/(?s:.*)"  # '/' and anything: one or more levels, empty ones too
        else:
            body += "(?:/(?s:.*))?"
    if flt.excludes_system:
        body = r"(?!\$)" + body
    return body


class FilterSet:
    """Filters asked "does any match ``topic``?" (``matches``); immutable once made."""

    __slots__ = ("_regex", "_table", "filters")

    def __init__(self, filters: Iterable[Filter]) -> None:
        self.filters = tuple(dict.fromkeys(filters))
        self._regex: re.Pattern[str] | None = None
        self._table: SubscriptionTable | None = None
        if len(self.filters) <= REGEX_MAX_FILTERS:
            pattern = "|".join(f"(?:{filter_pattern(flt)})" for flt in self.filters)
            self._regex = re.compile(pattern) if self.filters else None
        else:
            self._table = SubscriptionTable()
            self._table.add_many([(flt, True) for flt in self.filters])

    def __len__(self) -> int:
        return len(self.filters)

    def __bool__(self) -> bool:
        return bool(self.filters)

    def matches(self, topic: str) -> bool:
        """Does one of the filters match ``topic`` (a valid topic)?"""
        regex = self._regex
        if regex is not None:
            return regex.fullmatch(topic) is not None
        table = self._table
        return table is not None and bool(table.match(topic))
