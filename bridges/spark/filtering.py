"""Dropping the rows no broker wants, two ways, for the Spark pipeline to choose from.

``filters_regex`` turns the wanted filters into one anchored Java regular expression, for
``rlike`` in the JVM: no Python per row, but a regex engine trying alternatives. The other
way keeps the rows' topics in Python: ``WantedTable`` is a ``routing.SubscriptionTable`` of
the filters, asked once per distinct topic in an Arrow batch, inside the sink. Both give
the same answer (tests/test_spark_filtering.py checks it against the broker's own matcher);
bench/spark_bridge.py measures which is faster for a given number of filters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from routing.filters import Filter
from routing.table import SubscriptionTable

LEVEL = "[^/]+"
NOTHING = "(?!)"  # matches no topic: nobody wants anything


def _literal(text: str) -> str:
    # re.escape only escapes ASCII punctuation and whitespace with a backslash, which Java
    # reads as the literal character too.
    return re.escape(text)


def _native(levels: Sequence[str]) -> str:
    parts: list[str] = []
    for index, level in enumerate(levels):
        last = index == len(levels) - 1
        if last and level == ">":
            # one or more levels: "a/>" is "a" followed by at least one "/level"
            tail = f"(?:/{LEVEL})+" if parts else f"{LEVEL}(?:/{LEVEL})*"
            return "/".join(parts) + tail
        if level == "*":
            parts.append(LEVEL)
        elif level.endswith("*"):
            parts.append(_literal(level[:-1]) + "[^/]*")
        else:
            parts.append(_literal(level))
    return "/".join(parts)


def _mqtt(levels: Sequence[str]) -> str:
    parts: list[str] = []
    for index, level in enumerate(levels):
        last = index == len(levels) - 1
        if last and level == "#":
            # zero or more levels: "a/#" matches "a" itself too
            tail = f"(?:/{LEVEL})*" if parts else f"{LEVEL}(?:/{LEVEL})*"
            return "/".join(parts) + tail
        parts.append(LEVEL if level == "+" else _literal(level))
    return "/".join(parts)


def filter_regex(flt: Filter) -> str:
    """One filter as an unanchored regex body (the pipeline never maps a system topic: a
    template cannot start with ``$`` and values encode a leading ``$``)."""
    levels = flt.text.split("/")
    return _native(levels) if flt.dialect == "native" else _mqtt(levels)


def filters_regex(filters: Iterable[Filter]) -> str:
    """All filters as one anchored alternation, for Spark's ``rlike``."""
    bodies = sorted({filter_regex(f) for f in filters})
    if not bodies:
        return NOTHING
    return "^(?:" + "|".join(bodies) + ")$"


class WantedTable:
    """The wanted filters as a subscription table; ``mask`` answers for a column of topics."""

    def __init__(self, filters: Iterable[Filter]) -> None:
        self.table = SubscriptionTable(cache_size=0)
        for flt in filters:
            self.table.add(flt.text, "wanted", flt.dialect)

    def mask(self, topics: Sequence[str | None]) -> list[bool]:
        match = self.table.match
        seen: dict[str, bool] = {}
        out = []
        for topic in topics:
            if topic is None:
                out.append(False)
                continue
            wanted = seen.get(topic)
            if wanted is None:
                wanted = seen[topic] = bool(match(topic))
            out.append(wanted)
        return out
