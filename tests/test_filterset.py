"""routing.filterset: a set of filters as one regular expression (or a trie past
REGEX_MAX_FILTERS) answers exactly what ``Filter.matches`` answers, filter by filter."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing import parse_filter
from routing.filters import MQTT, NATIVE, Filter
from routing.filterset import REGEX_MAX_FILTERS, FilterSet

# A small alphabet where every kind of level meets every other: prefixes, `$`, empty levels
# (MQTT topics may have them), and characters a regular expression would take as syntax.
TOPIC_LEVELS = ["a", "ab", "b", "$s", "$", "", "a.b", "(", "\n"]
NATIVE_LEVELS = ["a", "ab", "b", "$s", "*", "a*", "$*", "a.b", "("]
MQTT_LEVELS = ["a", "ab", "b", "$s", "+", "", "a.b", "("]

topics = st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> Filter:
    if draw(st.booleans()):
        levels = draw(st.lists(st.sampled_from(NATIVE_LEVELS), min_size=0, max_size=3))
        if not levels or draw(st.booleans()):
            levels.append(">")
        return parse_filter("/".join(levels), NATIVE)
    levels = draw(st.lists(st.sampled_from(MQTT_LEVELS), min_size=0, max_size=3))
    if levels == [""] or not levels or draw(st.booleans()):  # ("" alone is no filter)
        levels.append("#")
    return parse_filter("/".join(levels), MQTT)


@settings(max_examples=400)
@given(st.lists(filters(), max_size=6), st.lists(topics, min_size=1, max_size=20))
def test_a_small_set_matches_a_topic_exactly_when_one_of_its_filters_does(
    chosen: list[Filter], candidates: list[str]
) -> None:
    matcher = FilterSet(chosen)
    for topic in candidates:
        assert matcher.matches(topic) == any(flt.matches_levels(topic.split("/")) for flt in chosen)


@settings(max_examples=30)
@given(
    st.lists(filters(), min_size=REGEX_MAX_FILTERS + 1, max_size=REGEX_MAX_FILTERS + 8),
    st.lists(topics, min_size=1, max_size=20),
)
def test_a_large_set_answers_the_same_through_its_trie(
    chosen: list[Filter], candidates: list[str]
) -> None:
    matcher = FilterSet(chosen)
    for topic in candidates:
        assert matcher.matches(topic) == any(flt.matches_levels(topic.split("/")) for flt in chosen)


def test_an_empty_set_matches_nothing() -> None:
    assert not FilterSet([]).matches("a/b")


def test_system_topics_need_a_filter_that_names_them() -> None:
    hidden = FilterSet([parse_filter(">"), parse_filter("#", MQTT), parse_filter("+/x", MQTT)])
    named = FilterSet([parse_filter("$SYS/>"), parse_filter("$*")])
    assert not hidden.matches("$SYS/x")
    assert named.matches("$SYS/x") and named.matches("$other")
    assert hidden.matches("sys/x")
