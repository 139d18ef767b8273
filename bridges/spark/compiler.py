"""Topic templates compiled into Spark SQL expressions: the bridge's mapping without a UDF.

A per-row Python UDF would ship every record to a Python worker and back; these are plain
Spark SQL expressions, so the JVM maps each record itself. They follow the plain bridge
(``bridges.mapping``) rule for rule: same topics, same reason codes, same order of checks.
The few places where Spark cannot see what Python sees (some number literals, some JSON
that one side refuses) are listed in docs/spark.md ("Topic mapping in Spark SQL").

This module only builds strings (no pyspark import), so it is testable without Spark.

The mapping is a chain of helper columns (:attr:`CompiledTopic.stages`), one projection
each, rather than one expression: so each value is computed once (Spark SQL has no LET),
and each stage keeps its generated code to itself (see :func:`_detached`). In SQL terms:

1. **parse** (the same for every template, so it can be shared): the Kafka value
   (BINARY) as STRING, checked to be UTF-8 (``is_valid_utf8``), parsed once with
   ``from_json(.., 'variant')`` inside ``[...]``. VARIANT keeps JSON types apart, which
   get_json_object cannot (it returns an object's text, so the string ``"{x"`` and an
   object look alike); the wrapper makes data after the top-level object (``{..}{..}``)
   an error, which Spark would otherwise ignore.
2. **fields**: each distinct field path read once (``variant_get``), with its
   ``to_json`` text, which tells null, booleans, strings, objects and arrays apart.
3. **fast**: the value rule for all of those; a string is percent-encoded straight from
   its JSON text with nested ``replace`` calls (``%`` first; JSON's escapes of control
   characters become ``%XX``; a leading ``$`` becomes ``%24``).
4. **levels**: numbers (rare in topics) by ``schema_of_variant`` type, with Python's
   ``str(int)`` and ``repr(float)`` rebuilt from Java's text for the number.
5. **mapped**: ``concat`` of literal parts and levels, the first failing placeholder's
   reason in template order, then ``topic_too_long`` (``octet_length`` over 250), as
   TopicTemplate.topic raises them; ``topic_sql`` and ``reason_sql`` read it.

**The shortcut.** Most records are ordinary: every field a short word of letters, digits,
``_`` and ``-``. For templates whose fields are plain top-level keys, two stages come first:
``from_json`` with a schema of just those fields as STRING (Jackson reads the record once and
skips the rest: ~6 times cheaper than the VARIANT parse and the stages after it), then the
topic when every value is such a word. Only the other records run stages 1-5 (each stage is
``IF(shortcut IS NULL, .., NULL)``). A word can be read only one way: a JSON number that
Spark renders differently from Python has a ``.``, an ``E`` or a sign, and ``NaN`` and
``Infinity`` are left to the full rules. Duplicate keys take the last value, like Python.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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

__all__ = [
    "DECODE",
    "HELPER_PREFIX",
    "PARSED_COLUMN",
    "CompiledTopic",
    "compile_topic",
    "parse_sql",
    "sql_string",
]

#: The plain bridge's reason for a value that does not decode (bridges/kafka.py).
DECODE: Final = "decode"
#: Default name of the helper column with the parsed record (shared by all templates).
PARSED_COLUMN: Final = "_topiary_parsed"
#: Default prefix of a template's other helper columns.
HELPER_PREFIX: Final = "_topiary"

# from_json's defaults accept single-quoted strings; Python's json does not, but it does
# accept NaN, Infinity and -Infinity (a field holding one is then bad_value).
_JSON_OPTIONS: Final = "map('allowSingleQuotes', 'false', 'allowNonNumericNumbers', 'true')"
_JSON_WHITESPACE: Final = "concat(' ', chr(9), chr(10), chr(13))"
_INT_TYPES: Final = "('TINYINT', 'SMALLINT', 'INT', 'BIGINT')"
_NON_FINITE: Final = "('\"NaN\"', '\"Infinity\"', '\"-Infinity\"')"
# Array indexes are Java ints in Spark paths; a larger index misses in Python too.
_MAX_INDEX: Final = 2**31 - 1
# Characters that get_json_object's path parser skips before a name (Java's \s).
_JAVA_SPACE: Final = " \t\n\x0b\x0c\r"
_SMALLEST_NORMAL: Final = "2.2250738585072014E-308D"
_NULL_STRING: Final = "CAST(NULL AS STRING)"
# Marks a level that the fast stage leaves to the number stage (never a reason).
_NUMBER: Final = "'#number'"


@dataclass(frozen=True)
class CompiledTopic:
    """A template as Spark SQL: helper columns to add in order, then topic and reason::

        for name, sql in compiled.stages:
            df = df.selectExpr("*", f"{sql} AS `{name}`")
        df = df.selectExpr("*", f"{compiled.topic_sql} AS topic",
                           f"{compiled.reason_sql} AS reason")

    or ``compiled.select(df)``, which does that and drops the helpers again.

    - The first stage, ``parse_sql`` (column ``parsed_column``), reads ``value_column``
      (BINARY or STRING) and is the only one that parses JSON. It is the same for every
      template: templates compiled with different ``prefix`` can share the column.
    - ``fields_sql`` reads each field path once; the next stages apply the value rule.
      ``value_column`` is read again (get_json_object) only for a number that VARIANT
      cannot render as Python does: an integer of 39 digits or more, ``-0.0``, or a
      float beyond BIGINT written with ``.0`` (``12345678901234567890.0``).
    - ``topic_sql``: the topic (STRING), NULL when the record cannot be mapped.
    - ``reason_sql``: NULL when mapped, else the plain bridge's reason code: ``decode``,
      ``missing_field``, ``not_scalar``, ``bad_value`` or ``topic_too_long``.
    """

    template: TopicTemplate
    value_column: str
    parsed_column: str
    stages: tuple[tuple[str, str], ...]
    topic_sql: str
    reason_sql: str

    @property
    def parse_sql(self) -> str:
        return self.stages[0][1]

    @property
    def fields_sql(self) -> str | None:
        """The stage that extracts the fields; None for a template without placeholders."""
        return next((sql for name, sql in self.stages if name.endswith("_fields")), None)

    @property
    def helper_columns(self) -> tuple[str, ...]:
        return tuple(name for name, _sql in self.stages)

    def select(self, df: Any, *, topic: str = "topic", reason: str = "reason") -> Any:
        """``df`` plus ``topic`` and ``reason`` (duck-typed DataFrame: no pyspark here).

        A parsed column that ``df`` already has (another template's) is reused.
        """
        out = df
        added: list[str] = []
        for name, sql in self.stages:
            if name == self.parsed_column and name in out.columns:
                continue
            out = out.selectExpr("*", f"{sql} AS {_ident(name)}")
            added.append(name)
        out = out.selectExpr(
            "*", f"{self.topic_sql} AS {_ident(topic)}", f"{self.reason_sql} AS {_ident(reason)}"
        )
        return out.drop(*added)


def compile_topic(
    template: TopicTemplate | str,
    *,
    value_column: str = "value",
    parsed_column: str = PARSED_COLUMN,
    prefix: str = HELPER_PREFIX,
    shortcut: bool = True,
) -> CompiledTopic:
    """Compile ``template`` (checked by TopicTemplate: TemplateError) into Spark SQL.

    Helper columns are ``parsed_column`` and ``{prefix}_fields``, ``_fast``, ``_levels``
    and ``_mapped``; give each template applied to one DataFrame its own prefix. Lambda
    variables are named ``__*``: keep column names of that form out of the way.

    With the shortcut (when the template allows it: every field a plain top-level key)
    ``{prefix}_words`` and ``{prefix}_short`` come first, and the parse only runs for the
    records the shortcut leaves, so its column is the template's own ``{prefix}_parsed``.
    """
    compiled = template if isinstance(template, TopicTemplate) else TopicTemplate.compile(template)
    short = shortcut and _shortcut_applies(compiled)
    if short:
        parsed_column = f"{prefix}_parsed"
    builder = _Builder(compiled, value_column, parsed_column, prefix)
    stages = [(parsed_column, parse_sql(value_column)), *builder.stages()]
    topic_sql, reason_sql = builder.topic_sql(), builder.reason_sql()
    if short:
        words, gate = f"{prefix}_words", _ident(f"{prefix}_short")
        stages = [
            (words, _words_sql(compiled, value_column)),
            (f"{prefix}_short", _short_sql(compiled, _ident(words))),
            *((name, f"IF({gate} IS NULL, {sql}, NULL)") for name, sql in stages),
        ]
        topic_sql = f"coalesce({gate}, {topic_sql})"
        reason_sql = f"IF({gate} IS NULL, {reason_sql}, {_NULL_STRING})"
    return CompiledTopic(
        template=compiled,
        value_column=value_column,
        parsed_column=parsed_column,
        stages=tuple(stages),
        topic_sql=topic_sql,
        reason_sql=reason_sql,
    )


# --- the shortcut ----------------------------------------------------------------------------

_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A value the shortcut may take as it is: Python and Spark render it the same. No "." or
# "E" after a digit (a float), no leading "-" or "+" (a sign), no JSON escapes, nothing
# that needs percent-encoding, not empty (the default rule).
_WORD: Final = "'^[A-Za-z0-9_][A-Za-z0-9_-]*$'"
_NUMBER_LIKE: Final = "'^[0-9]+[eE]'"
_NON_FINITE_WORDS: Final = "('NaN', 'Infinity', 'INF')"


def _shortcut_applies(template: TopicTemplate) -> bool:
    return bool(template.fields) and all(_PLAIN_KEY.fullmatch(f) for f in template.fields)


def _words_sql(template: TopicTemplate, value_column: str) -> str:
    """The template's fields as STRINGs, inside ``[...]`` like parse_sql (data after the
    object fails or makes a second element); NULL unless UTF-8 ending in ``}``."""
    text = f"CAST({_ident(value_column)} AS STRING)"
    schema = ", ".join(f"{_ident(f)}: STRING" for f in template.fields)
    return (
        f"CASE WHEN is_valid_utf8({text}) AND endswith({text}, '}}') "
        f"THEN from_json(concat('[', {text}, ']'), 'ARRAY<STRUCT<{schema}>>', {_JSON_OPTIONS}) "
        "END"
    )


def _short_sql(template: TopicTemplate, words: str) -> str:
    """The topic when every field is a plain word and the topic fits; else NULL.

    When a non-word character separates every two placeholders (``/`` usually), one
    regular expression over the topic checks all the words at once (~2x cheaper than one
    per field); otherwise each field is checked on its own.
    """
    slots = {p.index: p for p in template._placeholders}
    args, pattern, checks = [], ["^"], [f"size({words}) = 1"]
    separated, previous_was_field = True, False
    for i, piece in enumerate(template._parts):
        placeholder = slots.get(i)
        if placeholder is not None:
            value = f"{words}[0].{_ident(placeholder.path)}"
            args.append(value)
            checks.append(_word_check(value))
            pattern.append(_WORD_PATTERN)
            separated = separated and not previous_was_field
            previous_was_field = True
        elif piece:
            args.append(sql_string(piece))
            pattern.append("".join(_java_regex_char(c) for c in piece))
            if previous_was_field and not _WORD_CHARS.fullmatch(piece):
                previous_was_field = False
    topic = args[0] if len(args) == 1 else f"concat({', '.join(args)})"
    if separated:
        regex = sql_string("".join(pattern) + "$")
        checks = [checks[0], f"{topic} RLIKE {regex}"]
    checks.append(f"octet_length({topic}) <= {MAX_TOPIC_BYTES}")
    return f"CASE WHEN {' AND '.join(f'({c})' for c in checks)} THEN {topic} END"


_WORD_CHARS: Final = re.compile(r"[A-Za-z0-9_-]*")
# One word in a Java regex: not a non-finite number's name, not digits then an exponent.
_WORD_PATTERN: Final = (
    r"(?!(?:NaN|Infinity|INF)(?![A-Za-z0-9_-]))(?![0-9]+[eE])[A-Za-z0-9_][A-Za-z0-9_-]*"
)


def _word_check(value: str) -> str:
    return (
        f"{value} RLIKE {_WORD} AND NOT {value} RLIKE {_NUMBER_LIKE} "
        f"AND {value} NOT IN {_NON_FINITE_WORDS}"
    )


def _java_regex_char(char: str) -> str:
    """``char`` as a literal in a Java regex (a backslash before ASCII punctuation only:
    before a letter it would be a reserved escape)."""
    return "\\" + char if char.isascii() and not char.isalnum() and char != "_" else char


def parse_sql(value_column: str = "value") -> str:
    """The VARIANT of ``[value]``, NULL unless the value is UTF-8 and ends like an object.

    The ``[...]`` wrapper turns trailing data after the first value into a parse error
    (``{..}{..}``) or a second element (``{..},{..}``), both caught by the decode check;
    the ``}`` test catches a stray ``]`` (``{..}]``). A JSON object ends with ``}``.
    """
    text = f"CAST({_ident(value_column)} AS STRING)"
    trimmed = f"TRIM(TRAILING {_JSON_WHITESPACE} FROM {text})"
    return (
        f"CASE WHEN is_valid_utf8({text}) "
        f"AND (endswith({text}, '}}') OR endswith({trimmed}, '}}')) "
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


def _is_index(key: str, position: int) -> bool:
    """Python's rule (mapping._Placeholder): later all-ASCII-digit keys also index lists."""
    return position > 0 and key.isascii() and key.isdigit()


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


class _Names:
    """Fresh lambda variable names, so nested lambdas never shadow each other."""

    def __init__(self) -> None:
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"__t{self.count}"


def _let(value: str, var: str, body: str) -> str:
    """``body`` with ``var`` bound to ``value``, evaluated once (Spark SQL has no LET)."""
    return f"transform(array({value}), {var} -> {body})[0]"


def _detached(array: str, other: str) -> str:
    """``array`` unchanged, paired with ``other`` of the same length, via ``zip_with``.

    zip_with has no code generation, so a projection that uses it is left out of Spark's
    whole-stage codegen. There all the stages would share one generated method far over
    the JVM's 8000-byte JIT limit and run about 4 times slower (measured; setting
    spark.sql.codegen.hugeMethodLimit=8000 has the same effect, but only per session).
    The expressions around it are still compiled, in methods of their own.
    """
    return f"zip_with({array}, {other}, (__a, __b) -> __a)"


def _map(array: str, var: str, body: str, other: str) -> str:
    """``transform`` over ``array`` in a projection of its own (see :func:`_detached`)."""
    return f"transform({_detached(array, other)}, {var} -> {body})"


def _bind(value: str, var: str, body: str) -> str:
    """:func:`_let` in a projection of its own (see :func:`_detached`)."""
    return _map(f"array({value})", var, body, "array(0)") + "[0]"


def _result(missing: str, value: str, reason: str) -> str:
    """One field's outcome: missing?, encoded text, reason (other than missing_field)."""
    return f"named_struct('m', {missing}, 'v', {value}, 'r', {reason})"


def _ok(value: str) -> str:
    return _result("false", value, _NULL_STRING)


def _error(reason: str) -> str:
    return _result("false", _NULL_STRING, sql_string(reason))


_MISSING: Final = _result("true", _NULL_STRING, _NULL_STRING)


# --- the value rule in SQL -----------------------------------------------------------------


def _replace_all(text: str, chars: Sequence[str]) -> str:
    """Nested ``replace`` calls turning each of ``chars`` into ``%XX``, in order."""
    for ch in chars:
        search = f"chr({ord(ch)})" if ord(ch) < 0x20 or ord(ch) == 0x7F else sql_string(ch)
        text = f"replace({text}, {search}, '%{ord(ch):02X}')"
    return text


# encode_level's characters other than the controls: '%' first, or its own escapes would
# get escaped again.
_PRINTABLE: Final = [ch for ch in _ESCAPED if 0x20 <= ord(ch) < 0x7F]
assert _PRINTABLE[0] == "%"
_BACKSLASH: Final = "chr(92)"
# JSON escapes in to_json's output (Jackson writes the other C0 controls as \u00XX, in
# uppercase hex) and what encode_level makes of the character each stands for.
_JSON_ESCAPES: Final = (
    ('"', "'\"'"),
    ("b", "'%08'"),
    ("t", "'%09'"),
    ("n", "'%0A'"),
    ("f", "'%0C'"),
    ("r", "'%0D'"),
    ("u00", "'%'"),
)


def _encode_json_string(json: str) -> str:
    """encode_level for the text of a JSON string as to_json writes it (``"..."``).

    Works on the escaped form, so no cast back to a string is needed: the plain
    characters are replaced first (``%`` first), DEL (never escaped by JSON) next, then
    an escaped backslash is parked as chr(1) (no control character is ever raw in JSON),
    the other escapes become ``%XX`` or their character, and chr(1) a backslash again.
    """
    dollar = f"startswith({json}, '\"$')"
    start = f"IF({dollar}, 3, 2)"
    text = _replace_all(f"substr({json}, {start}, length({json}) - {start})", _PRINTABLE)
    text = f"replace({text}, chr(127), '%7F')"
    text = f"replace({text}, concat({_BACKSLASH}, {_BACKSLASH}), chr(1))"
    for escape, replacement in _JSON_ESCAPES:
        text = f"replace({text}, concat({_BACKSLASH}, {sql_string(escape)}), {replacement})"
    text = f"replace({text}, chr(1), {_BACKSLASH})"
    return f"concat(IF({dollar}, '%24', ''), {text})"


def _fast_rule(field: str) -> str:
    """One field (``j`` its to_json text) -> m/v/r struct, or the number marker.

    The JSON text tells null, booleans, objects, arrays and strings apart; NaN and the
    infinities are written as strings (``"NaN"``), so those go with the numbers.
    """
    j = f"{field}.j"
    return (
        f"CASE WHEN {j} IS NULL OR {j} = 'null' OR {j} = '\"\"' THEN {_MISSING} "
        f"WHEN {j} IN ('true', 'false') THEN {_ok(j)} "
        f"WHEN startswith({j}, '{{') OR startswith({j}, '[') THEN {_error(NOT_SCALAR)} "
        f"WHEN startswith({j}, '\"') AND {j} NOT IN {_NON_FINITE} "
        f"THEN {_ok(_encode_json_string(j))} "
        f"ELSE {_result('false', _NULL_STRING, _NUMBER)} END"
    )


def _shortest(shape: str, number: str, names: _Names) -> str:
    """The shortest digits that read back as ``number``, closest first (Python's repr).

    ``shape`` has Java's digits; on JDK < 19 they can be longer than needed. For each
    length, the digits cut there (``lo``) and one unit above (``hi``) are the candidates
    next to the value; the first length where one reads back equal wins, and when both
    do, the cut-off tail of Java's digits says which is closer.
    """
    q, c, x = names.fresh(), names.fresh(), names.fresh()
    d, point, sign = f"{shape}.d", f"{shape}.p", f"{shape}.s"
    hi = f"CAST(try_cast(substr({d}, 1, {q}) AS DECIMAL(20, 0)) + 1 AS STRING)"
    candidates = (
        f"transform(sequence(1, length({d})), {q} -> named_struct("
        f"'lo', substr({d}, 1, {q}), 'hi', {hi}, "
        f"'hp', {point} + IF(length({hi}) > {q}, 1, 0), 'tail', substr({d}, {q} + 1)))"
    )

    def reads_back(digits: str, at: str) -> str:
        text = f"concat({sign}, '0.', {digits}, 'E', CAST({at} AS STRING))"
        return f"coalesce(try_cast({text} AS DOUBLE) = {number}, false)"

    lo_ok, hi_ok = reads_back(f"{c}.lo", point), reads_back(f"{c}.hi", f"{c}.hp")
    flags = f"transform({candidates}, {c} -> named_struct('lo', {lo_ok}, 'hi', {hi_ok}, 'c', {c}))"
    take_lo = f"{x}.lo AND (NOT {x}.hi OR {x}.c.tail < '5')"
    first = f"try_element_at(filter({flags}, {x} -> {x}.lo OR {x}.hi), 1)"
    pick = (
        f"named_struct('s', {sign}, "
        f"'d', TRIM(TRAILING '0' FROM IF({take_lo}, {x}.c.lo, {x}.c.hi)), "
        f"'p', IF({take_lo}, {point}, {x}.c.hp))"
    )
    return f"coalesce({_let(first, x, f'IF({x} IS NULL, NULL, {pick})')}, {shape})"


def _python_float(number: str, names: _Names) -> str:
    """Python's ``repr`` of the finite DOUBLE ``number``, with ``e+`` written ``e``.

    Java's Double.toString gives the digits (made shortest by :func:`_shortest` when
    they may not be: 16 digits or more, or a subnormal); they are laid out the way Python
    does: exponent form when the decimal point is over 16 or under -3 places away.
    """
    java, n, f, g = names.fresh(), names.fresh(), names.fresh(), names.fresh()
    pattern = "'^(-?)([0-9]+)(?:[.]([0-9]*))?(?:[eE]([-+]?[0-9]+))?$'"
    parts = (
        f"named_struct('s', regexp_extract({java}, {pattern}, 1), "
        f"'i', regexp_extract({java}, {pattern}, 2), "
        f"'raw', concat(regexp_extract({java}, {pattern}, 2), "
        f"regexp_extract({java}, {pattern}, 3)), "
        f"'e', coalesce(try_cast(nullif(regexp_extract({java}, {pattern}, 4), '') AS INT), 0))"
    )
    # digits without leading and trailing zeros, and the decimal point's position:
    # number = 0.DIGITS * 10^point
    stripped = f"TRIM(LEADING '0' FROM {n}.raw)"
    shape = (
        f"named_struct('s', {n}.s, 'd', TRIM(TRAILING '0' FROM {stripped}), "
        f"'p', length({n}.i) + {n}.e - (length({n}.raw) - length({stripped})))"
    )
    subnormal = f"(abs({number}) < {_SMALLEST_NORMAL} AND {number} != 0)"
    best = f"IF(length({f}.d) >= 16 OR {subnormal}, {_shortest(f, number, names)}, {f})"
    d, point = f"{g}.d", f"{g}.p"
    exponent = f"abs({point} - 1)"
    layout = (
        f"CASE WHEN {d} = '' THEN concat({g}.s, '0.0') "
        f"WHEN {point} > -4 AND {point} <= 16 THEN concat({g}.s, CASE "
        f"WHEN {point} <= 0 THEN concat('0.', repeat('0', -{point}), {d}) "
        f"WHEN {point} >= length({d}) THEN concat({d}, repeat('0', {point} - length({d})), '.0') "
        f"ELSE concat(substr({d}, 1, {point}), '.', substr({d}, {point} + 1)) END) "
        f"ELSE concat({g}.s, substr({d}, 1, 1), "
        f"IF(length({d}) > 1, concat('.', substr({d}, 2)), ''), 'e', "
        f"IF({point} <= 0, '-', ''), IF({exponent} < 10, '0', ''), CAST({exponent} AS STRING)) "
        "END"
    )
    return _let(
        f"CAST({number} AS STRING)",
        java,
        _let(parts, n, _let(shape, f, _let(best, g, layout))),
    )


def _number(field: str, kind: str, value_text: str, names: _Names) -> str:
    """A DECIMAL or DOUBLE field: Python's text for the int or float the JSON held.

    VARIANT stores integers beyond BIGINT as DECIMAL(p,0) and beyond 38 digits as DOUBLE,
    and also turns ``1.0`` and ``-0.0`` into DECIMAL(p,0); for those few the literal is
    read again with get_json_object, which keeps an integer's digits (and the sign of
    ``-0.0``). to_json writes NaN and the infinities quoted, so they do not cast.
    """
    j = f"{field}.j"
    d, r, k = names.fresh(), names.fresh(), names.fresh()
    int_like = (
        f"startswith({kind}, 'DECIMAL') AND endswith({kind}, ',0)') "
        f"AND ({j} = '0' OR try_cast({j} AS BIGINT) IS NULL)"
    )
    huge = f"{kind} IN ('DOUBLE', 'FLOAT') AND abs({d}) >= 1E38D"
    raw = f"IF(({int_like}) OR ({huge}), get_json_object({value_text}, {field}.g), NULL)"
    split = (
        f"named_struct('iv', CASE WHEN {r} RLIKE '^-?[0-9]+$' THEN {r} "
        f"WHEN {r} IS NULL AND {int_like} AND {j} != '0' THEN {j} END, "
        f"'dv', coalesce(try_cast({r} AS DOUBLE), {d}))"
    )
    pick = (
        f"CASE WHEN {k}.iv IS NOT NULL THEN {_ok(f'{k}.iv')} "
        f"ELSE {_ok(_python_float(f'{k}.dv', names))} END"
    )
    checked = (
        f"CASE WHEN {d} IS NULL OR isnan({d}) OR abs({d}) = CAST('Infinity' AS DOUBLE) "
        f"THEN {_error(BAD_VALUE)} ELSE {_let(raw, r, _let(split, k, pick))} END"
    )
    return _let(f"try_cast({j} AS DOUBLE)", d, checked)


def _numeric_rule(field: str, value_text: str, names: _Names) -> str:
    """A field the fast rule left over, by its VARIANT type (``"NaN"`` may be a string)."""
    kind = names.fresh()
    j = f"{field}.j"
    rule = (
        f"CASE WHEN {kind} = 'STRING' THEN {_ok(_encode_json_string(j))} "
        f"WHEN {kind} IN {_INT_TYPES} THEN {_ok(j)} "
        f"WHEN startswith({kind}, 'DECIMAL') OR {kind} IN ('DOUBLE', 'FLOAT') "
        f"THEN {_number(field, kind, value_text, names)} "
        f"ELSE {_error(BAD_VALUE)} END"
    )
    return _let(f"schema_of_variant({field}.f)", kind, rule)


# --- the template --------------------------------------------------------------------------


class _Builder:
    """Builds the stages and the two outputs for one template."""

    def __init__(self, template: TopicTemplate, value: str, parsed: str, prefix: str) -> None:
        self.template = template
        self.value = _ident(value)
        self.parsed = _ident(parsed)
        self.names = tuple(f"{prefix}_{n}" for n in ("fields", "fast", "levels", "mapped"))
        self.fields, self.fast, self.levels, self.mapped = (_ident(n) for n in self.names)
        # TopicTemplate's compiled form: literal parts with a slot for each placeholder.
        self.parts: list[str] = list(template._parts)
        self.placeholders = template._placeholders
        self.paths = list(template.fields)  # distinct paths, in template order

    def stages(self) -> list[tuple[str, str]]:
        if not self.paths:
            return [(self.names[3], self.mapped_sql())]
        sqls = (self.fields_sql(), self.fast_sql(), self.levels_sql(), self.mapped_sql())
        return list(zip(self.names, sqls, strict=True))

    # -- stages ------------------------------------------------------------------------------

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
        return sql_string("$" + "".join(s for s in segments if s))

    def fields_sql(self) -> str:
        """ARRAY<STRUCT<f VARIANT, j STRING, g STRING>>: each distinct path read once."""
        names = _Names()
        fields = ", ".join(
            f"named_struct('f', {self.extract(path.split('.'), names)}, "
            f"'g', {self.json_path(path.split('.'))})"
            for path in self.paths
        )
        x = names.fresh()
        zeros = f"array({', '.join('0' for _ in self.paths)})"
        body = f"named_struct('f', {x}.f, 'j', to_json({x}.f), 'g', {x}.g)"
        return _map(f"array({fields})", x, body, zeros)

    def fast_sql(self) -> str:
        """ARRAY<STRUCT<m, v, r>>: everything but numbers."""
        return _map(self.fields, "__f", _fast_rule("__f"), self.fields)

    def levels_sql(self) -> str:
        """The fast levels with numbers filled in, by pairs of fast level and field.

        Its lambda is the biggest expression by far, so it stays inside zip_with and out
        of generated code (see :func:`_detached`): rows without numbers only run the
        ``exists`` test.
        """
        names = _Names()
        level, field = names.fresh(), names.fresh()
        numeric = _numeric_rule(field, f"CAST({self.value} AS STRING)", names)
        fill = (
            f"zip_with({self.fast}, {self.fields}, ({level}, {field}) -> "
            f"IF({level}.r = {_NUMBER}, {numeric}, {level}))"
        )
        return f"IF(exists({self.fast}, __l -> __l.r = {_NUMBER}), {fill}, {self.fast})"

    def mapped_sql(self) -> str:
        """STRUCT<topic, reason>: the record's outcome, from the levels."""
        t = "__t"
        reason = f"coalesce({', '.join([*self.reasons(), _too_long(t)])})"
        body = (
            f"CASE WHEN {self.decode_failed()} "
            f"THEN named_struct('topic', {_NULL_STRING}, 'reason', {sql_string(DECODE)}) "
            f"ELSE named_struct('topic', IF({_too_long(t)} IS NULL, {t}, {_NULL_STRING}), "
            f"'reason', {reason}) END"
        )
        return _bind(self.topic(), t, body)

    # -- outputs -----------------------------------------------------------------------------

    def decode_failed(self) -> str:
        """Not JSON, not one value, or not an object at the top level."""
        p = self.parsed
        return (
            f"({p} IS NULL OR variant_get({p}, '$[1]') IS NOT NULL "
            f"OR try_variant_get({p}, '$[0]', 'struct<>') IS NULL)"
        )

    def topic(self) -> str:
        """``concat`` of literals and values; NULL if any value is."""
        if not self.paths:
            return sql_string(self.template.sample_topic())
        slots = {p.index: p for p in self.placeholders}
        args = []
        for i, piece in enumerate(self.parts):
            p = slots.get(i)
            if p is None:
                if piece:
                    args.append(sql_string(piece))
                continue
            level = f"{self.levels}[{self.paths.index(p.path)}]"
            default = _NULL_STRING if p.default is None else sql_string(p.default)
            args.append(f"IF({level}.m, {default}, {level}.v)")
        return args[0] if len(args) == 1 else f"concat({', '.join(args)})"

    def reasons(self) -> list[str]:
        """Each placeholder's reason, in template order (Python stops at the first)."""
        out = []
        for p in self.placeholders:
            level = f"{self.levels}[{self.paths.index(p.path)}]"
            if p.default is None:
                out.append(f"IF({level}.m, {sql_string(MISSING_FIELD)}, {level}.r)")
            else:
                out.append(f"{level}.r")
        return out

    def topic_sql(self) -> str:
        return f"{self.mapped}.topic"

    def reason_sql(self) -> str:
        return f"{self.mapped}.reason"


def _too_long(topic: str) -> str:
    """``topic_too_long`` when over the limit, else NULL (also for a NULL topic)."""
    return (
        f"IF(octet_length({topic}) > {MAX_TOPIC_BYTES}, "
        f"{sql_string(TOPIC_TOO_LONG)}, {_NULL_STRING})"
    )
