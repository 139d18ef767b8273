"""The two ways the Spark pipeline drops unwanted rows agree with the broker's matcher.

No Spark here: the regex is checked with Python's engine (the constructs used, character
classes, non-capturing groups and quantifiers, mean the same in Java's).
"""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from bridges.spark.filtering import NOTHING, WantedTable, filter_regex, filters_regex
from routing import TopicError, parse_filter

TOPIC_LEVELS = st.sampled_from(["a", "b", "ab", "a.b", "a+b", "x(1)", "%2F", "é"])
DIALECTS = st.sampled_from(["native", "mqtt"])
FILTER_LEVELS = st.sampled_from(["a", "b", "ab", "a.b", "x(1)", "*", "a*", ">", "+", "#", "é"])
TOPICS = st.lists(TOPIC_LEVELS, min_size=1, max_size=5).map("/".join)


def parsed(levels: list[str], dialect: str):
    try:
        return parse_filter("/".join(levels), dialect)
    except TopicError:
        return None


@given(st.lists(FILTER_LEVELS, min_size=1, max_size=4), DIALECTS, TOPICS)
def test_a_filters_regex_matches_exactly_the_topics_the_filter_matches(
    flevels: list[str], dialect: str, topic: str
) -> None:
    flt = parsed(flevels, dialect)
    if flt is None:
        return
    assert bool(re.fullmatch(filter_regex(flt), topic)) == flt.matches(topic)


@given(
    st.lists(
        st.tuples(st.lists(FILTER_LEVELS, min_size=1, max_size=4), DIALECTS),
        max_size=6,
    ),
    st.lists(TOPICS, max_size=20),
)
def test_the_regex_and_the_table_agree_with_any_filter_matching(filter_specs, topics) -> None:
    filters = [f for f in (parsed(levels, d) for levels, d in filter_specs) if f is not None]
    expected = [any(f.matches(t) for f in filters) for t in topics]
    pattern = re.compile(filters_regex(filters))
    assert [bool(pattern.search(t)) for t in topics] == expected
    assert WantedTable(filters).mask(topics) == expected


def test_no_filters_want_nothing() -> None:
    assert filters_regex([]) == NOTHING
    assert not re.search(NOTHING, "a/b")
    assert WantedTable([]).mask(["a/b", None]) == [False, False]


def test_a_missing_topic_is_never_wanted() -> None:
    assert WantedTable([parse_filter(">")]).mask([None, "a"]) == [False, True]
