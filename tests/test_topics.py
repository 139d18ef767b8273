"""Topic syntax, exactly as DESIGN.md states it."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing import TopicError, is_system_topic, validate_topic


@pytest.mark.parametrize(
    "topic",
    [
        "a",
        "beacon/eu/de/site42/checkout/purchase",
        "$SYS/broker/load",
        "a/+/#",  # mqtt wildcard characters are ordinary in topics
        "caf\u00e9/\u65e5\u672c",
        "x" * 250,
        "/".join(["a"] * 125),
    ],
)
def test_valid_topics_are_accepted(topic: str) -> None:
    validate_topic(topic)


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("", "empty"),
        ("a//b", "empty level at level 2"),
        ("/a", "empty level at level 1"),
        ("a/", "empty level at level 2"),
        ("a/*", "'*'"),
        ("a*", "'*'"),
        ("a/>", "'>'"),
        ("a>b", "'>'"),
        ("a\x00b", "NUL"),
        ("x" * 251, "251 bytes"),
        ("\u00e9" * 126, "252 bytes"),  # 126 characters, 2 bytes each
        ("\ud800", "UTF-8"),
    ],
)
def test_invalid_topics_raise_topic_error_saying_what_is_wrong(topic: str, says: str) -> None:
    with pytest.raises(TopicError, match=says.replace("*", r"\*").replace("(", r"\(")):
        validate_topic(topic)


def test_topic_error_is_a_value_error() -> None:
    assert issubclass(TopicError, ValueError)


@pytest.mark.parametrize("not_a_string", [None, 42, b"a/b", ["a"]])
def test_non_string_topics_raise_topic_error(not_a_string: object) -> None:
    with pytest.raises(TopicError, match="must be a str"):
        validate_topic(not_a_string)  # type: ignore[arg-type]


def test_the_byte_limit_binds_before_the_level_limit() -> None:
    # n levels need at least 2n - 1 bytes, so 126 levels already break the
    # 250-byte limit and the 128-level limit can never be the one that fires.
    validate_topic("/".join(["a"] * 125))
    with pytest.raises(TopicError, match="251 bytes"):
        validate_topic("/".join(["a"] * 126))


def test_system_topics_start_with_a_dollar() -> None:
    assert is_system_topic("$SYS/x")
    assert not is_system_topic("a/$SYS")


@given(
    st.lists(
        st.text(
            alphabet=st.characters(blacklist_characters="/*>\x00", blacklist_categories=["Cs"]),
            min_size=1,
            max_size=8,
        ),
        min_size=1,
        max_size=10,
    )
)
def test_any_short_topic_of_valid_levels_is_accepted(levels: list[str]) -> None:
    validate_topic("/".join(levels))


@given(st.text(max_size=40))
def test_validation_either_accepts_or_raises_topic_error(text: str) -> None:
    try:
        validate_topic(text)
    except TopicError:
        return
    assert text and "*" not in text and ">" not in text and "\x00" not in text
    assert "" not in text.split("/")
