"""Topic templates compiled to Spark SQL (bridges/spark/compiler.py, docs/spark.md).

Spark must derive the plain bridge's topic and reason (bridges.mapping) for every record.
The few differences docs/spark.md lists are asserted as what they are, not skipped; the
generated records leave out only the documented number-format cases (see
``_documented_number_difference``). The SQL-only tests need no Spark; the others share
one DataFrame per query, since every Spark job costs time.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges import mapping
from bridges.spark.compiler import DECODE, PARSED_COLUMN, compile_topic, parse_sql, sql_string
from routing import validate_topic

BEACON = "beacon/{region}/{country}/{site|unknown}/{page.section}/{event}"
# A list index, defaults that need escaping, a literal quote, backslash and brace.
LISTS = "o'k\\x/{items.0|none}/{page.section|n/a}/{{lit}}{event}"
# Keys that the path syntaxes make hard: spaces, brackets, quotes, '*', digits.
ODD_KEYS = "w/{a b|d}/{x[0]}/{q'\"[k]|z}/{*|s}/{ s|t}/{items.1.0|q}/{0|zero}"
# Plain top-level keys only: ordinary records take the shortcut (from_json of just these).
FLAT = "beacon/{region}/{country}/{site|unknown}/{event}"
TEMPLATES = (BEACON, LISTS, ODD_KEYS, FLAT)

Outcome = tuple[str | None, str | None]


def plain(template: str, value: bytes) -> Outcome:
    """What the plain Kafka bridge does with ``value``: (topic, None) or (None, reason)."""
    try:
        record = mapping.decode_json(value)
    except mapping.DecodeError:
        return None, DECODE
    try:
        return mapping.TopicTemplate.compile(template).topic(record), None
    except mapping.MappingError as exc:
        return None, exc.reason


def beacon(**fields: Any) -> bytes:
    record: dict[str, Any] = {
        "region": "eu",
        "country": "de",
        "site": "site42",
        "page": {"section": "checkout"},
        "event": "purchase",
        "user": "u123",
    }
    record.update(fields)
    return json.dumps(record).encode()


# --- without Spark ----------------------------------------------------------------------------


def test_the_example_template_parses_once_and_reads_each_field_path_once() -> None:
    compiled = compile_topic(BEACON)
    everything = " ".join(sql for _name, sql in compiled.stages)
    assert everything.count("from_json(") == 1
    assert compiled.parse_sql.count("from_json(") == 1
    fields_sql = compiled.fields_sql
    assert fields_sql is not None
    for path in ("region", "country", "site", "page.section", "event"):
        assert fields_sql.count(sql_string(f"$[0].{path}")) == 1, path
        assert everything.count(sql_string(f"$[0].{path}")) == 1, path
    assert compiled.helper_columns == (
        PARSED_COLUMN,
        "_topiary_fields",
        "_topiary_fast",
        "_topiary_levels",
        "_topiary_mapped",
    )
    assert compiled.topic_sql == "`_topiary_mapped`.topic"
    assert compiled.reason_sql == "`_topiary_mapped`.reason"


def test_a_template_of_plain_keys_gets_the_shortcut_and_its_own_gated_stages() -> None:
    compiled = compile_topic(FLAT)
    assert compiled.helper_columns == (
        "_topiary_words",
        "_topiary_short",
        "_topiary_parsed",
        "_topiary_fields",
        "_topiary_fast",
        "_topiary_levels",
        "_topiary_mapped",
    )
    words = compiled.stages[0][1]
    assert "'ARRAY<STRUCT<`region`: STRING, `country`: STRING, `site`: STRING, " in words
    for _name, sql in compiled.stages[2:]:
        assert sql.startswith("IF(`_topiary_short` IS NULL, ")
    assert compiled.topic_sql == "coalesce(`_topiary_short`, `_topiary_mapped`.topic)"
    assert compiled.reason_sql.startswith("IF(`_topiary_short` IS NULL, `_topiary_mapped`.reason")
    assert compile_topic(FLAT, shortcut=False).helper_columns[0] == PARSED_COLUMN
    for other in (BEACON, LISTS, ODD_KEYS, "fixed/topic"):
        assert "_topiary_short" not in compile_topic(other).helper_columns


def test_the_parse_stage_does_not_depend_on_the_template() -> None:
    assert compile_topic(BEACON).parse_sql == compile_topic(LISTS).parse_sql == parse_sql()
    assert (
        "CAST(`kafka value` AS STRING)"
        in compile_topic("a/{b}", value_column="kafka value").parse_sql
    )


def unquote(literal: str) -> str:
    """Read back a Spark SQL string literal as Spark's parser does (backslash escapes)."""
    assert literal[0] == literal[-1] == "'"
    return re.sub(r"\\(.)", lambda m: m.group(1), literal[1:-1], flags=re.DOTALL)


@given(st.text())
def test_sql_string_literals_read_back_unchanged(text: str) -> None:
    literal = sql_string(text)
    assert unquote(literal) == text
    assert re.fullmatch(r"'(?:[^'\\]|\\.)*'", literal, flags=re.DOTALL)


def test_literals_and_defaults_with_quotes_and_backslashes_are_escaped() -> None:
    compiled = compile_topic("it's\\/{a|x'y\\z}")
    assert sql_string("it's\\/") == "'it\\'s\\\\/'"
    mapped = dict(compiled.stages)["_topiary_mapped"]
    assert "concat('it\\'s\\\\/', IF(`_topiary_levels`[0].m, 'x\\'y\\\\z', " in mapped


def test_keys_are_written_in_the_path_syntax_that_can_say_them() -> None:
    fields = compile_topic("a/{x[0]}/{q'[k]}/{q'\"[k]}/{a b.$c}/{items.0}/{7}").fields_sql
    assert fields is not None
    assert "variant_get(`_topiary_parsed`, '$[0][\\'x[0]\\']')" in fields
    assert "variant_get(`_topiary_parsed`, '$[0][\"q\\'[k]\"]')" in fields
    # a key with '[' and both quotes: only a map lookup can reach it
    assert (
        "try_element_at(try_variant_get(variant_get(`_topiary_parsed`, '$[0]'), '$', "
        "'map<string,variant>'), 'q\\'\"[k]')" in fields
    )
    assert "variant_get(`_topiary_parsed`, '$[0].a b.$c')" in fields
    # a later all-digit key is an object key or a list index, whichever the value has
    assert "coalesce(variant_get(__t1, '$.0'), variant_get(__t1, '$[0]'))" in fields
    # the first key is always an object key: the record is an object
    assert "variant_get(`_topiary_parsed`, '$[0].7')" in fields


def test_compile_errors_come_from_topic_template() -> None:
    for bad in ("a/{b", "a/b}", "", "$SYS/{a}", "a//{b}", "a/*/{b}", "{a|}"):
        with pytest.raises(mapping.TemplateError):
            compile_topic(bad)
    with pytest.raises(mapping.TemplateError):
        compile_topic(42)  # type: ignore[arg-type]


def test_a_template_without_placeholders_still_decodes() -> None:
    compiled = compile_topic("fixed/topic")
    assert compiled.helper_columns == (PARSED_COLUMN, "_topiary_mapped")
    assert compiled.fields_sql is None
    assert "'fixed/topic'" in compiled.stages[1][1]


def test_the_compiler_does_not_import_pyspark() -> None:
    code = "import sys, bridges.spark.compiler; sys.exit('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- with Spark: one query per corpus ---------------------------------------------------------


def spark_map(
    spark: Any,
    values: Sequence[bytes | None],
    templates: Sequence[str],
    *,
    literals: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], Any]:
    """Every value through every template in one query: row dicts in input order, and the
    DataFrame. One parsed column serves all templates; their stages go side by side (one
    projection per stage for all templates: fewer plans for Spark to analyse)."""
    df = spark.createDataFrame(list(enumerate(values)), "id INT, value BINARY")
    compiled = [compile_topic(t, prefix=f"_p{n}") for n, t in enumerate(templates)]
    for depth in range(max(len(c.stages) for c in compiled)):
        columns = {name: sql for c in compiled for name, sql in c.stages[depth : depth + 1]}
        df = df.selectExpr("*", *(f"{sql} AS `{name}`" for name, sql in columns.items()))
    outputs = [
        *(f"{c.topic_sql} AS t{n}" for n, c in enumerate(compiled)),
        *(f"{c.reason_sql} AS r{n}" for n, c in enumerate(compiled)),
        *(f"{sql_string(text)} AS lit{i}" for i, text in enumerate(literals)),
    ]
    df = df.selectExpr("id", *outputs)
    rows = sorted(df.collect(), key=lambda row: row.id)
    return [row.asDict() for row in rows], df


def _walk(record: Any, path: str) -> Any:
    """The value a placeholder reaches, as mapping._walk finds it (None when missing)."""
    value: Any = record
    for position, key in enumerate(path.split(".")):
        if isinstance(value, Mapping):
            value = value.get(key)
        elif position and key.isascii() and key.isdigit() and isinstance(value, list):
            value = value[int(key)] if int(key) < len(value) else None
        else:
            return None
    return value


def _significant_digits(number: float) -> int:
    return len(repr(abs(number)).split("e")[0].replace(".", "").strip("0"))


def _non_finite_inside(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping):
        return any(_non_finite_inside(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite_inside(v) for v in value)
    return False


def _json_path_cannot_reach(path: str) -> bool:
    """docs/spark.md: get_json_object cannot follow a list index (a later all-digit key)
    or a key that starts with white space or '*', contains '?', or has '[' and a quote."""
    keys = path.split(".")
    return any(
        (position and key.isascii() and key.isdigit())
        or key[0] in " \t\n\x0b\x0c\r*"
        or "?" in key
        or ("[" in key and "'" in key)
        for position, key in enumerate(keys)
    )


def _documented_number_difference(template: str, record: Any) -> str | None:
    """Why Spark may write a number differently from Python here (docs/spark.md), if so.

    - On Java < 19, Double.toString is not always the closest 17-digit form, and a float
      whose shortest form has 17 digits then differs in its last digit.
    - A number VARIANT cannot hold as written (an integer of 39+ digits, -0.0) is read
      again with get_json_object, which fails on some paths and on records with NaN or
      Infinity; Spark then writes the float it has.
    """
    for path in mapping.TopicTemplate.compile(template).fields:
        value = _walk(record, path)
        if isinstance(value, float) and math.isfinite(value) and _significant_digits(value) == 17:
            return "17-digit float on Java < 19"
        huge = isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**38
        negative_zero = isinstance(value, float) and value == 0 and math.copysign(1, value) < 0
        if (huge or negative_zero) and (
            _json_path_cannot_reach(path) or _non_finite_inside(record)
        ):
            return "a number get_json_object cannot read"
    return None


def _assert_same(value: bytes | None, template: str, got: Outcome) -> None:
    expected = plain(template, value) if value is not None else (None, DECODE)
    try:
        record = json.loads(value) if value is not None else None
    except (ValueError, RecursionError):
        record = None
    why = _documented_number_difference(template, record)
    if why is None:
        assert got == expected, (template, value)
    else:  # same outcome, the number text may differ
        assert got[1] == expected[1], (template, value, why)
    if got[0] is not None:
        validate_topic(got[0])


HAND_WRITTEN: list[bytes | None] = [
    beacon(),
    # missing: absent, null, empty string, out of range, through a scalar; defaults
    beacon(site=None),
    beacon(site=""),
    beacon(region=None),
    beacon(region=""),
    b'{"region":"eu","country":"de","event":"x"}',
    beacon(page="checkout"),
    beacon(page=[{"section": "x"}]),
    beacon(page={"section": None}),
    beacon(items=[]),
    beacon(items=["first", "second"]),
    beacon(items={"0": "key zero"}),
    beacon(items=[[1, 2], "x"]),
    beacon(items=[None]),
    beacon(items=[""]),
    # not scalars
    beacon(event={"a": 1}),
    beacon(event=[1, 2]),
    beacon(event={}),
    beacon(event=[]),
    beacon(page={"section": {"deep": {"deeper": [1, {"x": "y"}]}}}),
    # booleans and numbers
    beacon(event=True),
    beacon(event=False),
    beacon(event=0),
    beacon(event=-17),
    beacon(event=2**63 - 1),
    beacon(event=-(2**63)),
    beacon(event=2**63),
    beacon(event=12345678901234567890),
    beacon(event=-(10**37)),
    beacon(event=10**38),
    beacon(event=-(10**45)),
    beacon(event=10**200),
    beacon(event=1.5),
    beacon(event=0.1),
    beacon(event=-2.0),
    beacon(event=1e20),
    beacon(event=1e16),
    beacon(event=1e15),
    beacon(event=1e-5),
    beacon(event=1e-4),
    beacon(event=123456789.123),
    beacon(event=5e-324),
    beacon(event=8.41e21),
    beacon(event=1e23),
    beacon(event=2.82879384806159e17),
    beacon(event=7.234526473425726e18),
    beacon(event=1.7976931348623157e308),
    beacon(event=-0.0),
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":1.0}',
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":2.50}',
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":-0.000}',
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":12345678901234567890.0}',
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":1E400}',
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":1e-400}',
    b'{"region":"eu","country":"de","page":{"section":"x"},"event":0.1000000000000000055511151231257827}',
    beacon(event=float("nan")),
    beacon(event=float("inf")),
    beacon(event=float("-inf")),
    beacon(user=float("nan")),  # NaN in a field the template does not use
    # every escaped character, '$' first and elsewhere, non-ASCII, strings like numbers
    beacon(event="a/b%c*d>e+f#g"),
    beacon(event="%25 stays %2525"),
    beacon(event="$SYS"),
    beacon(event="a$"),
    beacon(event="$"),
    beacon(event="".join(map(chr, range(32))) + "\x7f"),
    beacon(event='tab\there\nnewline\\backslash"quote'),
    beacon(event="\\u0041 is not an escape"),
    beacon(event="caf\u00e9 \u20ac \U0001f600 \u2028"),
    beacon(event="NaN"),
    beacon(event="Infinity"),
    beacon(event="-Infinity"),
    beacon(event="null"),
    beacon(event="{x"),
    beacon(event="true"),
    # words the shortcut must leave alone, or may take as they are
    beacon(event="1e5"),
    beacon(event="12E3x"),
    beacon(event="-5"),
    beacon(event="-"),
    beacon(event="_x-y_"),
    beacon(event="INF"),
    beacon(event="007"),
    beacon(event="123456789012345678901234567890123456789012345"),
    b'{"Region":"EU","region":"eu","country":"de","event":"x"}',
    b'{"region":"eu","country":"de","event":"x","site":"s","more":{"site":"no"}}',
    json.dumps(
        {"region": "é", "country": "\U0001f600", "page": {"section": "ü"}, "event": "x"},
        ensure_ascii=False,
    ).encode(),
    # topic_too_long, escapes counting three bytes, UTF-8 bytes counting
    beacon(event="x" * 220),
    beacon(event="x" * 300),
    beacon(event="/" * 80),
    beacon(event="é" * 110),
    beacon(event="é" * 130),
    # reason order: the first failing placeholder in template order
    beacon(region=None, country={"a": 1}),
    beacon(region=[1], country=None),
    beacon(region=float("nan"), country=[1]),
    beacon(country=None, event="x" * 300),
    # the odd keys
    json.dumps(
        {
            "a b": "ab",
            "x[0]": 1.5,
            "q'\"[k]": "quoted",
            "*": -17,
            " s": 10**40,
            "items": [{"0": "zero"}, [{"x": 1}, "y"]],
            "0": "digit key",
        }
    ).encode(),
    json.dumps({"*": 10**40, " s": -0.0, "items": [0, ["a"]], "x[0]": "x", "0": 0}).encode(),
    json.dumps({"items": {"1": {"0": "objects all the way"}}, "0": None}).encode(),
    # not decodable, not one value, not an object
    None,
    b"",
    b"   ",
    b"\xff{}",
    b'{"a":"\xed\xa0\x80"}',  # a UTF-8-encoded surrogate
    b'{"a":"\xc0\x80"}',  # an overlong NUL
    b'{"a":"\xf4\x90\x80\x80"}',  # beyond U+10FFFF
    b"\xef\xbb\xbf" + beacon(),  # a byte order mark
    beacon().decode().encode("utf-16"),
    b"[1]",
    b'[{"region":"eu"}]',
    b'"string"',
    b"null",
    b"42",
    b'{"a":1}{"b":2}',
    b'{"a":1} x',
    b'{"a":1},{"b":2}',
    b'{"a":1}]',
    b'{"a":1} \n\t\r',
    beacon() + b"\n",
    b'{"a":1}\x0c',
    b"{'a':1}",
    b'{"a":01}',
    b'{"a":.5}',
    b'{"a":1,}',
    b'{"a":/*comment*/1}',
    b'{"a":"raw\ttab"}',
    b'{"a":"\\q"}',
    b'{"region":"eu"',
    b'{"a":' + b"[" * 50 + b"]" * 50 + b"}",
    b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}",
]

# Records on which Spark is documented to differ (docs/spark.md), and what it does.
DOCUMENTED: dict[bytes, Outcome] = {
    # duplicate keys: Spark refuses them (spark.sql.variant.allowDuplicateKeys=false)
    b'{"region":"eu","region":"us","country":"de","page":{"section":"x"},"event":"e"}': (
        None,
        DECODE,
    ),
    # an unpaired surrogate escape: Spark refuses the record, Python the field
    beacon(event="\ud800"): (None, DECODE),
    beacon(user="\udfff"): (None, DECODE),
    # +Infinity, -INF: Jackson reads them, Python does not
    beacon()[:-1] + b',"extra":+Infinity}': ("beacon/eu/de/site42/checkout/purchase", None),
    beacon()[:-1] + b',"extra":-INF}': ("beacon/eu/de/site42/checkout/purchase", None),
    # a number over 1000 characters: Jackson's limit; Python reads up to 4300 digits
    beacon()[:-1] + b',"extra":' + b"7" * 1001 + b"}": (None, DECODE),
    # a stray ']' after the object, then more, ending in '}'
    beacon() + b'] {"x":1}': ("beacon/eu/de/site42/checkout/purchase", None),
}


def test_spark_maps_the_hand_written_records_like_the_plain_bridge(spark: Any) -> None:
    reasons = {plain(t, v)[1] for t in TEMPLATES for v in HAND_WRITTEN if v is not None}
    assert reasons >= {DECODE, *mapping.REASONS} - {"too_many_levels"}, (
        "the corpus covers every reason"
    )
    literals = [
        "it's",
        "back\\slash",
        "\\'",
        "'\\",
        "\\u0041 \\% \\_ \\n",
        "caf\u00e9",
        "tab\tnew\nline",
        "",
    ]
    values = [*HAND_WRITTEN, *DOCUMENTED]
    rows, df = spark_map(spark, values, TEMPLATES, literals=literals)
    for value, row in zip(values, rows, strict=True):
        for n, template in enumerate(TEMPLATES):
            got = (row[f"t{n}"], row[f"r{n}"])
            if value in DOCUMENTED:
                if template == BEACON:
                    assert got == DOCUMENTED[value], value
                    assert plain(template, value) != got
            else:
                _assert_same(value, template, got)
    for i, text in enumerate(literals):
        assert rows[0][f"lit{i}"] == text
    # three templates shared the one parse; FLAT has its shortcut and its own gated parse
    plan = df._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("from_json(") == 3


def test_records_the_shortcut_takes_map_like_python_where_the_full_rules_differ(
    spark: Any,
) -> None:
    """Duplicate keys and an unpaired surrogate elsewhere: the VARIANT parse refuses the
    record (docs/spark.md); from_json, and so the shortcut, reads it as Python does."""
    values = [
        b'{"region":"eu","region":"us","country":"de","site":"s1","event":"e"}',
        beacon(user="\udfff"),
    ]
    rows, _df = spark_map(spark, values, [FLAT, BEACON])
    for value, row in zip(values, rows, strict=True):
        assert (row["t0"], row["r0"]) == plain(FLAT, value)
        assert row["t0"] is not None
        assert plain(BEACON, value) != row["t1"]


def test_select_adds_topic_and_reason_and_a_17_digit_float_may_differ_in_its_last_digit(
    spark: Any,
) -> None:
    """Java 17's Double.toString is not always the closest 17-digit form (JDK-4511638)."""
    values = [beacon(), beacon(event=1.9400994884341945e25), beacon(event=2.5374553018654677e25)]
    df = spark.createDataFrame(list(enumerate(values)), "id INT, value BINARY")
    out = compile_topic(BEACON).select(df, topic="t", reason="r")
    assert out.columns == ["id", "value", "t", "r"]
    rows = sorted(out.collect(), key=lambda row: row.id)
    assert (rows[0].t, rows[0].r) == plain(BEACON, values[0])
    for value, row in zip(values[1:], rows[1:], strict=True):
        expected, _reason = plain(BEACON, value)
        assert expected is not None and row.r is None
        assert row.t == expected or row.t[:-4] == expected[:-4], (row.t, expected)


# --- with Spark: generated records ------------------------------------------------------------

TEXT = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=8),
    st.text(st.sampled_from("%/*>+#$\\\"' \x00\x1f\x7f\u00e9\U0001f600ab"), max_size=6),
    st.sampled_from(["", "$", "eu", "x" * 251, "\u00e9" * 126]),
)
SCALARS = st.one_of(
    TEXT,
    TEXT,
    st.integers(-(10**45), 10**45),
    st.integers(-100, 100),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
VALUES = st.one_of(
    SCALARS,
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.sampled_from(["0", "section", "x"]), SCALARS, max_size=2),
)
RECORDS = st.fixed_dictionaries(
    {"region": VALUES, "country": VALUES, "event": VALUES},
    optional={
        "site": VALUES,
        "page": st.one_of(VALUES, st.fixed_dictionaries({}, optional={"section": VALUES})),
        "items": st.one_of(VALUES, st.lists(VALUES, max_size=3)),
        "a b": VALUES,
        "x[0]": VALUES,
        "q'\"[k]": VALUES,
        "*": VALUES,
        " s": VALUES,
        "0": VALUES,
    },
)


# Each example is one Spark query, ~1.5 s whatever the row count (analysing the plan), and
# lists of more than ~200 of these records take Hypothesis longer to generate than the query
# takes: two examples of 50-200 records.
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(RECORDS, st.booleans()), min_size=50, max_size=200))
def test_spark_maps_generated_records_like_the_plain_bridge(
    spark: Any, records: list[tuple[dict[str, Any], bool]]
) -> None:
    values = [
        json.dumps(record, ensure_ascii=ascii_only).encode() for record, ascii_only in records
    ]
    rows, _df = spark_map(spark, values, TEMPLATES)
    for value, row in zip(values, rows, strict=True):
        for n, template in enumerate(TEMPLATES):
            _assert_same(value, template, (row[f"t{n}"], row[f"r{n}"]))
