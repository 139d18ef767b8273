"""Kafka record -> broker topic: decoders and topic templates. Pure logic, no I/O.

The bridge decodes each record value into a dict (:data:`DECODERS`) and
derives a topic from a template such as
``beacon/{region}/{country}/{site}/{section}/{event}``. Values come from
whoever produces to Kafka, so they are untrusted: each one is turned into
text by a fixed rule and percent-encoded (:func:`encode_level`) so that it
can never add a level, a wildcard or a system-topic prefix, and so that
distinct values stay distinct. A template is checked once, at compile time
(:class:`TemplateError`); a record that cannot be mapped raises
:class:`MappingError` with a short stable ``reason`` that the bridge counts
and sends to the dead-letter topic. docs/bridge.md ("Topic mapping") is the
user-facing description and is kept true.

The bridge maps tens of thousands of records per second in Python, so
:meth:`TopicTemplate.topic` works from precomputed parts and handles the
common case (a plain ``str`` that needs no escaping) with one C-level regex
search per placeholder.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgpack

from routing.errors import TopicError
from routing.topics import MAX_LEVELS, MAX_TOPIC_BYTES, SEPARATOR, validate_topic

__all__ = [
    "DECODERS",
    "REASONS",
    "DecodeError",
    "MappingError",
    "TemplateError",
    "TopicTemplate",
    "decode_json",
    "decode_level",
    "decode_msgpack",
    "encode_level",
]

MISSING_FIELD: Final = "missing_field"
NOT_SCALAR: Final = "not_scalar"
TOPIC_TOO_LONG: Final = "topic_too_long"
TOO_MANY_LEVELS: Final = "too_many_levels"
BAD_VALUE: Final = "bad_value"
REASONS: Final = (MISSING_FIELD, NOT_SCALAR, TOPIC_TOO_LONG, TOO_MANY_LEVELS, BAD_VALUE)


class TemplateError(ValueError):
    """A template that can never yield a valid topic; the message says what and where."""


class MappingError(ValueError):
    """A record that cannot be mapped to a topic.

    ``reason`` is one of :data:`REASONS`, stable so that the bridge can count
    dead letters per reason; ``field`` is the field path at fault, if any;
    ``str(exc)`` is the human message.
    """

    reason: str
    field: str | None

    def __init__(self, reason: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the exception picklable (PySpark ships errors between processes).
        return (type(self), (self.reason, str(self), self.field))


class DecodeError(ValueError):
    """A record value that does not decode, or is not an object/map at top level."""


# --- decoders -----------------------------------------------------------------


def _as_bytes(value: object) -> bytes:
    """Kafka tombstones have no value; bytes, bytearray and memoryview are accepted."""
    if value.__class__ is bytes:
        return value  # type: ignore[return-value]
    if value is None:
        raise DecodeError("record has no value (tombstone)")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise DecodeError(f"record value is {_kind(value)}, not bytes")


def _top_level(obj: object, what: str) -> dict[str, Any]:
    """Templates look fields up by name, so only an object/map can be mapped."""
    if obj.__class__ is dict:
        return obj  # type: ignore[return-value]
    raise DecodeError(f"top level is {_kind(obj)}, not {what}")


def decode_json(value: bytes) -> dict[str, Any]:
    """Decode a JSON object; anything else raises DecodeError.

    The bytes must be UTF-8 (RFC 8259); ``json.loads`` would otherwise guess
    UTF-16/32. Errors from too deep nesting or oversized integers are the
    record's fault too, so they become DecodeError as well.
    """
    data = _as_bytes(value)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"value is not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DecodeError(f"value is not JSON: {exc.msg} at character {exc.pos}") from None
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"value is not usable JSON: {exc}") from None
    return _top_level(obj, "a JSON object")


def decode_msgpack(value: bytes) -> dict[str, Any]:
    """Decode a msgpack map; anything else raises DecodeError.

    ``raw=False`` gives str for msgpack strings (invalid UTF-8 is an error);
    ``strict_map_key=True`` (msgpack's default, kept on purpose) allows only
    str and bytes map keys, which rules out hash-flooding with integer keys
    and unhashable keys. Templates only reach str keys.
    """
    data = _as_bytes(value)
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # ExtraData, FormatError, StackError, ValueError, TypeError...
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise DecodeError(f"value is not msgpack: {detail}") from None
    return _top_level(obj, "a msgpack map")


DECODERS: Final[dict[str, Callable[[bytes], dict[str, Any]]]] = {
    "json": decode_json,
    "msgpack": decode_msgpack,
}


# --- the value rule -------------------------------------------------------------

# Characters escaped anywhere in a value: '%' (so escaping is reversible), the
# level separator, native and MQTT wildcards, C0 controls (NUL included) and DEL.
_ESCAPED: Final = "%/*>+#" + "".join(map(chr, range(0x20))) + "\x7f"
_ESCAPE_TABLE: Final = {ord(c): f"%{ord(c):02X}" for c in _ESCAPED}
# One C-level search (plus a look at the first character for '$') decides
# whether a str takes the fast path: it finds any escaped character or a
# surrogate (not encodable as UTF-8). A '^\$|' alternative would make the
# search about 3x slower, so the '$' test stays outside the regex.
_NEEDS_WORK: Final = re.compile("[" + re.escape(_ESCAPED) + "\\ud800-\\udfff]").search
_SURROGATE: Final = re.compile("[\\ud800-\\udfff]").search
_BAD_ESCAPE: Final = re.compile("%(?![0-9A-Fa-f]{2})").search
_ESCAPES: Final = re.compile("(?:%[0-9A-Fa-f]{2})+")


def encode_level(value: str) -> str:
    """Percent-encode ``value`` so it can be (part of) one topic level.

    Escapes ``%``, ``/``, ``*``, ``>``, ``+``, ``#``, every C0 control (NUL
    included) and DEL anywhere, and ``$`` as the first character, as ``%XX``
    (uppercase hex of the UTF-8 byte). Everything else, non-ASCII included,
    passes through. Raises ValueError for a lone surrogate, which has no
    UTF-8 form and so cannot be in a topic.
    """
    if _SURROGATE(value):
        raise ValueError(f"{value!r} contains a lone surrogate, which has no UTF-8 form")
    text = value.translate(_ESCAPE_TABLE)
    if text[:1] == "$":
        text = "%24" + text[1:]
    return text


def _unescape(match: re.Match[str]) -> str:
    return bytes.fromhex(match.group().replace("%", "")).decode("utf-8")


def decode_level(level: str) -> str:
    """Invert :func:`encode_level`: ``decode_level(encode_level(v)) == v``.

    Any ``%XX`` run is read as UTF-8 bytes (either hex case). Raises
    ValueError for a ``%`` not followed by two hex digits or escapes that
    are not UTF-8: such a level was not produced by :func:`encode_level`.
    Only a level made of a single placeholder decodes to that value.
    """
    if "%" not in level:
        return level
    bad = _BAD_ESCAPE(level)
    if bad:
        raise ValueError(f"level {level!r} has a malformed escape at character {bad.start()}")
    try:
        return _ESCAPES.sub(_unescape, level)
    except UnicodeDecodeError:
        raise ValueError(f"level {level!r} has escapes that are not UTF-8") from None


def _kind(value: object) -> str:
    name = type(value).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


# --- templates ------------------------------------------------------------------


class _Placeholder:
    """One ``{path|default}``: where its text goes and how to find its value."""

    __slots__ = ("default", "first", "index", "path", "rest")

    def __init__(self, index: int, path: str, keys: list[str], default: str | None) -> None:
        self.index = index  # slot in the part list
        self.path = path
        self.first = keys[0]
        # Later steps: (key, list index if the key is all ASCII digits).
        self.rest: tuple[tuple[str, int | None], ...] = tuple(
            (k, int(k) if k.isascii() and k.isdigit() else None) for k in keys[1:]
        )
        self.default = default  # already encoded


def _template_error(template: str, problem: str) -> TemplateError:
    return TemplateError(f"template {template!r}: {problem}")


def _check_literal(template: str, i: int) -> None:
    """Literal text is copied into every topic, so it must be valid as is."""
    ch = template[i]
    code = ord(ch)
    if ch in "*>":
        problem = f"literal text contains {ch!r}; wildcards are only allowed in filters"
    elif code < 0x20 or code == 0x7F:
        problem = f"literal text contains control character {ch!r}"
    elif 0xD800 <= code <= 0xDFFF:
        problem = f"literal text contains lone surrogate {ch!r}"
    else:
        return
    raise _template_error(template, f"{problem} at character {i}")


def _parse_placeholder(template: str, body: str, start: int) -> tuple[str, list[str], str | None]:
    """Split ``path|default`` (the text between the braces) and check it."""
    if not body:
        raise _template_error(template, f"empty placeholder at character {start}")
    path, bar, default = body.partition("|")
    keys = path.split(".")
    if "" in keys:
        where = "is empty" if not path else f"{path!r} has an empty key"
        raise _template_error(template, f"field path {where} at character {start}")
    if bar and not default:
        raise _template_error(
            template,
            f"placeholder {{{body}}} at character {start} has an empty default; "
            "leave out the '|' for none",
        )
    if bar and _SURROGATE(default):
        raise _template_error(
            template, f"default of {{{body}}} at character {start} contains a lone surrogate"
        )
    return path, keys, (encode_level(default) if bar else None)


class TopicTemplate:
    """A compiled topic template; build one with :meth:`compile`.

    Compiled into a list of literal strings with a slot for each placeholder,
    so :meth:`topic` only copies the list, fills the slots and joins.
    """

    __slots__ = ("_parts", "_placeholders", "_sample", "fields", "text")

    text: str
    fields: tuple[str, ...]

    def __init__(self, text: str, parts: list[str], placeholders: list[_Placeholder]) -> None:
        self.text = text
        self._parts = parts
        self._placeholders = tuple(placeholders)
        self.fields = tuple(dict.fromkeys(p.path for p in placeholders))
        sample = parts.copy()
        for p in placeholders:
            sample[p.index] = "x"
        self._sample = "".join(sample)

    def __repr__(self) -> str:
        return f"TopicTemplate.compile({self.text!r})"

    @classmethod
    def compile(cls, template: str) -> TopicTemplate:
        """Parse and check ``template``; raises TemplateError saying what and where."""
        if not isinstance(template, str):
            raise TemplateError(f"template must be a str, not {type(template).__name__}")
        if not template:
            raise TemplateError("template is empty")
        parts: list[str] = []
        placeholders: list[_Placeholder] = []
        literal: list[str] = []
        level = 1
        level_has_content = False
        i = 0
        n = len(template)

        def flush() -> None:
            if literal:
                parts.append("".join(literal))
                literal.clear()

        while i < n:
            ch = template[i]
            if ch in "{}" and template.startswith(ch + ch, i):
                literal.append(ch)
                level_has_content = True
                i += 2
            elif ch == "{":
                end = template.find("}", i + 1)
                if end < 0:
                    raise _template_error(template, f"unclosed '{{' at character {i}")
                inner = template.find("{", i + 1, end)
                if inner >= 0:
                    raise _template_error(
                        template,
                        f"placeholder opened at character {i} is not closed before "
                        f"the '{{' at character {inner}",
                    )
                path, keys, default = _parse_placeholder(template, template[i + 1 : end], i)
                flush()
                placeholders.append(_Placeholder(len(parts), path, keys, default))
                parts.append("")
                level_has_content = True
                i = end + 1
            elif ch == "}":
                raise _template_error(
                    template, f"unmatched '}}' at character {i}; write '}}}}' for a literal one"
                )
            elif ch == SEPARATOR:
                if not level_has_content:
                    raise _template_error(template, f"empty level at level {level}")
                literal.append(ch)
                level += 1
                level_has_content = False
                i += 1
            else:
                _check_literal(template, i)
                literal.append(ch)
                level_has_content = True
                i += 1
        if not level_has_content:
            raise _template_error(template, f"empty level at level {level}")
        if level > MAX_LEVELS:
            raise _template_error(template, f"has {level} levels; the limit is {MAX_LEVELS}")
        flush()
        if parts[0][:1] == "$":
            raise _template_error(
                template,
                "starts with '$': system topics cannot be a bridge target",
            )
        compiled = cls(template, parts, placeholders)
        try:
            validate_topic(compiled._sample)
        except TopicError as exc:
            raise _template_error(
                template, f"even with 1-character values the topic is invalid: {exc}"
            ) from None
        return compiled

    def sample_topic(self) -> str:
        """The topic with every placeholder replaced by ``x``."""
        return self._sample

    def topic(self, record: Mapping[str, Any]) -> str:
        """Map ``record`` to a valid topic, or raise MappingError (and nothing else).

        The result always passes ``routing.validate_topic`` and has as many
        levels as the template.
        """
        out = self._parts.copy()
        needs_work = _NEEDS_WORK
        for p in self._placeholders:
            try:
                value = record[p.first]
            except (KeyError, TypeError, IndexError):
                value = None
            if p.rest:
                value = _walk(value, p.rest)
            if value.__class__ is str and value and value[0] != "$" and not needs_work(value):
                out[p.index] = value
            else:
                out[p.index] = _slow_value(value, p)
        topic = "".join(out)
        if len(topic) > MAX_TOPIC_BYTES or (
            not topic.isascii() and len(topic.encode("utf-8")) > MAX_TOPIC_BYTES
        ):
            raise _too_long(topic, self.text)
        return topic


def _walk(value: Any, steps: tuple[tuple[str, int | None], ...]) -> Any:
    """Follow the rest of a field path; None when any step is missing."""
    for key, index in steps:
        if value.__class__ is dict:
            value = value.get(key)
        elif isinstance(value, Mapping):
            try:
                value = value[key]
            except (KeyError, TypeError):
                return None
        elif index is not None and value.__class__ in (list, tuple):
            if index >= len(value):
                return None
            value = value[index]
        else:
            return None
    return value


def _slow_value(value: Any, p: _Placeholder) -> str:
    """Everything but a plain str that needs no escaping: convert, encode, or raise."""
    cls = value.__class__
    if cls is str or isinstance(value, str):
        text = str(value)
    elif value is None:
        text = ""
    elif cls is bool:
        text = "true" if value else "false"
    elif cls is int or (isinstance(value, int) and not isinstance(value, bool)):
        try:
            text = str(int(value))
        except ValueError:  # more digits than str() allows: far beyond any topic
            raise MappingError(
                TOPIC_TOO_LONG,
                f"field {p.path!r} is an integer too large for a topic",
                p.path,
            ) from None
    elif cls is float or isinstance(value, float):
        number = float(value)
        if not math.isfinite(number):
            raise MappingError(
                BAD_VALUE, f"field {p.path!r} is {number!r}, which has no topic form", p.path
            )
        text = repr(number).replace("e+", "e")
    elif cls is bytes:
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise MappingError(
                BAD_VALUE, f"field {p.path!r} is bytes that are not valid UTF-8", p.path
            ) from None
    elif isinstance(value, (Mapping, list)) or cls is tuple:
        raise MappingError(NOT_SCALAR, f"field {p.path!r} is {_kind(value)}, not a scalar", p.path)
    else:
        raise MappingError(
            BAD_VALUE, f"field {p.path!r} is {_kind(value)}, which has no topic form", p.path
        )
    if not text:
        if p.default is None:
            raise MappingError(
                MISSING_FIELD, f"field {p.path!r} is missing and has no default", p.path
            )
        return p.default
    try:
        return encode_level(text)
    except ValueError:
        raise MappingError(
            BAD_VALUE, f"field {p.path!r} contains a lone surrogate (not UTF-8)", p.path
        ) from None


def _too_long(topic: str, template: str) -> MappingError:
    size = len(topic.encode("utf-8", "surrogatepass"))
    shown = topic if len(topic) <= 60 else topic[:57] + "..."
    return MappingError(
        TOPIC_TOO_LONG,
        f"topic {shown!r} from template {template!r} is {size} bytes in UTF-8; "
        f"the limit is {MAX_TOPIC_BYTES}",
    )
