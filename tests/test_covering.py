"""covers(general, specific): exact, checked against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import TopicError, covers, parse_filter
from routing.filters import Filter
from tests.reference import ref_matches


def f(text: str, dialect: str = "native") -> Filter:
    return parse_filter(text, dialect)


@pytest.mark.parametrize(
    ("general", "specific", "expected"),
    [
        (f("a/>"), f("a/b"), True),
        (f("a/>"), f("a/b/>"), True),
        (f("a/>"), f("a/*/c"), True),
        (f("a/>"), f("a/#", "mqtt"), False),  # a/# also matches "a"
        (f("a/#", "mqtt"), f("a/>"), True),
        (f("a/#", "mqtt"), f("a"), True),
        (f("a/*"), f("a/b*"), True),
        (f("a/b*"), f("a/bc*"), True),
        (f("a/bc*"), f("a/b*"), False),
        (f("a/b*"), f("a/b"), True),  # abc* matches abc
        (f("a/b"), f("a/b*"), False),
        (f("a/*"), f("a/+", "mqtt"), True),
        (f("a/+", "mqtt"), f("a/*"), True),
        (f(">"), f("#", "mqtt"), True),
        (f("#", "mqtt"), f(">"), True),
        (f("*/>"), f(">"), False),
        (f("a/b"), f("a/b"), True),
        (f("a/b"), f("a/b", "mqtt"), True),
        (f("a/b"), f("a/c"), False),
        # the $ rule
        (f(">"), f("$SYS/x"), False),
        (f("#", "mqtt"), f("$SYS/#", "mqtt"), False),
        (f("$SYS/>"), f("$SYS/x/y"), True),
        (f("*/x"), f("$a/x"), False),
        (f("$*/>"), f("$SYS/a"), True),  # a `$` prefix first level names system topics
        (f(">"), f("$SYS/a"), False),
        (f("$*/>"), f(">"), False),  # '>' matches no system topic, `$*/>` only those
        (f(">"), f("$*/>"), False),
        (f("*/>"), f("$*/>"), False),
        (f("#", "mqtt"), f("$*/#", "mqtt"), True),  # mqtt `$*` is a literal: matches nothing
        (f("$*"), f("$SYS*"), True),
        (f("$SYS*"), f("$*"), False),
        (f("$SYS*/>"), f("$SYS/>"), True),
        (f("$SYS/>"), f("$SYS*/>"), False),
        (f("$*"), f("*"), False),
        (f("*"), f("$*"), False),
        (f("$*"), f("$"), True),
        (f("$SYS*/>"), f("SYS/a"), False),
        (f("a*"), f("$a*"), False),
        # filters that match nothing are covered by anything
        (f("a"), f("b/*", "mqtt"), True),  # literal '*' never appears in topics
        (f("b/*", "mqtt"), f("a"), False),
    ],
)
def test_covers(general: Filter, specific: Filter, expected: bool) -> None:
    assert covers(general, specific) is expected


def test_native_strings_are_accepted() -> None:
    assert covers("beacon/eu/>", "beacon/eu/*/site42/>")
    assert not covers("beacon/eu/*/site42/>", "beacon/eu/>")


def test_invalid_filter_strings_raise() -> None:
    with pytest.raises(TopicError):
        covers("a/>/b", "a")


def test_byte_limit_is_part_of_the_answer() -> None:
    # "x"*248 + "/>" only matches two-level topics: a third level would need
    # 248 + 1 + 1 + 1 + 1 = 252 bytes, over the limit. So ".../*" covers it.
    long = "x" * 248
    assert covers(f"{long}/*", f"{long}/>")
    shorter = "x" * 246  # 246 + 4 = 250: three levels fit, so it is not covered
    assert not covers(f"{shorter}/*", f"{shorter}/>")


def test_byte_limit_bounds_how_many_levels_a_rest_wildcard_can_add() -> None:
    # 124 fixed one-byte levels plus '>' need 125+ levels: 249 bytes for 125,
    # 251 for 126. So only 125-level topics match and a 125-level filter covers it.
    stars = "/".join(["*"] * 123)
    assert covers(f"{stars}/*/*", f"{stars}/*/>")
    fewer = "/".join(["*"] * 122)  # here both 124 and 125 levels fit
    assert not covers(f"{fewer}/*/*", f"{fewer}/*/>")


# Brute force: every topic of up to 3 levels over a small alphabet. The
# alphabet holds a witness for every way a filter drawn below can fail:
# each prefix plus one character (`$a*` included), a character differing
# from each first character, and `$` levels.
TOPIC_LEVELS = ["a", "b", "$", "aa", "ab", "ba", "bb", "a$", "$a", "$b", "b$", "$$", "$aa", "$a$"]
TOPICS = ["/".join(t) for n in (1, 2, 3) for t in itertools.product(TOPIC_LEVELS, repeat=n)]
NATIVE = ["a", "b", "ab", "$a", "*", "a*", "b*", "$*", "$a*", ">"]
MQTT = ["a", "b", "ab", "$a", "+", "#", "*"]


@st.composite
def small_filters(draw: st.DrawFn) -> Filter:
    dialect = draw(st.sampled_from(["native", "mqtt"]))
    levels = draw(st.lists(st.sampled_from(NATIVE if dialect == "native" else MQTT), max_size=2))
    tail = draw(st.sampled_from([None, ">" if dialect == "native" else "#"]))
    if tail:
        levels = [*levels, tail]
    if not levels:
        levels = ["a"]
    try:
        return parse_filter("/".join(levels), dialect)
    except TopicError:
        return parse_filter("a")


def brute_covers(general: Filter, specific: Filter) -> bool:
    """covers() by its definition, over the reference matcher (the `$` rule included)."""
    return all(
        ref_matches(general.text, general.dialect, t)
        for t in TOPICS
        if ref_matches(specific.text, specific.dialect, t)
    )


@settings(max_examples=400, deadline=None)
@given(small_filters(), small_filters())
def test_covers_agrees_with_brute_force(general: Filter, specific: Filter) -> None:
    assert covers(general, specific) == brute_covers(general, specific)


@given(small_filters())
def test_every_filter_covers_itself(flt: Filter) -> None:
    assert covers(flt, flt)


@given(small_filters(), small_filters(), small_filters())
def test_covering_is_transitive(a: Filter, b: Filter, c: Filter) -> None:
    if covers(a, b) and covers(b, c):
        assert covers(a, c)
