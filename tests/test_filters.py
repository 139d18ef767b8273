"""Filter syntax and semantics in both dialects."""

import contextlib
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing import MQTT, NATIVE, Filter, TopicError, parse_filter
from tests.reference import ref_matches

VALID_NATIVE = ["a", "a/b", "*", ">", "a/*", "a/>", "*/b/>", "abc*", "a/abc*/c", "a/+/#", "$SYS/>"]
INVALID_NATIVE = ["a*b", "*a", "**", "a/>/b", ">/a", "a>", ">a", "a/b>", "a//b", "", "/a", "a\x00"]
VALID_MQTT = ["a", "+", "#", "a/+", "a/#", "+/b/#", "a/*", "a/>", "a*b", "$SYS/#"]
INVALID_MQTT = ["a+", "+a", "a#", "#/a", "a/#/b", "a/b#", ""]


@pytest.mark.parametrize("text", VALID_NATIVE)
def test_valid_native_filters_parse(text: str) -> None:
    flt = parse_filter(text)
    assert (flt.text, flt.dialect) == (text, "native")


@pytest.mark.parametrize("text", INVALID_NATIVE)
def test_invalid_native_filters_raise_topic_error(text: str) -> None:
    with pytest.raises(TopicError):
        parse_filter(text)


@pytest.mark.parametrize("text", VALID_MQTT)
def test_valid_mqtt_filters_parse(text: str) -> None:
    assert parse_filter(text, "mqtt").dialect == "mqtt"


@pytest.mark.parametrize("text", INVALID_MQTT)
def test_invalid_mqtt_filters_raise_topic_error(text: str) -> None:
    with pytest.raises(TopicError):
        parse_filter(text, "mqtt")


def test_unknown_dialect_is_a_value_error_not_a_topic_error() -> None:
    with pytest.raises(ValueError, match="dialect") as info:
        parse_filter("a/b", "amqp")
    assert not isinstance(info.value, TopicError)


def test_filters_share_the_topic_size_limits() -> None:
    parse_filter("x" * 250)
    with pytest.raises(TopicError, match="251 bytes"):
        parse_filter("x" * 251)
    with pytest.raises(TopicError, match="251 bytes"):
        parse_filter("x" * 249 + "/#", "mqtt")


def test_error_message_names_the_offending_level() -> None:
    with pytest.raises(TopicError, match=r"level 2 \('b>'\)"):
        parse_filter("a/b>")


def test_same_text_in_two_dialects_is_two_different_filters() -> None:
    assert parse_filter("a/b") != parse_filter("a/b", "mqtt")
    assert parse_filter("a/b") == parse_filter("a/b")
    assert len({parse_filter("a/b"), parse_filter("a/b"), parse_filter("a/b", "mqtt")}) == 2


CASES = [
    # (filter, dialect, topic, matches)
    ("a/*/c", "native", "a/b/c", True),
    ("a/*/c", "native", "a/b/b/c", False),
    ("a/*", "native", "a", False),
    ("a/>", "native", "a", False),
    ("a/>", "native", "a/b", True),
    ("a/>", "native", "a/b/c/d", True),
    (">", "native", "a", True),
    ("abc*", "native", "abc", True),
    ("abc*", "native", "abcd", True),
    ("abc*", "native", "ab", False),
    ("a/b*/c", "native", "a/bcd/c", True),
    ("a/+", "native", "a/b", False),  # '+' is a literal in the native dialect
    ("a/+", "native", "a/+", True),
    ("a/#", "native", "a/#", True),
    ("a/#", "mqtt", "a", True),  # '#' matches the parent level
    ("a/#", "mqtt", "a/b/c", True),
    ("#", "mqtt", "a/b", True),
    ("a/+/c", "mqtt", "a/b/c", True),
    ("a/+", "mqtt", "a", False),
    ("a/*", "mqtt", "a/b", False),  # '*' is ordinary in mqtt, topics never hold it
    ("a/b>", "mqtt", "a/b", False),
    ("A/b", "native", "a/b", False),  # case sensitive
    # the $ rule
    ("*/x", "native", "$SYS/x", False),
    (">", "native", "$SYS/x", False),
    ("$*", "native", "$SYS", True),  # a `$` prefix first level names system topics
    ("$*", "native", "$", True),
    ("$*", "native", "$SYS/x", False),  # one level only
    ("$*", "native", "SYS", False),
    ("$SYS*/>", "native", "$SYS/broker/load", True),
    ("$SYS*/>", "native", "$SYSX/a", True),
    ("$SYS*/>", "native", "SYS/a", False),
    ("$SYS*/>", "native", "$SYS", False),  # '>' needs one more level
    ("*/>", "native", "$SYS/a", False),
    ("a*", "native", "$a", False),
    ("$*/#", "mqtt", "$SYS/a", False),  # '*' is ordinary in mqtt: no `$` prefix there
    ("$SYS/>", "native", "$SYS/x", True),
    ("$SYS/*", "native", "$SYS/x", True),
    ("#", "mqtt", "$SYS/x", False),
    ("+/x", "mqtt", "$SYS/x", False),
    ("$SYS/#", "mqtt", "$SYS", True),
    ("a/*", "native", "a/$x", True),  # only the first level makes a system topic
]


@pytest.mark.parametrize(("text", "dialect", "topic", "expected"), CASES)
def test_filter_semantics(text: str, dialect: str, topic: str, expected: bool) -> None:
    assert parse_filter(text, dialect).matches(topic) is expected
    assert ref_matches(text, dialect, topic) is expected


def test_a_dollar_prefix_first_level_matches_one_level_system_topics() -> None:
    assert parse_filter("$*").matches("$x")


def test_a_dollar_prefix_first_level_then_rest_matches_system_topics_below() -> None:
    assert parse_filter("$SYS*/>").matches("$SYS/broker/load")


def test_a_wildcard_first_level_still_hides_system_topics() -> None:
    assert not parse_filter("*/>").matches("$SYS/a")


@pytest.mark.parametrize(
    ("text", "dialect", "hides"),
    [
        ("*/a", "native", True),
        (">", "native", True),
        ("ab*/c", "native", True),
        ("+/a", "mqtt", True),
        ("#", "mqtt", True),
        ("$*", "native", False),
        ("$SYS*/>", "native", False),
        ("$SYS/>", "native", False),
        ("a/>", "native", False),
    ],
)
def test_excludes_system_follows_the_dollar_rule(text: str, dialect: str, hides: bool) -> None:
    assert parse_filter(text, dialect).excludes_system is hides


def test_matching_an_invalid_topic_raises() -> None:
    with pytest.raises(TopicError):
        parse_filter("a/>").matches("a/*")


@pytest.mark.parametrize(
    ("text", "topic"), [("/#", "/TopicA"), ("/+", "/TopicA"), ("a//b", "a//b"), ("+/+", "/")]
)
def test_mqtt_filters_and_topics_may_have_empty_levels_as_mqtt_allows(
    text: str, topic: str
) -> None:
    assert parse_filter(text, "mqtt").matches(topic)


def test_native_filters_may_not_have_empty_levels() -> None:
    with pytest.raises(TopicError, match="empty level"):
        parse_filter("a//b")


def test_only_parse_filter_returns_filters() -> None:
    assert isinstance(parse_filter("a"), Filter)


LEVELS = st.sampled_from(["a", "b", "ab", "$", "$a", "$ab", "+", "#"])
FILTER_LEVELS = st.sampled_from(["a", "b", "ab", "$a", "*", "a*", "$*", "$a*", ">", "+", "#"])


@given(
    st.lists(FILTER_LEVELS, min_size=1, max_size=4),
    st.sampled_from(["native", "mqtt"]),
    st.lists(LEVELS, min_size=1, max_size=4),
)
def test_filter_matches_agrees_with_the_reference(
    flevels: list[str], dialect: str, tlevels: list[str]
) -> None:
    text, topic = "/".join(flevels), "/".join(tlevels)
    try:
        flt = parse_filter(text, dialect)
    except TopicError:
        return
    assert flt.matches(topic) == ref_matches(text, dialect, topic)


@given(st.text(max_size=30), st.sampled_from(["native", "mqtt"]))
def test_parsing_any_text_either_succeeds_or_raises_topic_error(text: str, dialect: str) -> None:
    with contextlib.suppress(TopicError):
        parse_filter(text, dialect)


def test_dialect_is_the_module_constant_whatever_string_was_given() -> None:
    """A broker holds one Filter per distinct filter: a dialect decoded from the wire must
    not cost a string of its own in each."""
    native = "".join(["nat", "ive"])
    mqtt = "".join(["mq", "tt"])
    assert parse_filter("a/b", native).dialect is NATIVE
    assert parse_filter("a/+", mqtt).dialect is MQTT


def test_filters_of_the_same_text_in_two_dialects_hash_alike_but_differ() -> None:
    native, mqtt = parse_filter("a/b"), parse_filter("a/b", MQTT)
    assert native != mqtt
    assert len({native, mqtt, parse_filter("a/b")}) == 2
    assert pickle.loads(pickle.dumps(mqtt)) == mqtt
    assert hash(pickle.loads(pickle.dumps(mqtt))) == hash(mqtt)
