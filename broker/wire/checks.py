"""Field checks for frames: each takes a frame and a field name and raises if the value is bad.

Split from the frame classes so that each class's ``__post_init__`` reads as a list of what
its fields must be, and the rules (types, ranges, limits) are written once. Every check
raises ``LocalProtocolError`` (BAD_FRAME, or INVALID_TOPIC for a topic), naming the frame
type and the field; ``broker.wire.codec`` re-raises it as ``RemoteProtocolError`` when the
frame came from the peer. The limits the checks enforce are here too.
"""

from __future__ import annotations

import math
from typing import ClassVar, NoReturn, Protocol

import routing
from broker.errors import ErrorCode, LocalProtocolError

__all__ = [
    "MAX_BROKER_ID_BYTES",
    "MAX_MSG_ID_BYTES",
    "MAX_NESTING",
    "U64_MAX",
    "Checked",
    "check_bool",
    "check_broker_id",
    "check_broker_ids",
    "check_digest",
    "check_filter_list",
    "check_headers",
    "check_max_frame",
    "check_msg_id",
    "check_payload",
    "check_plain_map",
    "check_seconds",
    "check_str",
    "check_topic",
    "check_uint",
    "fail",
    "parse_filters",
    "plain_problem",
    "type_name",
    "valid_broker_id",
    "wrong_type",
]

#: The largest integer msgpack carries unsigned; ids and sequence numbers stay within it.
U64_MAX = (1 << 64) - 1
#: Publisher-assigned message ids are at most this many bytes of UTF-8.
MAX_MSG_ID_BYTES = 256
#: Nesting limit for free-form values (credentials, stats).
MAX_NESTING = 16
#: Broker ids (PEER_HELLO.broker_id, ROUTE.origin, FWD.dests, ...) are 1..this many bytes.
MAX_BROKER_ID_BYTES = 256


class Checked(Protocol):
    """What a check needs of a frame: its wire type, for the message (fields are read by
    name). A protocol rather than ``broker.wire.frames.Frame``, which imports this module."""

    TYPE: ClassVar[str]


def type_name(value: object) -> str:
    """How a value's type is named in error messages."""
    return "None" if value is None else type(value).__name__


def fail(frame: Checked, name: str, problem: str, ref: int | None) -> NoReturn:
    """Raise BAD_FRAME for field ``name``; ``ref`` is the refused request's id, if known."""
    raise LocalProtocolError(ErrorCode.BAD_FRAME, f"{frame.TYPE} field {name!r} {problem}", ref=ref)


def wrong_type(
    frame: Checked, name: str, expected: str, value: object, ref: int | None
) -> NoReturn:
    """``fail`` saying which type was expected and which came."""
    fail(frame, name, f"must be {expected}, got {type_name(value)}", ref)


def _encodable(text: str) -> bool:
    """Lone surrogates cannot be sent as UTF-8; most strings are ASCII and skip the encode."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_uint(
    frame: Checked, name: str, ref: int | None = None, *, optional: bool = False
) -> None:
    """An exact ``int`` in 0..2**64-1 (what msgpack carries unsigned); None if ``optional``."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not int:  # exact: bool (and int subclasses such as IntEnum) refused
        wrong_type(frame, name, "int or None" if optional else "int", value, ref)
    if not 0 <= value <= U64_MAX:
        fail(frame, name, f"must be in 0..2**64-1, got {value}", ref)


def check_bool(frame: Checked, name: str, ref: int | None = None) -> None:
    """An exact ``bool``: msgpack keeps true/false apart from 1/0, and so do we."""
    value = getattr(frame, name)
    if type(value) is not bool:
        wrong_type(frame, name, "bool", value, ref)


def check_str(frame: Checked, name: str, ref: int | None = None, *, optional: bool = False) -> None:
    """A ``str`` that can be sent as UTF-8; None if ``optional``."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if not isinstance(value, str):
        wrong_type(frame, name, "str or None" if optional else "str", value, ref)
    if not _encodable(value):
        fail(frame, name, "is not valid UTF-8 (lone surrogate)", ref)


def check_seconds(frame: Checked, name: str, *, optional: bool = False) -> None:
    """A duration in seconds: finite, >= 0; ints are accepted and stored as float."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not float and type(value) is not int:
        wrong_type(frame, name, "float or None" if optional else "float", value, None)
    if not (math.isfinite(value) and value >= 0):
        fail(frame, name, f"must be a finite number >= 0, got {value!r}", None)
    object.__setattr__(frame, name, float(value))


def check_headers(frame: Checked, name: str, ref: int | None = None) -> None:
    """None or a ``dict`` of ``str`` to ``str``."""
    value = getattr(frame, name)
    if value is None:
        return
    if type(value) is not dict:
        wrong_type(frame, name, "dict[str, str] or None", value, ref)
    for key, item in value.items():
        if not isinstance(key, str) or not _encodable(key):
            fail(frame, name, f"keys must be str, got {type_name(key)}", ref)
        if not isinstance(item, str) or not _encodable(item):
            fail(frame, name, f"values must be str, got {type_name(item)} for {key!r}", ref)


def plain_problem(value: object, depth: int) -> str | None:
    """Why ``value`` is not a plain msgpack value (one that round-trips unchanged), or None."""
    if value is None or type(value) in (bool, float, bytes):
        return None
    if type(value) is int:
        return None if -(1 << 63) <= value <= U64_MAX else f"integer {value} out of range"
    if type(value) is str:
        return None if _encodable(value) else "string with a lone surrogate"
    if depth >= MAX_NESTING:
        return f"nested deeper than {MAX_NESTING} levels"
    if type(value) is list:
        for item in value:
            if (problem := plain_problem(item, depth + 1)) is not None:
                return problem
        return None
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"map key of type {type_name(key)} (keys must be str)"
            if (problem := plain_problem(item, depth + 1)) is not None:
                return problem
        return None
    return f"value of type {type_name(value)}"


def check_plain_map(
    frame: Checked, name: str, ref: int | None = None, *, optional: bool = False
) -> None:
    """A ``dict`` of plain msgpack values (free-form: credentials, stats); None if ``optional``."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not dict:
        wrong_type(frame, name, "dict or None" if optional else "dict", value, ref)
    if (problem := plain_problem(value, 0)) is not None:
        fail(frame, name, f"holds a {problem}", ref)


def check_payload(frame: Checked, name: str, ref: int | None = None) -> None:
    """Exactly ``bytes`` (msgpack bin): payloads are opaque, never text."""
    value = getattr(frame, name)
    if type(value) is not bytes:  # bytearray/memoryview would not round-trip as equal
        wrong_type(frame, name, "bytes", value, ref)


def check_msg_id(
    frame: Checked, name: str, ref: int | None = None, *, optional: bool = False
) -> None:
    """A message id: ``str`` of at most MAX_MSG_ID_BYTES of UTF-8; None if ``optional``."""
    check_str(frame, name, ref, optional=optional)
    value = getattr(frame, name)
    if value is not None and len(value.encode("utf-8")) > MAX_MSG_ID_BYTES:
        fail(frame, name, f"must be at most {MAX_MSG_ID_BYTES} bytes of UTF-8", ref)


def check_topic(
    frame: Checked, name: str, ref: int | None = None, *, empty_levels: bool = False
) -> None:
    """A topic (DESIGN.md); a bad one is INVALID_TOPIC, refusing the request, not the stream.
    ``empty_levels``: a topic the broker delivers or forwards, which may have been published
    over MQTT, where levels may be empty (``/TopicA``); a native PUB may not name one."""
    check_str(frame, name, ref)
    try:
        routing.validate_topic(getattr(frame, name), empty_levels=empty_levels)
    except routing.TopicError as exc:
        raise LocalProtocolError(ErrorCode.INVALID_TOPIC, str(exc), ref=ref) from None


def check_max_frame(frame: Checked, name: str) -> None:
    """A frame size limit: what the 4-byte length prefix can say, and at least 1."""
    check_uint(frame, name)
    value = getattr(frame, name)
    if not 0 < value < 1 << 32:
        fail(frame, name, f"must be in 1..2**32-1, got {value}", None)


def valid_broker_id(text: object) -> bool:
    """Whether ``text`` is a broker id: 1..256 bytes of UTF-8, no whitespace or control
    characters (so that ids can be written in logs, lists and config files unquoted)."""
    if type(text) is not str:
        return False
    if text.isascii():  # printable ASCII is everything but controls; space is the only blank
        return 0 < len(text) <= MAX_BROKER_ID_BYTES and text.isprintable() and " " not in text
    if not _encodable(text):
        return False
    return 0 < len(text.encode("utf-8")) <= MAX_BROKER_ID_BYTES and all(
        char.isprintable() and not char.isspace() for char in text
    )


_BROKER_ID_RULE = (
    f"1..{MAX_BROKER_ID_BYTES} bytes of UTF-8 without whitespace or control characters"
)


def check_broker_id(frame: Checked, name: str) -> None:
    """One broker id (``valid_broker_id``)."""
    value = getattr(frame, name)
    if not isinstance(value, str):
        wrong_type(frame, name, "str", value, None)
    if not valid_broker_id(value):
        fail(frame, name, f"must be a broker id ({_BROKER_ID_RULE}), got {value!r:.80}", None)


def check_broker_ids(
    frame: Checked, name: str, *, optional: bool = False, required: bool = False
) -> None:
    """A list of distinct broker ids; ``required``: at least one."""
    value = getattr(frame, name)
    if value is None and optional:
        return
    if type(value) is not list:
        wrong_type(frame, name, "list or None" if optional else "list", value, None)
    if required and not value:
        fail(frame, name, "must not be empty", None)
    for item in value:
        if not valid_broker_id(item):
            fail(
                frame, name, f"items must be broker ids ({_BROKER_ID_RULE}), got {item!r:.80}", None
            )
    if len(set(value)) != len(value):
        fail(frame, name, "must not name a broker twice", None)


def check_digest(frame: Checked, name: str) -> None:
    """A map of origin broker id -> [incarnation, seq] (two uints)."""
    value = getattr(frame, name)
    if type(value) is not dict:
        wrong_type(frame, name, "dict", value, None)
    for origin, version in value.items():
        if not valid_broker_id(origin):
            fail(
                frame,
                name,
                f"keys must be broker ids ({_BROKER_ID_RULE}), got {origin!r:.80}",
                None,
            )
        if not (
            type(version) is list
            and len(version) == 2
            and all(type(n) is int and 0 <= n <= U64_MAX for n in version)
        ):
            fail(
                frame,
                name,
                f"values must be [incarnation, seq] (two uints), got {version!r:.80} "
                f"for {origin!r}",
                None,
            )


def check_filter_list(frame: Checked, name: str) -> None:
    """A list; its items are checked by ``parse_filters``, which parses them anyway."""
    value = getattr(frame, name)
    if type(value) is not list:
        wrong_type(frame, name, "list", value, None)


def parse_filters(frame: Checked, name: str) -> tuple[routing.Filter, ...]:
    """The filters of a list of ``[filter, dialect]`` pairs, each parsed (and so checked)."""
    parsed = []
    for pair in getattr(frame, name):
        if not (
            type(pair) is list
            and len(pair) == 2
            and type(pair[0]) is str
            and type(pair[1]) is str
            and _encodable(pair[0])
            and _encodable(pair[1])
        ):
            fail(
                frame, name, f"items must be [filter, dialect] pairs of str, got {pair!r:.80}", None
            )
        text, dialect = pair
        try:
            parsed.append(routing.parse_filter(text, dialect))
        except ValueError as exc:  # TopicError, or ValueError for an unknown dialect
            fail(
                frame, name, f"holds an invalid filter {text!r:.80} ({dialect!r:.20}): {exc}", None
            )
    return tuple(parsed)
