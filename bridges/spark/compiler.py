"""Topic templates compiled into Spark SQL expressions: the bridge's mapping without a UDF.

A per-row Python UDF would ship every record to a Python worker and back; these are plain
Spark SQL expressions, so the JVM maps each record itself. They follow the plain bridge
(``bridges.mapping``) rule for rule: same topics, same reason codes, same order of checks.
The few places where Spark cannot tell what Python can (number literals, some JSON corner
cases) are listed in docs/spark.md ("Topic mapping in Spark SQL").

This module only builds strings (no pyspark import), so it is testable without Spark.

How it maps, in SQL terms:

- **Decode, once per row** (``parse_sql``): the Kafka value (BINARY) is cast to STRING,
  checked to be UTF-8 (``is_valid_utf8``) and parsed with ``from_json(..., 'variant')``
  wrapped in ``[...]``. VARIANT keeps JSON types apart (``get_json_object`` returns an
  object's text, so the string ``"{x"`` and an object look alike); the wrapper makes
  Spark notice data after the top-level object (``{..}{..}``), which it otherwise ignores.
- **Extract** each distinct field path once (``variant_get``), classify it with
  ``schema_of_variant`` and apply the value rule; lambdas (``transform``) bind values
  that are used more than once, so nothing is computed twice within an expression.
- **Sanitise** with nested ``replace`` calls (``%`` first), the 33 control characters
  only when a guard ``RLIKE`` finds one, a leading ``$`` as ``%24``.
- **Join** with ``concat``; over 250 bytes (``octet_length``) is ``topic_too_long``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from bridges.mapping import (
    _ESCAPED,
    BAD_VALUE,
    MISSING_FIELD,
    NOT_SCALAR,
    TOPIC_TOO_LONG,
    TopicTemplate,
)
from routing.topics import MAX_TOPIC_BYTES

__all__ = ["DECODE", "PARSED_COLUMN", "CompiledTopic", "compile_topic", "sql_string"]

#: The plain bridge's reason for a value that does not decode (bridges/kafka.py).
DECODE: Final = "decode"
#: Default name of the helper column that holds the parsed record.
PARSED_COLUMN: Final = "_topiary_parsed"
_MAPPED_COLUMN: Final = "_topiary_mapped"

# from_json's defaults accept single-quoted strings; Python's json does not, but it does
# accept NaN, Infinity and -Infinity (a field holding one is then bad_value).
_JSON_OPTIONS: Final = "map('allowSingleQuotes', 'false', 'allowNonNumericNumbers', 'true')"
_JSON_WHITESPACE: Final = "concat(' ', chr(9), chr(10), chr(13))"
_INT_TYPES: Final = "('BOOLEAN', 'TINYINT', 'SMALLINT', 'INT', 'BIGINT')"
# Array indexes are Java ints in Spark paths; a larger index can only miss in Python too.
_MAX_INDEX: Final = 2**31 - 1
# Characters that get_json_object's path parser skips before a name (Java's \s).
_JAVA_SPACE: Final = " \t\n\x0b\x0c\r"
_SMALLEST_NORMAL: Final = "2.2250738585072014E-308D"


@dataclass(frozen=True)
class CompiledTopic:
    """A template as Spark SQL; apply it in two steps so that each value is parsed once::

        df = df.selectExpr("*", f"{c.parse_sql} AS {c.parsed_column}")
        df = df.selectExpr("*", f"{c.topic_sql} AS topic", f"{c.reason_sql} AS reason")

    or ``c.select(df)``, which does that through ``mapped_sql`` (topic and reason from one
    evaluation) and drops the helper columns.

    - ``parse_sql`` reads ``value_column`` (BINARY or STRING): a VARIANT, NULL when the
      value is not UTF-8 JSON. It does not depend on the template, so several templates
      can share one parsed column.
    - ``topic_sql``: the topic (STRING), NULL when the record cannot be mapped.
    - ``reason_sql``: NULL when mapped, else the plain bridge's reason code: ``decode``,
      ``missing_field``, ``not_scalar``, ``bad_value`` or ``topic_too_long``.
    - ``mapped_sql``: ``STRUCT<topic: STRING, reason: STRING>``, both at once.

    The last three read ``parsed_column``, and ``value_column`` again only for a number
    that the VARIANT cannot render exactly (an integer of 39+ digits, ``-0.0``...).
    """

    template: TopicTemplate
    value_column: str
    parsed_column: str
    parse_sql: str
    topic_sql: str
    reason_sql: str
    mapped_sql: str

    def select(self, df: Any, *, topic: str = "topic", reason: str = "reason") -> Any:
        """``df`` with ``topic`` and ``reason`` columns added (duck-typed: no pyspark here)."""
        parsed = _ident(self.parsed_column)
        mapped = _ident(_MAPPED_COLUMN)
        out = df.selectExpr("*", f"{self.parse_sql} AS {parsed}")
        out = out.selectExpr("*", f"{self.mapped_sql} AS {mapped}")
        out = out.selectExpr(
            "*", f"{mapped}.topic AS {_ident(topic)}", f"{mapped}.reason AS {_ident(reason)}"
        )
        return out.drop(self.parsed_column, _MAPPED_COLUMN)


def compile_topic(
    template: TopicTemplate | str,
    *,
    value_column: str = "value",
    parsed_column: str = PARSED_COLUMN,
) -> CompiledTopic:
    """Compile ``template`` (checked by TopicTemplate: TemplateError) into Spark SQL."""
    compiled = template if isinstance(template, TopicTemplate) else TopicTemplate.compile(template)
    builder = _Builder(compiled, _ident(value_column), _ident(parsed_column))
    return CompiledTopic(
        template=compiled,
        value_column=value_column,
        parsed_column=parsed_column,
        parse_sql=parse_sql(value_column),
        topic_sql=builder.topic_sql(),
        reason_sql=builder.reason_sql(),
        mapped_sql=builder.mapped_sql(),
    )


def parse_sql(value_column: str = "value") -> str:
    """The VARIANT of ``[value]``, NULL unless the value is UTF-8 and ends like an object.

    The ``[...]`` wrapper turns trailing data after the first value into a parse error
    (``{..}{..}``) or a second element (``{..},{..}``), both caught by the decode check;
    the ``}`` test catches a stray ``]``. Records that do not end in ``}`` cannot be an
    object anyway.
    """
    text = f"CAST({_ident(value_column)} AS STRING)"
    ends_like_object = (
        f"(endswith({text}, '}}') OR endswith(TRIM(TRAILING {_JSON_WHITESPACE} FROM {text}), '}}'))"
    )
    return (
        f"CASE WHEN is_valid_utf8({text}) AND {ends_like_object} "
        f"THEN from_json(concat('[', {text}, ']'), 'variant', {_JSON_OPTIONS}) END"
    )


# --- SQL text helpers ----------------------------------------------------------------------


def sql_string(text: str) -> str:
    """A Spark SQL string literal for ``text`` (backslash escapes, Spark's default parser).

    Only ``\\`` and ``'`` need escaping; every other character, control characters and
    non-ASCII included, stands for itself inside quotes.
    """
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    """A quoted identifier: column names may contain anything."""
    return "`" + name.replace("`", "``") + "`"


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def _variant_segment(key: str) -> str | None:
    """``key`` as a variant_get path step, or None if the path syntax cannot say it."""
    if "[" not in key:  # template keys never contain "."
        return "." + key
    if "'" not in key:
        return "['" + key + "']"
    if '"' not in key:
        return '["' + key + '"]'
    return None


def _json_path_segment(key: str) -> str | None:
    """``key`` as a get_json_object path step, or None (its parser skips leading spaces
    and reads ``*`` as a wildcard)."""
    if key[0] in _JAVA_SPACE or "?" in key:
        return None
    if "[" not in key and not key.startswith("*"):
        return "." + key
    if "'" not in key and key != "*":
        return "['" + key + "']"
    return None


def _is_index(key: str, position: int) -> bool:
    """Python's rule (mapping._Placeholder): later all-ASCII-digit keys also index lists."""
    return position > 0 and key.isascii() and key.isdigit()


class _Names:
    """Fresh lambda variable names, so nested lambdas never shadow each other."""

    def __init__(self) -> None:
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"_t{self.count}"


def _let(value: str, var: str, body: str) -> str:
    """``body`` with ``var`` bound to ``value``, evaluated once (Spark SQL has no LET)."""
    return f"transform(array({value}), {var} -> {body})[0]"


def _result(missing: str, value: str, reason: str) -> str:
    """One field's outcome: missing?, encoded text, reason (other than missing_field)."""
    return f"named_struct('m', {missing}, 'v', {value}, 'r', {reason})"


_NULL_STRING: Final = "CAST(NULL AS STRING)"


def _ok(value: str) -> str:
    return _result("false", value, _NULL_STRING)


def _error(reason: str) -> str:
    return _result("false", _NULL_STRING, sql_string(reason))


_MISSING: Final = _result("true", _NULL_STRING, _NULL_STRING)


# --- the value rule in SQL -----------------------------------------------------------------


def _replace_all(text: str, chars: list[str]) -> str:
    """Nested ``replace`` calls turning each of ``chars`` into ``%XX``, in order."""
    for ch in chars:
        search = f"chr({ord(ch)})" if ord(ch) < 0x20 or ord(ch) == 0x7F else sql_string(ch)
        text = f"replace({text}, {search}, '%{ord(ch):02X}')"
    return text


# encode_level's characters: the printable ones ('%' first, or its own escapes would get
# escaped again), then the controls, which are rare enough to sit behind a guard.
_PRINTABLE: Final = [ch for ch in _ESCAPED if 0x20 <= ord(ch) < 0x7F]
_CONTROLS: Final = [ch for ch in _ESCAPED if not 0x20 <= ord(ch) < 0x7F]
assert _PRINTABLE[0] == "%"
_CONTROL_GUARD: Final = "concat('[', chr(0), '-', chr(31), chr(127), ']')"


def _encode(text: str) -> str:
    """encode_level in SQL for any string (``text`` is cheap to repeat)."""
    dollar = f"startswith({text}, '$')"
    basic = _replace_all(f"IF({dollar}, substr({text}, 2), {text})", _PRINTABLE)
    escaped = (
        f"CASE WHEN {text} RLIKE {_CONTROL_GUARD} "
        f"THEN {_replace_all(basic, _CONTROLS)} ELSE {basic} END"
    )
    return f"concat(IF({dollar}, '%24', ''), {escaped})"


def _encode_json_string(json: str) -> str:
    """encode_level for a JSON string literal without backslashes (``"..."``).

    JSON writes every C0 control as an escape, so the only control left is DEL.
    """
    dollar = f"startswith({json}, '\"$')"
    start = f"IF({dollar}, 3, 2)"
    inner = f"substr({json}, {start}, length({json}) - {start})"
    escaped = _replace_all(inner, [*_PRINTABLE, "\x7f"])
    return f"concat(IF({dollar}, '%24', ''), {escaped})"


def _python_float(number: str, names: _Names) -> str:
    """Python's ``repr`` of the finite DOUBLE ``number``, with ``e+`` written ``e``.

    Java's Double.toString gives the digits (on JDK < 19 sometimes too many: then the
    shortest ``%.Ne`` form that reads back equal is taken); they are laid out the way
    Python does: exponent form when the decimal point is over 16 or under -3 places away.
    """
    java = names.fresh()
    digits_of = f"length(regexp_extract({java}, '^-?([0-9.]+)', 1)) > 16"
    subnormal = f"(abs({number}) < {_SMALLEST_NORMAL} AND {number} != 0)"
    p, c = names.fresh(), names.fresh()
    shortest = (
        f"try_element_at(filter(transform(sequence(0, 16), {p} -> "
        f"format_string(concat('%.', CAST({p} AS STRING), 'e'), {number})), "
        f"{c} -> try_cast({c} AS DOUBLE) = {number}), 1)"
    )
    text = f"IF({digits_of} OR {subnormal}, coalesce({shortest}, {java}), {java})"
    pattern = "'^(-?)([0-9]+)(?:[.]([0-9]*))?(?:[eE]([-+]?[0-9]+))?$'"
    t, n = names.fresh(), names.fresh()
    parts = (
        f"named_struct('s', regexp_extract({t}, {pattern}, 1), "
        f"'i', regexp_extract({t}, {pattern}, 2), "
        f"'raw', concat(regexp_extract({t}, {pattern}, 2), regexp_extract({t}, {pattern}, 3)), "
        f"'e', coalesce(try_cast(nullif(regexp_extract({t}, {pattern}, 4), '') AS INT), 0))"
    )
    # digits without leading and trailing zeros, and the decimal point position:
    # value = 0.DIGITS * 10^point
    stripped = f"TRIM(LEADING '0' FROM {n}.raw)"
    shape = (
        f"named_struct('s', {n}.s, 'd', TRIM(TRAILING '0' FROM {stripped}), "
        f"'p', length({n}.i) + {n}.e - (length({n}.raw) - length({stripped})))"
    )
    f = names.fresh()
    d, point = f"{f}.d", f"{f}.p"
    exponent = f"abs({point} - 1)"
    layout = (
        f"CASE WHEN {d} = '' THEN concat({f}.s, '0.0') "
        f"WHEN {point} > -4 AND {point} <= 16 THEN concat({f}.s, CASE "
        f"WHEN {point} <= 0 THEN concat('0.', repeat('0', -{point}), {d}) "
        f"WHEN {point} >= length({d}) THEN concat({d}, repeat('0', {point} - length({d})), '.0') "
        f"ELSE concat(substr({d}, 1, {point}), '.', substr({d}, {point} + 1)) END) "
        f"ELSE concat({f}.s, substr({d}, 1, 1), "
        f"IF(length({d}) > 1, concat('.', substr({d}, 2)), ''), 'e', "
        f"IF({point} <= 0, '-', ''), IF({exponent} < 10, '0', ''), CAST({exponent} AS STRING)) "
        "END"
    )
    inner = _let(shape, f, layout)
    return _let(f"CAST({number} AS STRING)", java, _let(text, t, _let(parts, n, inner)))


def _number(field: str, value_text: str, names: _Names) -> str:
    """A DECIMAL or DOUBLE field: Python's text for the int or float the JSON held.

    VARIANT stores integers beyond BIGINT as DECIMAL(p,0) and beyond 38 digits as DOUBLE,
    and also writes ``1.0`` and ``-0.0`` as DECIMAL(p,0); for those few it reads the
    literal again with get_json_object, which keeps an integer's digits.
    """
    d = names.fresh()
    int_like = (
        f"startswith({field}.t, 'DECIMAL') AND endswith({field}.t, ',0)') "
        f"AND ({field}.s = '0' OR try_cast({field}.s AS BIGINT) IS NULL)"
    )
    huge = f"{field}.t IN ('DOUBLE', 'FLOAT') AND abs({d}) >= 1E38D"
    raw = f"get_json_object({value_text}, {field}.g)"
    r, k = names.fresh(), names.fresh()
    kind = (
        f"named_struct('iv', CASE WHEN {r} RLIKE '^-?[0-9]+$' THEN {r} "
        f"WHEN {r} IS NULL AND {int_like} AND {field}.s != '0' THEN {field}.s END, "
        f"'dv', coalesce(try_cast({r} AS DOUBLE), {d}))"
    )
    pick = (
        f"CASE WHEN {k}.iv IS NOT NULL THEN {_ok(f'{k}.iv')} "
        f"ELSE {_ok(_python_float(f'{k}.dv', names))} END"
    )
    looked_up = _let(f"IF(({int_like}) OR ({huge}), {raw}, {_NULL_STRING})", r, _let(kind, k, pick))
    checked = (
        f"CASE WHEN {d} IS NULL OR isnan({d}) OR abs({d}) = CAST('Infinity' AS DOUBLE) "
        f"THEN {_error(BAD_VALUE)} ELSE {looked_up} END"
    )
    return _let(f"try_cast({field}.s AS DOUBLE)", d, checked)


def _typed_rule(field: str, value_text: str, names: _Names) -> str:
    """The value rule from ``t`` (schema_of_variant), ``s`` (text) and ``g`` (JSON path)."""
    t, s = f"{field}.t", f"{field}.s"
    return (
        f"CASE WHEN {t} IS NULL OR {t} = 'VOID' OR ({t} = 'STRING' AND {s} = '') "
        f"THEN {_MISSING} "
        f"WHEN {t} = 'STRING' THEN {_ok(_encode(s))} "
        f"WHEN {t} IN {_INT_TYPES} THEN {_ok(s)} "
        f"WHEN startswith({t}, 'OBJECT') OR startswith({t}, 'ARRAY') "
        f"THEN {_error(NOT_SCALAR)} "
        f"WHEN startswith({t}, 'DECIMAL') OR {t} IN ('DOUBLE', 'FLOAT') "
        f"THEN {_number(field, value_text, names)} "
        f"ELSE {_error(BAD_VALUE)} END"
    )


def _value_rule(field: str, value_text: str, names: _Names) -> str:
    """One field (``f`` VARIANT, ``j`` its JSON text, ``g`` JSON path) -> m/v/r struct.

    The JSON text settles the common cases cheaply (a string without escapes, a boolean,
    null, an object or array); the rest (escaped strings, numbers, NaN, which is written
    ``"NaN"``) take schema_of_variant and a cast, which cost more.
    """
    j = f"{field}.j"
    plain_string = (
        f"startswith({j}, '\"') AND NOT contains({j}, chr(92)) "
        f"AND {j} NOT IN ('\"NaN\"', '\"Infinity\"', '\"-Infinity\"')"
    )
    z = names.fresh()
    typed = (
        f"named_struct('t', schema_of_variant({field}.f), "
        f"'s', try_variant_get({field}.f, '$', 'string'), 'g', {field}.g)"
    )
    return (
        f"CASE WHEN {j} IS NULL OR {j} = 'null' OR {j} = '\"\"' THEN {_MISSING} "
        f"WHEN {plain_string} THEN {_ok(_encode_json_string(j))} "
        f"WHEN {j} IN ('true', 'false') THEN {_ok(j)} "
        f"WHEN startswith({j}, '{{') OR startswith({j}, '[') THEN {_error(NOT_SCALAR)} "
        f"ELSE {_let(typed, z, _typed_rule(z, value_text, names))} END"
    )


# --- the template --------------------------------------------------------------------------


class _Builder:
    """Builds the three expressions for one template."""

    def __init__(self, template: TopicTemplate, value: str, parsed: str) -> None:
        self.template = template
        self.value = value
        self.parsed = parsed
        # TopicTemplate's compiled parts: literal strings with a slot per placeholder.
        self.parts: list[str] = list(template._parts)
        self.placeholders = template._placeholders
        self.paths = list(template.fields)  # distinct paths, in template order

    def decode_failed(self) -> str:
        """Not JSON, not one value, or not an object at the top level."""
        p = self.parsed
        return (
            f"({p} IS NULL OR variant_get({p}, '$[1]') IS NOT NULL "
            f"OR try_variant_get({p}, '$[0]', 'struct<>') IS NULL)"
        )

    def extract(self, keys: list[str], names: _Names) -> str:
        """The field's VARIANT (NULL when missing), following Python's _walk."""
        if any(_has_surrogate(key) for key in keys):
            return "CAST(NULL AS VARIANT)"  # Spark refuses such JSON: it never matches
        expr, path = self.parsed, "$[0]"
        for position, key in enumerate(keys):
            index = _is_index(key, position)
            segment = _variant_segment(key)
            if segment is not None and not index:
                path += segment
                continue
            current = expr if path == "$" else f"variant_get({expr}, {sql_string(path)})"
            if segment is None:
                as_map = f"try_variant_get({current}, '$', 'map<string,variant>')"
                expr = f"try_element_at({as_map}, {sql_string(key)})"
            elif int(key) > _MAX_INDEX:
                expr = f"variant_get({current}, {sql_string('$' + segment)})"
            else:  # an object key on an object, an index on a list
                v = names.fresh()
                expr = _let(
                    current,
                    v,
                    f"coalesce(variant_get({v}, {sql_string('$' + segment)}), "
                    f"variant_get({v}, '$[{int(key)}]'))",
                )
            path = "$"
        return expr if path == "$" else f"variant_get({expr}, {sql_string(path)})"

    def json_path(self, keys: list[str]) -> str:
        """The get_json_object path for the number fallback, NULL when it has none."""
        segments = [_json_path_segment(key) for key in keys]
        if (
            any(s is None for s in segments)
            or any(_is_index(k, i) for i, k in enumerate(keys))
            or any(_has_surrogate(k) for k in keys)
        ):
            return _NULL_STRING
        return sql_string("$" + "".join(segments))  # type: ignore[arg-type]

    def with_fields(self, body: Callable[[str], str], names: _Names) -> str:
        """``body(levels)`` where ``levels[k]`` is the m/v/r struct of ``self.paths[k]``."""
        fields = ", ".join(
            f"named_struct('f', {self.extract(path.split('.'), names)}, "
            f"'g', {self.json_path(path.split('.'))})"
            for path in self.paths
        )
        x, y, levels = names.fresh(), names.fresh(), names.fresh()
        typed = (
            f"transform(array({fields}), {x} -> named_struct("
            f"'f', {x}.f, 'j', to_json({x}.f), 'g', {x}.g))"
        )
        rule = _value_rule(y, f"CAST({self.value} AS STRING)", names)
        return _let(f"transform({typed}, {y} -> {rule})", levels, body(levels))

    def topic_of(self, levels: str) -> str:
        """``concat`` of literals and values; NULL if any value is."""
        slots = {p.index: p for p in self.placeholders}
        args = []
        for i, piece in enumerate(self.parts):
            p = slots.get(i)
            if p is None:
                if piece:
                    args.append(sql_string(piece))
                continue
            level = f"{levels}[{self.paths.index(p.path)}]"
            default = _NULL_STRING if p.default is None else sql_string(p.default)
            args.append(f"IF({level}.m, {default}, {level}.v)")
        return args[0] if len(args) == 1 else f"concat({', '.join(args)})"

    def reasons_of(self, levels: str) -> list[str]:
        """Each placeholder's reason, in template order (Python stops at the first)."""
        out = []
        for p in self.placeholders:
            level = f"{levels}[{self.paths.index(p.path)}]"
            if p.default is None:
                out.append(f"IF({level}.m, {sql_string(MISSING_FIELD)}, {level}.r)")
            else:
                out.append(f"{level}.r")
        return out

    def mapped(self, body: Callable[[str, list[str]], str]) -> str:
        """``body(topic, reasons)`` for a decoded record (no placeholders: no lambdas)."""
        names = _Names()
        if not self.paths:
            return body(sql_string(self.template.sample_topic()), [])

        def with_topic(levels: str) -> str:
            t = names.fresh()
            return _let(self.topic_of(levels), t, body(t, self.reasons_of(levels)))

        return self.with_fields(with_topic, names)

    def topic_sql(self) -> str:
        def body(topic: str, _reasons: list[str]) -> str:
            return f"IF({_too_long(topic)}, {_NULL_STRING}, {topic})"

        return f"CASE WHEN {self.decode_failed()} THEN {_NULL_STRING} ELSE {self.mapped(body)} END"

    def reason_sql(self) -> str:
        def body(topic: str, reasons: list[str]) -> str:
            return _first_reason(topic, reasons)

        decoded = sql_string(DECODE)
        return f"CASE WHEN {self.decode_failed()} THEN {decoded} ELSE {self.mapped(body)} END"

    def mapped_sql(self) -> str:
        def body(topic: str, reasons: list[str]) -> str:
            return (
                f"named_struct('topic', IF({_too_long(topic)}, {_NULL_STRING}, {topic}), "
                f"'reason', {_first_reason(topic, reasons)})"
            )

        decoded = f"named_struct('topic', {_NULL_STRING}, 'reason', {sql_string(DECODE)})"
        return f"CASE WHEN {self.decode_failed()} THEN {decoded} ELSE {self.mapped(body)} END"


def _too_long(topic: str) -> str:
    return f"octet_length({topic}) > {MAX_TOPIC_BYTES}"


def _first_reason(topic: str, reasons: list[str]) -> str:
    """Placeholders in template order, then the length, as TopicTemplate.topic checks."""
    too_long = f"IF({_too_long(topic)}, {sql_string(TOPIC_TOO_LONG)}, {_NULL_STRING})"
    return f"coalesce({', '.join([*reasons, too_long])})"
