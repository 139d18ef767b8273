"""Topic syntax: what a publisher may name.

A topic is UTF-8, 1..250 bytes, at most 128 levels separated by ``/``, with
no empty level, no NUL and no ``*`` or ``>`` anywhere. MQTT allows empty levels
(``/TopicA``, ``a//b``), and its clients use them, so a topic published over MQTT may have
them (``validate_topic(..., empty_levels=True)``) and matching accepts them: one namespace
for every front end, in which a native PUB still may not name such a topic. A topic whose first
level starts with ``$`` is a system topic, which wildcard-first filters do
not match unless the wildcard is a ``$`` prefix (``$*``, ``$SYS*``).
``split_topic`` is on the hot path of every match, so it checks with C-level
string methods and only builds a detailed message on failure.
"""

from __future__ import annotations

from routing.errors import TopicError

MAX_TOPIC_BYTES = 250
MAX_LEVELS = 128
SEPARATOR = "/"


def _byte_length(text: str, what: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise _error(what, text, f"is not valid UTF-8 (character {exc.start})") from None


def _error(what: str, text: str, problem: str) -> TopicError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return TopicError(f"{what} {shown!r} {problem}")


def check_common(text: object, what: str, empty_levels: bool = False) -> list[str]:
    """Checks shared by topics and filters; returns the levels."""
    if not isinstance(text, str):
        raise TopicError(f"{what} must be a str, not {type(text).__name__}")
    if not text:
        raise TopicError(f"{what} is empty")
    size = _byte_length(text, what)
    if size > MAX_TOPIC_BYTES:
        raise _error(what, text, f"is {size} bytes in UTF-8; the limit is {MAX_TOPIC_BYTES}")
    if "\x00" in text:
        raise _error(what, text, f"contains NUL at character {text.index(chr(0))}")
    levels = text.split(SEPARATOR)
    if len(levels) > MAX_LEVELS:
        raise _error(what, text, f"has {len(levels)} levels; the limit is {MAX_LEVELS}")
    if not empty_levels and "" in levels:
        raise _error(what, text, f"has an empty level at level {levels.index('') + 1}")
    return levels


def split_topic(topic: object) -> list[str]:
    """Validate ``topic`` (as matching sees it: empty levels allowed) and return its levels."""
    if (
        topic.__class__ is str
        and topic.isascii()  # type: ignore[attr-defined]
        and 0 < len(topic) <= MAX_TOPIC_BYTES  # type: ignore[arg-type]
        and "\x00" not in topic  # type: ignore[operator]
        and "*" not in topic  # type: ignore[operator]
        and ">" not in topic  # type: ignore[operator]
    ):
        return topic.split(SEPARATOR)  # type: ignore[attr-defined]  (<= 125 levels)
    return _split_topic_checked(topic, empty_levels=True)


def _split_topic_checked(topic: object, empty_levels: bool = False) -> list[str]:
    """The slow path: every check, with a message naming the first problem."""
    levels = check_common(topic, "topic", empty_levels)
    assert isinstance(topic, str)
    for ch in "*>":
        if ch in topic:
            raise _error(
                "topic",
                topic,
                f"contains {ch!r} at character {topic.index(ch)}: "
                "wildcards are only allowed in filters",
            )
    return levels


def validate_topic(topic: str, *, empty_levels: bool = False) -> None:
    """Raise TopicError unless ``topic`` is a valid topic name (``empty_levels``: as MQTT
    allows them).

    The broker validates every PUB; the common shape is checked with C-level string
    methods and no split (no empty level means no ``//`` and no ``/`` at either end).
    """
    if (
        topic.__class__ is str
        and topic.isascii()
        and 0 < len(topic) <= MAX_TOPIC_BYTES
        and "\x00" not in topic
        and "*" not in topic
        and ">" not in topic
        and (
            empty_levels or ("//" not in topic and topic[0] != SEPARATOR and topic[-1] != SEPARATOR)
        )
    ):  # ASCII within 250 bytes also means <= 125 levels
        return
    _split_topic_checked(topic, empty_levels)


def is_system_topic(topic: str) -> bool:
    """System topics (``$SYS/...``): only literal or ``$``-prefix first levels match them."""
    return topic.startswith("$")
