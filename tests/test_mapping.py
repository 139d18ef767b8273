"""Kafka record -> topic mapping, as docs/bridge.md ("Topic mapping") states it."""

import contextlib
import json
import math
import pickle
from typing import Any

import msgpack
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from bridges.mapping import (
    DECODERS,
    REASONS,
    DecodeError,
    MappingError,
    TemplateError,
    TopicTemplate,
    decode_json,
    decode_level,
    decode_msgpack,
    encode_level,
)
from routing import MQTT, is_system_topic, parse_filter, validate_topic

BEACON = "beacon/{region}/{country}/{site}/{section}/{event}"


def beacon(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "region": "eu",
        "country": "de",
        "site": "site42",
        "section": "checkout",
        "event": "purchase",
        "user": "u123",
        "amount": 12.5,
    }
    record.update(overrides)
    return record


def levels_of(template: TopicTemplate) -> int:
    return template.sample_topic().count("/") + 1


def mapping_error(template: str, record: dict[str, Any]) -> MappingError:
    with pytest.raises(MappingError) as info:
        TopicTemplate.compile(template).topic(record)
    return info.value


# --- templates that map ---------------------------------------------------------


def test_the_example_template_maps_a_beacon_record() -> None:
    assert TopicTemplate.compile(BEACON).topic(beacon()) == "beacon/eu/de/site42/checkout/purchase"


def test_a_template_keeps_its_text_and_lists_its_fields_in_order() -> None:
    template = TopicTemplate.compile("b/{region}/{page.section}/{region}-{x|y}")
    assert template.text == "b/{region}/{page.section}/{region}-{x|y}"
    assert template.fields == ("region", "page.section", "x")


def test_the_sample_topic_puts_x_for_every_field() -> None:
    template = TopicTemplate.compile("beacon/{region}/site-{site|none}/{a.b}")
    assert template.sample_topic() == "beacon/x/site-x/x"


def test_a_dotted_path_reads_nested_objects() -> None:
    template = TopicTemplate.compile("b/{page.section}/{page.meta.kind}")
    record = {"page": {"section": "checkout", "meta": {"kind": "form"}}}
    assert template.topic(record) == "b/checkout/form"


def test_a_digit_key_indexes_into_a_list() -> None:
    template = TopicTemplate.compile("b/{items.0}/{items.1.sku}")
    assert template.topic({"items": ["first", {"sku": "A7"}]}) == "b/first/A7"


def test_a_digit_key_is_an_ordinary_key_in_an_object() -> None:
    assert TopicTemplate.compile("b/{codes.0}").topic({"codes": {"0": "zero"}}) == "b/zero"


@pytest.mark.parametrize(
    "record",
    [{}, {"section": None}, {"section": ""}, {"section": b""}],
    ids=["missing", "none", "empty-str", "empty-bytes"],
)
def test_the_default_is_used_for_missing_none_and_empty(record: dict[str, Any]) -> None:
    assert TopicTemplate.compile("b/{section|unknown}").topic(record) == "b/unknown"


@pytest.mark.parametrize(
    "record",
    [{"page": "flat"}, {"page": {}}, {"items": []}, {"items": "abc"}, {"page": None}],
    ids=["into-scalar", "absent-key", "out-of-range", "index-a-str", "into-none"],
)
def test_a_path_that_cannot_be_followed_counts_as_missing(record: dict[str, Any]) -> None:
    template = TopicTemplate.compile("b/{page.section|none}/{items.0|none}")
    assert template.topic(record) == "b/none/none"


def test_the_default_is_not_used_when_the_field_has_a_value() -> None:
    assert TopicTemplate.compile("b/{section|unknown}").topic({"section": "home"}) == "b/home"


def test_a_default_is_sanitised_by_the_value_rule() -> None:
    template = TopicTemplate.compile("b/{section|n/a}/{kind|$none}")
    assert template.topic({}) == "b/n%2Fa/%24none"


def test_doubled_braces_are_literal_braces() -> None:
    template = TopicTemplate.compile("b/{{literal}}/{event}")
    assert template.topic({"event": "click"}) == "b/{literal}/click"


def test_literal_text_and_placeholders_mix_within_a_level() -> None:
    template = TopicTemplate.compile("b/site-{site}.{region}/v{version|0}")
    assert template.topic({"site": "42", "region": "eu"}) == "b/site-42.eu/v0"


def test_a_template_without_placeholders_is_a_constant_topic() -> None:
    template = TopicTemplate.compile("audit/all")
    assert template.fields == ()
    assert template.topic({"anything": 1}) == "audit/all"


def test_wildcard_characters_of_mqtt_are_ordinary_in_literal_text() -> None:
    assert TopicTemplate.compile("a+b/#c/{x}").topic({"x": "1"}) == "a+b/#c/1"


# --- the value rule -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("checkout", "checkout"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-17, "-17"),
        (2**70, "1180591620717411303424"),
        (1.5, "1.5"),
        (-0.0, "-0.0"),
        (3.0, "3.0"),
        (0.1, "0.1"),
        (1e20, "1e20"),
        (1e-7, "1e-07"),
        (b"bytes", "bytes"),
        ("caf\u00e9 \u65e5\u672c", "caf\u00e9 \u65e5\u672c"),
        (b"caf\xc3\xa9", "caf\u00e9"),
    ],
)
def test_scalars_become_text_by_the_value_rule(value: object, level: str) -> None:
    assert TopicTemplate.compile("b/{v}").topic({"v": value}) == f"b/{level}"


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("%", "%25"),
        ("a/b", "a%2Fb"),
        ("*", "%2A"),
        (">", "%3E"),
        ("+", "%2B"),
        ("#", "%23"),
        ("\x00", "%00"),
        ("\n", "%0A"),
        ("\x1f", "%1F"),
        ("\x7f", "%7F"),
        ("$SYS", "%24SYS"),
        ("a$b", "a$b"),
        ("$$", "%24$"),
        ("100%/x", "100%25%2Fx"),
        ("\u00e9\u0085", "\u00e9\u0085"),  # non-ASCII, C1 controls included, passes through
    ],
)
def test_encode_level_escapes_exactly_the_listed_characters(value: str, encoded: str) -> None:
    assert encode_level(value) == encoded
    assert decode_level(encoded) == value


def test_encode_level_rejects_a_lone_surrogate() -> None:
    with pytest.raises(ValueError, match="surrogate"):
        encode_level("a\ud800")


@pytest.mark.parametrize("level", ["%", "a%2", "%zz", "%2G"])
def test_decode_level_rejects_a_malformed_escape(level: str) -> None:
    with pytest.raises(ValueError, match="malformed escape"):
        decode_level(level)


def test_decode_level_reads_escapes_as_utf8_in_either_case() -> None:
    assert decode_level("%2f%C3%A9") == "/\u00e9"


def test_decode_level_rejects_escapes_that_are_not_utf8() -> None:
    with pytest.raises(ValueError, match="not UTF-8"):
        decode_level("%FF")


INJECTIONS = ["a/b", "/", "*", ">", "+", "#", "a\x00b", "$SYS", "%2F", "x/*/>", "#/+/", "//"]


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_value_cannot_inject_levels_or_wildcards(value: str) -> None:
    template = TopicTemplate.compile(BEACON)
    topic = template.topic(beacon(site=value))
    validate_topic(topic)
    assert topic.count("/") + 1 == levels_of(template)
    assert decode_level(topic.split("/")[3]) == value
    assert parse_filter("beacon/*/*/*/*/*").matches(topic)
    assert parse_filter("beacon/+/+/+/+/+", MQTT).matches(topic)
    assert not parse_filter("beacon/*/*/*/*").matches(topic)


@pytest.mark.parametrize("value", ["$SYS", "$"])
def test_a_value_cannot_make_a_system_topic(value: str) -> None:
    topic = TopicTemplate.compile("{kind}/x").topic({"kind": value})
    assert not is_system_topic(topic)
    assert parse_filter("*/x").matches(topic)


def test_distinct_values_that_differ_only_in_escaping_give_distinct_topics() -> None:
    template = TopicTemplate.compile("b/{v}")
    topics = {template.topic({"v": v}) for v in ["a/b", "a%2Fb", "a%252Fb", "a%2fb"]}
    assert len(topics) == 4


# --- template errors ------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("b/{region", "unclosed '{' at character 2"),
        ("b/region}", "unmatched '}' at character 8"),
        ("b/{a}}", "unmatched '}' at character 5"),
        ("b/{a/{b}", "opened at character 2 is not closed before the '{' at character 5"),
        ("b/{}", "empty placeholder at character 2"),
        ("b/{|x}", "field path is empty at character 2"),
        ("b/{.a}", "field path '.a' has an empty key at character 2"),
        ("b/{a.}", "field path 'a.' has an empty key at character 2"),
        ("b/{a..b}", "field path 'a..b' has an empty key at character 2"),
        ("b/{a|}", "placeholder {a|} at character 2 has an empty default"),
        ("b//{a}", "empty level at level 2"),
        ("/b/{a}", "empty level at level 1"),
        ("b/{a}/", "empty level at level 3"),
        ("b/*/{a}", "contains '\\*'; wildcards are only allowed in filters at character 2"),
        ("b/{a}/>", "contains '>'; wildcards are only allowed in filters at character 6"),
        ("b/x\x00/{a}", "control character '\\\\x00' at character 3"),
        ("b/x\n/{a}", "control character '\\\\n' at character 3"),
        ("b/x\x7f/{a}", "control character '\\\\x7f' at character 3"),
        ("b/\ud800/{a}", "lone surrogate"),
        ("b/{a|\ud800}", "default of .* contains a lone surrogate"),
        ("$SYS/{a}", "starts with '\\$'"),
        ("x" * 251, "251 bytes"),
        ("x" * 241 + "/{a}/{b}/{c}/{d}/{e}", "251 bytes"),
        ("/".join(["{a}"] * 129), "has 129 levels; the limit is 128"),
        ("", "template is empty"),
    ],
)
def test_a_bad_template_raises_template_error_saying_what_and_where(
    template: str, says: str
) -> None:
    with pytest.raises(TemplateError, match=says):
        TopicTemplate.compile(template)


def test_a_non_string_template_raises_template_error() -> None:
    with pytest.raises(TemplateError, match="must be a str"):
        TopicTemplate.compile(42)  # type: ignore[arg-type]


def test_template_error_names_the_template() -> None:
    with pytest.raises(TemplateError, match=r"^template 'b/\{\}': "):
        TopicTemplate.compile("b/{}")


def test_the_errors_are_value_errors() -> None:
    for error in (TemplateError, MappingError, DecodeError):
        assert issubclass(error, ValueError)


def test_a_dollar_later_in_the_template_is_allowed() -> None:
    assert TopicTemplate.compile("b$/{a}/$x").topic({"a": "1"}) == "b$/1/$x"


# --- mapping errors -------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [{}, {"page": {}}, {"page": {"section": None}}, {"page": {"section": ""}}, {"page": 3}],
)
def test_a_missing_field_without_default_is_missing_field(record: dict[str, Any]) -> None:
    error = mapping_error("b/{page.section}", record)
    assert error.reason == "missing_field"
    assert error.field == "page.section"
    assert str(error) == "field 'page.section' is missing and has no default"


@pytest.mark.parametrize(
    ("value", "kind"), [({"a": 1}, "a dict"), ([1, 2], "a list"), ((1, 2), "a tuple")]
)
def test_an_object_or_list_value_is_not_scalar(value: object, kind: str) -> None:
    error = mapping_error("b/{section|none}", {"section": value})
    assert error.reason == "not_scalar"
    assert str(error) == f"field 'section' is {kind}, not a scalar"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_float_is_a_bad_value(value: float) -> None:
    error = mapping_error("b/{v}", {"v": value})
    assert error.reason == "bad_value"
    assert "field 'v'" in str(error)


def test_bytes_that_are_not_utf8_are_a_bad_value() -> None:
    error = mapping_error("b/{v}", {"v": b"\xff\xfe"})
    assert error.reason == "bad_value"
    assert str(error) == "field 'v' is bytes that are not valid UTF-8"


def test_a_string_with_a_lone_surrogate_is_a_bad_value() -> None:
    # json.loads('"\\ud800"') gives such a string; it has no UTF-8 form.
    record = decode_json(b'{"v": "a\\ud800"}')
    assert mapping_error("b/{v}", record).reason == "bad_value"


@pytest.mark.parametrize(
    "value",
    [msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 0), object()],
    ids=["ext-type", "timestamp", "object"],  # (stable ids: repr(object()) is an address)
)
def test_a_value_of_another_type_is_a_bad_value(value: object) -> None:
    assert mapping_error("b/{v}", {"v": value}).reason == "bad_value"


def test_a_topic_over_250_bytes_is_topic_too_long() -> None:
    error = mapping_error("b/{v}", {"v": "\u00e9" * 125})  # 2 + 250 bytes
    assert error.reason == "topic_too_long"
    assert "252 bytes in UTF-8; the limit is 250" in str(error)


def test_a_topic_of_exactly_250_bytes_is_accepted() -> None:
    topic = TopicTemplate.compile("b/{v}").topic({"v": "\u00e9" * 124})
    assert len(topic.encode()) == 250


def test_escaping_counts_towards_the_length_limit() -> None:
    assert mapping_error("b/{v}", {"v": "/" * 83}).reason == "topic_too_long"  # 2 + 249


def test_an_integer_too_large_to_print_is_topic_too_long() -> None:
    assert mapping_error("b/{v}", {"v": 10**5000}).reason == "topic_too_long"


def test_values_add_no_levels_so_too_many_levels_cannot_happen() -> None:
    template = TopicTemplate.compile("/".join(["{a}"] * 125))
    assert mapping_error(template.text, {"a": "a/b"}).reason == "topic_too_long"
    assert "too_many_levels" in REASONS


def test_the_reasons_are_the_documented_codes() -> None:
    assert set(REASONS) == {
        "missing_field",
        "not_scalar",
        "topic_too_long",
        "too_many_levels",
        "bad_value",
    }


def test_a_mapping_error_survives_pickling() -> None:
    error = mapping_error("b/{page.section}", {})
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.field, str(copy)) == (error.reason, error.field, str(error))


# --- decoders -------------------------------------------------------------------


def test_decode_json_returns_the_object() -> None:
    assert decode_json(b'{"a": {"b": [1, 2.5, null, true]}}') == {"a": {"b": [1, 2.5, None, True]}}


def test_decode_msgpack_returns_the_map_with_str_strings_and_bytes_binaries() -> None:
    value = msgpack.packb({"a": "text", "b": b"\x00\xff", "c": [1, None]})
    assert decode_msgpack(value) == {"a": "text", "b": b"\x00\xff", "c": [1, None]}


def test_the_decoders_are_registered_by_format_name() -> None:
    assert dict(DECODERS) == {"json": decode_json, "msgpack": decode_msgpack}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"\xff{}", "not valid UTF-8"),
        ('{"a": 1}'.encode("utf-16"), "not valid UTF-8"),
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b'{"a": 1} x', "not JSON"),
        (b"[1, 2]", "top level is a list, not a JSON object"),
        (b'"text"', "top level is a str, not a JSON object"),
        (b"null", "top level is a NoneType, not a JSON object"),
        (b"[" * 100_000, "JSON"),
        (b'{"a": ' + b"1" * 5000 + b"}", "JSON"),
    ],
    ids=["utf8", "utf16", "empty", "open", "trailing", "list", "str", "null", "deep", "bigint"],
)
def test_decode_json_raises_decode_error_for_bad_values(value: bytes, says: str) -> None:
    with pytest.raises(DecodeError, match=says):
        decode_json(value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"", "not msgpack"),
        (msgpack.packb({"a": 1})[:-1], "not msgpack"),
        (msgpack.packb({"a": 1}) + b"\x01", "ExtraData"),
        (msgpack.packb([1, 2]), "top level is a list, not a msgpack map"),
        (msgpack.packb(7), "top level is an int, not a msgpack map"),
        (msgpack.packb({1: "a"}), "not msgpack"),
        (b"\x81\xa1k" + b"\x91" * 5000 + b"\x00", "StackError"),
        (b"\xa2\xff\xfe", "not msgpack"),
        (b"\xc1", "not msgpack"),
    ],
    ids=["empty", "truncated", "extra", "array", "int", "int-key", "deep", "utf8", "reserved"],
)
def test_decode_msgpack_raises_decode_error_for_bad_values(value: bytes, says: str) -> None:
    with pytest.raises(DecodeError, match=says):
        decode_msgpack(value)


@pytest.mark.parametrize("decode", [decode_json, decode_msgpack])
def test_a_tombstone_raises_decode_error(decode: Any) -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        decode(None)


@pytest.mark.parametrize("decode", [decode_json, decode_msgpack])
def test_the_decoders_accept_any_bytes_like_value(decode: Any) -> None:
    value = json.dumps({"a": 1}).encode() if decode is decode_json else msgpack.packb({"a": 1})
    assert decode(memoryview(value)) == {"a": 1}
    assert decode(bytearray(value)) == {"a": 1}


@pytest.mark.parametrize("decode", [decode_json, decode_msgpack])
def test_a_value_that_is_not_bytes_raises_decode_error(decode: Any) -> None:
    with pytest.raises(DecodeError, match="is an int, not bytes"):
        decode(5)


# --- properties -----------------------------------------------------------------


@given(st.text())
def test_encode_level_round_trips(value: str) -> None:
    assert decode_level(encode_level(value)) == value


@given(st.text())
def test_encode_level_never_yields_a_separator_wildcard_nul_or_leading_dollar(value: str) -> None:
    encoded = encode_level(value)
    for ch in "/*>+#\x00":
        assert ch not in encoded
    assert not encoded.startswith("$")


def scalars() -> st.SearchStrategy[Any]:
    return (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text()
        | st.binary()
        | st.sampled_from(["\ud800", "a\udfffb", "$SYS", "/", "*", ">", "%"])
    )


def json_like(leaves: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars() if leaves is None else leaves,
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=5), children, max_size=4)
        ),
        max_leaves=12,
    )


PROPERTY_TEMPLATE = "beacon/{region}/{page.section|none}/{items.0}/x-{event|none}-{n}"


def field() -> st.SearchStrategy[Any]:
    return st.one_of(st.text(min_size=1), st.integers(), scalars(), json_like())


# Mostly records that have the fields (so most map), some with anything anywhere.
RECORDS = st.fixed_dictionaries(
    {
        "region": field(),
        "page": st.fixed_dictionaries({"section": field()}),
        "items": st.lists(field(), min_size=1, max_size=3),
        "n": field(),
    },
    optional={"event": field()},
) | st.dictionaries(st.sampled_from(["region", "page", "items", "event", "n"]), json_like())


@given(RECORDS)
def test_topic_returns_a_valid_topic_or_raises_mapping_error(record: dict[str, Any]) -> None:
    template = TopicTemplate.compile(PROPERTY_TEMPLATE)
    try:
        topic = template.topic(record)
    except MappingError as error:
        assert error.reason in REASONS
        return
    validate_topic(topic)
    assert topic.count("/") + 1 == levels_of(template)
    assert not is_system_topic(topic)


FIVE_VALUES = st.tuples(*[st.text(min_size=1)] * 5)


def beacon_of(values: tuple[str, ...]) -> dict[str, Any]:
    return dict(zip(["region", "country", "site", "section", "event"], values, strict=True))


@given(FIVE_VALUES)
def test_the_levels_of_a_mapped_topic_decode_back_to_the_values(values: tuple[str, ...]) -> None:
    try:
        topic = TopicTemplate.compile(BEACON).topic(beacon_of(values))
    except MappingError as error:
        assert error.reason == "topic_too_long"
        return
    assert tuple(decode_level(level) for level in topic.split("/")[1:]) == values


@given(FIVE_VALUES, FIVE_VALUES)
def test_distinct_values_give_distinct_topics(
    first: tuple[str, ...], second: tuple[str, ...]
) -> None:
    assume(first != second)
    template = TopicTemplate.compile(BEACON)
    try:
        a, b = template.topic(beacon_of(first)), template.topic(beacon_of(second))
    except MappingError:
        return
    assert a != b


@given(st.binary())
def test_decode_json_returns_a_dict_or_raises_decode_error_for_any_bytes(value: bytes) -> None:
    with contextlib.suppress(DecodeError):
        assert isinstance(decode_json(value), dict)


def mangled(encoded: bytes, cut: int, junk: bytes) -> bytes:
    return encoded[: cut % (len(encoded) + 1)] + junk


@given(
    st.builds(
        mangled,
        json_like().map(lambda v: json.dumps({"k": v}, default=repr).encode()),
        st.integers(0, 200),
        st.binary(max_size=4),
    )
)
def test_decode_json_returns_a_dict_or_raises_decode_error_for_mangled_json(value: bytes) -> None:
    with contextlib.suppress(DecodeError):
        assert isinstance(decode_json(value), dict)


PACKABLE = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
PACKABLE |= st.text() | st.binary()


@given(
    st.binary()
    | st.builds(
        mangled,
        json_like(PACKABLE).map(lambda v: msgpack.packb({"k": v})),
        st.integers(0, 200),
        st.binary(max_size=4),
    )
)
def test_decode_msgpack_returns_a_dict_or_raises_decode_error_for_any_bytes(value: bytes) -> None:
    with contextlib.suppress(DecodeError):
        assert isinstance(decode_msgpack(value), dict)
