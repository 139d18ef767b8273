"""Filter syntax in two dialects, parsed into one token model.

Native (Solace style): ``*`` as a whole level matches one level; ``abc*``
(star only as the last character) matches one level starting with ``abc``,
``abc`` included; ``>`` as the last level matches one or more levels.

MQTT (opt-in): ``+`` is one level; ``#`` as the last level matches zero or
more levels, so ``a/#`` matches ``a``. As in MQTT, a level may be empty (``/#``,
``a//b``). ``*`` and ``>`` are ordinary characters there; since topics never
contain them, a level holding them can never match.

The ``$`` rule: a first level ``*``, ``+``, ``>``, ``#`` or prefix not
starting with ``$`` never matches a system topic (``$SYS/...``); a first
level prefix that starts with ``$`` (``$*``, ``$SYS*``) names them and does.

Both dialects compile to the same tokens (a literal ``str``, ``STAR``,
``Prefix``) plus an optional trailing ``Rest``, so the trie, the cache and
the covering check handle one model. A native and an MQTT filter with the
same text are still different filters: equality is (text, dialect).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from sys import intern
from typing import Final

from routing.errors import TopicError
from routing.topics import MAX_TOPIC_BYTES, SEPARATOR, check_common, split_topic

NATIVE: Final = "native"
MQTT: Final = "mqtt"
DIALECTS: Final = (NATIVE, MQTT)


class _Star:
    """Matches exactly one level, whatever it holds."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "STAR"

    def __reduce__(self) -> str:
        return "STAR"


STAR: Final = _Star()


@dataclass(frozen=True, slots=True)
class Prefix:
    """Matches one level that starts with ``prefix`` (``prefix`` itself included)."""

    prefix: str


@dataclass(frozen=True, slots=True)
class Rest:
    """Matches the remaining levels, at least ``min_levels`` of them."""

    min_levels: int


REST_ONE: Final = Rest(1)  # native '>'
REST_ANY: Final = Rest(0)  # mqtt '#'

Token = str | _Star | Prefix


class Filter:
    """A parsed, valid filter. Build one with :func:`parse_filter`.

    A broker holds one per distinct filter (50,000 and more), so it keeps only what it
    needs: four slots and no stored hash (the text caches its own, and the rare native
    and MQTT filters of the same text only collide, they stay unequal). ``dialect`` is
    always the module's ``NATIVE`` or ``MQTT`` string, never a copy decoded from the
    wire, which would cost ~55 bytes a filter.
    """

    __slots__ = ("dialect", "levels", "rest", "text")

    text: str
    dialect: str
    levels: tuple[Token, ...]
    rest: Rest | None

    def __init__(self, text: str, dialect: str, levels: tuple[Token, ...], rest: Rest | None):
        self.text = text
        self.dialect = NATIVE if dialect == NATIVE else MQTT if dialect == MQTT else dialect
        self.levels = levels
        self.rest = rest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Filter):
            return NotImplemented
        return self.text == other.text and self.dialect == other.dialect

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Filter({self.text!r}, dialect={self.dialect!r})"

    @property
    def key(self) -> tuple[Token | Rest, ...]:
        """The token path: equal for filters that match the same topics by shape."""
        return (*self.levels, self.rest) if self.rest is not None else self.levels

    @property
    def excludes_system(self) -> bool:
        """True when ``$`` topics are kept away: a first ``*``, ``>``, ``#`` or non-``$`` prefix."""
        if not self.levels:
            return True
        first = self.levels[0]
        return first.__class__ is not str and (first is STAR or first.prefix[:1] != "$")  # type: ignore[union-attr]

    @property
    def is_literal(self) -> bool:
        """True when the filter has no wildcard at all."""
        return self.rest is None and all(t.__class__ is str for t in self.levels)

    def matches(self, topic: str) -> bool:
        """Does this filter match ``topic``? Raises TopicError for an invalid topic."""
        return self.matches_levels(split_topic(topic))

    def matches_levels(self, levels: Sequence[str]) -> bool:
        """Match already-validated topic levels; a linear walk, no trie."""
        fixed = self.levels
        if self.rest is None:
            if len(levels) != len(fixed):
                return False
        elif len(levels) < len(fixed) + self.rest.min_levels:
            return False
        if levels[0].startswith("$") and self.excludes_system:
            return False
        for token, level in zip(fixed, levels, strict=False):
            if token.__class__ is str:
                if token != level:
                    return False
            elif token is not STAR and not level.startswith(token.prefix):  # type: ignore[union-attr]
                return False
        return True


def _native_level(text: str, i: int, level: str) -> Token:
    """A native level holding '*' or '>' (the caller handles a trailing '>')."""
    if level == "*":
        return STAR
    if ">" not in level and level.index("*") == len(level) - 1:
        return Prefix(intern(level[:-1]))
    where = f"at level {i + 1} ({level!r})"  # only for the messages
    if level == ">":
        raise TopicError(f"filter {text!r}: '>' must be the last level, found {where}")
    if ">" in level:
        raise TopicError(f"filter {text!r}: '>' must be a whole level, found {where}")
    raise TopicError(
        f"filter {text!r}: '*' must be a whole level or the last character of one, found {where}"
    )


def _parse_native(text: str, levels: list[str]) -> tuple[tuple[Token, ...], Rest | None]:
    rest = None
    if levels[-1] == ">":
        rest = REST_ONE
        levels = levels[:-1]
        if "*" not in text and ">" not in text[:-1]:  # the common shape: literals then '>'
            return tuple(map(intern, levels)), rest
    elif "*" not in text and ">" not in text:
        return tuple(map(intern, levels)), None
    tokens: list[Token] = []
    for i, level in enumerate(levels):
        if level == "*":
            tokens.append(STAR)
        elif "*" in level or ">" in level:
            tokens.append(_native_level(text, i, level))
        else:
            tokens.append(intern(level))
    return tuple(tokens), rest


def _parse_mqtt(text: str, levels: list[str]) -> tuple[tuple[Token, ...], Rest | None]:
    rest = None
    if levels[-1] == "#":
        rest = REST_ANY
        levels = levels[:-1]
    if "+" not in text and "#" not in text[:-1] if rest else "+" not in text and "#" not in text:
        return tuple(map(intern, levels)), rest
    tokens: list[Token] = []
    for i, level in enumerate(levels):
        if level == "+":
            tokens.append(STAR)
        elif "#" in level or "+" in level:
            where = f"at level {i + 1} ({level!r})"
            if level == "#":
                raise TopicError(f"filter {text!r}: '#' must be the last level, found {where}")
            raise TopicError(
                f"filter {text!r}: '+' and '#' must be a whole level in the mqtt dialect, "
                f"found {where}"
            )
        else:
            tokens.append(intern(level))
    return tuple(tokens), rest


def parse_filter(text: str, dialect: str = NATIVE) -> Filter:
    """Parse and validate a filter; raises TopicError (or ValueError for the dialect)."""
    if dialect == NATIVE:
        parse = _parse_native
    elif dialect == MQTT:
        parse = _parse_mqtt
    else:
        raise ValueError(f"unknown filter dialect {dialect!r}; expected 'native' or 'mqtt'")
    if (
        text.__class__ is str
        and text.isascii()
        and 0 < len(text) <= MAX_TOPIC_BYTES
        and "\x00" not in text
    ):  # the common shape, checked inline (a broker parses every SUB)
        levels = text.split(SEPARATOR)
        if "" in levels and dialect == NATIVE:  # (ASCII within 250 bytes: <= 125 levels)
            levels = check_common(text, "filter")  # raises, naming the empty level
    else:
        levels = check_common(text, "filter", empty_levels=dialect == MQTT)
    tokens, rest = parse(text, levels)
    return Filter(text, dialect, tokens, rest)


def as_filter(value: Filter | str) -> Filter:
    """Accept a parsed filter or a native filter string."""
    if isinstance(value, Filter):
        return value
    return parse_filter(value, NATIVE)
