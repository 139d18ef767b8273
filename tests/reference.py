"""A deliberately simple reference matcher, independent of routing's own code.

Filters are translated to regular expressions straight from DESIGN.md, so the
trie, the cache and Filter.matches are all checked against a second reading
of the spec rather than against themselves.
"""

from __future__ import annotations

import re
from functools import cache

LEVEL = r"[^/]+"


def _level_regex(level: str, dialect: str) -> str:
    if dialect == "native":
        if level == "*":
            return LEVEL
        if level.endswith("*"):
            return re.escape(level[:-1]) + r"[^/]*"
        return re.escape(level)
    if level == "+":
        return LEVEL
    return re.escape(level)


@cache
def filter_regex(text: str, dialect: str) -> re.Pattern[str]:
    levels = text.split("/")
    tail = ""
    if dialect == "native" and levels[-1] == ">":
        levels = levels[:-1]
        tail = "one-or-more"
    elif dialect == "mqtt" and levels[-1] == "#":
        levels = levels[:-1]
        tail = "zero-or-more"
    body = "/".join(_level_regex(level, dialect) for level in levels)
    rest = f"{LEVEL}(?:/{LEVEL})*"
    if tail == "one-or-more":
        body = f"{body}/{rest}" if body else rest
    elif tail == "zero-or-more":
        body = f"{body}(?:/{rest})?" if body else rest
    return re.compile(body)


def first_level_hides_system(text: str, dialect: str) -> bool:
    """DESIGN.md's `$` rule: a first `*`, `>`, `+`, `#` or prefix not starting with `$`."""
    first = text.split("/")[0]
    if dialect == "native":
        return first in ("*", ">") or (first.endswith("*") and not first.startswith("$"))
    return first in ("+", "#")


def ref_matches(text: str, dialect: str, topic: str) -> bool:
    if topic.startswith("$") and first_level_hides_system(text, dialect):
        return False
    return filter_regex(text, dialect).fullmatch(topic) is not None
