"""routing/acl.py: every decision checked against a brute-force reference.

The reference knows nothing of tries or covering: it enumerates every topic of a small
universe (levels from {a, b, ab, $s, $t}, depth 1..4) and matches each with the regex
matcher of tests/reference.py. Rules have at most three fixed levels, so a topic one level
deeper than any rule is in the universe, and the values tell prefixes (``a*``: ``a`` and
``ab``) and system topics (``$*``: ``$s`` and ``$t``) apart: covering over the universe is
covering over every valid topic. Substitution is redone by plain string replacement.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing import parse_filter
from routing.acl import (
    PUBLISH,
    SUBSCRIBE,
    Access,
    Policy,
    Rule,
    example_topic,
    safe_name,
)
from tests.reference import ref_matches

VALUES = ("a", "b", "ab", "$s", "$t")
UNIVERSE = tuple(
    "/".join(levels) for depth in range(1, 5) for levels in itertools.product(VALUES, repeat=depth)
)
NAMES = ("a", "b", "ab", "$s", "a/b", "+", "#", "*", ">", "", "%c", "a\x00")
WHO = ("*", "user:a", "user:b", "user:ab", "group:g1", "group:g2", "cert:CN=x", "cert:CN=y,O=z")


@dataclass(frozen=True)
class Who:
    user: str | None
    groups: frozenset[str]
    cert: str | None


@cache
def matched(text: str, dialect: str) -> frozenset[str]:
    """The universe's topics a (substituted) filter matches."""
    return frozenset(t for t in UNIVERSE if ref_matches(text, dialect, t))


def ref_name_ok(name: str | None) -> bool:
    if name is None or name == "" or name[0] == "$":
        return False
    return not any(c in name for c in "/+#*>%\x00")


def ref_substitute(rule: Rule, user: str | None, client: str | None) -> str | None:
    """The rule's filter text for this client, or None when it applies to nothing."""
    text = rule.filter
    if "%u" in text and not ref_name_ok(user):
        return None
    if "%c" in text and not ref_name_ok(client):
        return None
    out, i = [], 0
    while i < len(text):  # one pass, so a name holding "%c" is never substituted again
        if text.startswith("%u", i):
            out.append(user)
            i += 2
        elif text.startswith("%c", i):
            out.append(client)
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)  # type: ignore[arg-type]


def ref_applies(rule: Rule, who: Who) -> bool:
    if rule.who == "*":
        return True
    kind, name = rule.who.split(":", 1)
    if kind == "user":
        return who.user == name
    if kind == "group":
        return who.user is not None and name in who.groups
    return who.cert == name


def ref_sets(rules: list[Rule], who: Who, client: str) -> dict[tuple[str, str], list[str]]:
    """(allow|deny, action) -> the substituted filters' texts, with their dialects."""
    sets: dict[tuple[str, str], list] = {
        (kind, action): [] for kind in ("allow", "deny") for action in (PUBLISH, SUBSCRIBE)
    }
    for rule in rules:
        if not ref_applies(rule, who):
            continue
        text = ref_substitute(rule, who.user, client)
        if text is None:
            continue
        for action in rule.allow:
            sets["allow", action].append((text, rule.dialect))
        for action in rule.deny:
            sets["deny", action].append((text, rule.dialect))
    return sets


def ref_may_publish(sets: dict, topic: str) -> bool:
    return any(ref_matches(t, d, topic) for t, d in sets["allow", PUBLISH]) and not any(
        ref_matches(t, d, topic) for t, d in sets["deny", PUBLISH]
    )


def ref_may_subscribe(sets: dict, text: str, dialect: str) -> bool:
    wanted = matched(text, dialect)
    return any(wanted <= matched(t, d) for t, d in sets["allow", SUBSCRIBE])


def ref_denies(sets: dict, topic: str) -> bool:
    return any(ref_matches(t, d, topic) for t, d in sets["deny", SUBSCRIBE])


# -- strategies ---------------------------------------------------------------------------

NATIVE_LEVELS = ("a", "b", "ab", "$s", "*", "a*", "$*", "%u", "%c")
MQTT_LEVELS = ("a", "b", "ab", "$s", "+", "%u", "%c")


@st.composite
def filter_texts(draw: st.DrawFn, names: bool = True) -> tuple[str, str]:
    dialect = draw(st.sampled_from(("native", "mqtt")))
    pool = NATIVE_LEVELS if dialect == "native" else MQTT_LEVELS
    if not names:
        pool = tuple(p for p in pool if "%" not in p)
    levels = draw(st.lists(st.sampled_from(pool), min_size=0, max_size=3))
    if draw(st.booleans()) or not levels:
        levels.append(">" if dialect == "native" else "#")
    return "/".join(levels), dialect


@st.composite
def rules(draw: st.DrawFn) -> Rule:
    text, dialect = draw(filter_texts())
    actions = draw(st.sampled_from([(PUBLISH,), (SUBSCRIBE,), (PUBLISH, SUBSCRIBE)]))
    if draw(st.booleans()):
        allow, deny = frozenset(actions), frozenset()
    else:
        allow, deny = frozenset(), frozenset(actions)
    who = "*" if draw(st.booleans()) else draw(st.sampled_from(WHO))  # most rules: for all
    return Rule(who, text, dialect, allow, deny)


principals = st.builds(
    Who,
    user=st.one_of(st.none(), st.sampled_from(NAMES)),
    groups=st.frozensets(st.sampled_from(("g1", "g2"))),
    cert=st.sampled_from((None, "CN=x", "CN=y,O=z")),
)
clients = st.sampled_from(NAMES)


# -- the properties -----------------------------------------------------------------------


@given(st.lists(rules(), max_size=6), principals, clients)
def test_publish_decisions_equal_the_reference_on_every_topic(
    rule_list: list[Rule], who: Who, client: str
) -> None:
    access = Policy(rule_list).access(who, client)
    sets = ref_sets(rule_list, who, client)
    for topic in UNIVERSE:
        assert access.may_publish(topic) is ref_may_publish(sets, topic), topic


@given(st.lists(rules(), max_size=6), principals, clients)
def test_deny_subscribe_matches_equal_the_reference_on_every_topic(
    rule_list: list[Rule], who: Who, client: str
) -> None:
    access = Policy(rule_list).access(who, client)
    sets = ref_sets(rule_list, who, client)
    assert access.has_denies is bool(sets["deny", SUBSCRIBE])
    for topic in UNIVERSE:
        assert access.denies(topic) is ref_denies(sets, topic), topic


def near(text: str, dialect: str, edit: int, where: int) -> str:
    """A filter close to a rule's (so that covering questions are close calls): the same,
    one level made a wildcard or a literal, the last level dropped, or a tail added."""
    levels = text.split("/")
    star, rest = ("*", ">") if dialect == "native" else ("+", "#")
    i = where % len(levels)
    if edit == 1:
        levels[i] = star
    elif edit == 2:
        levels[i] = "ab"
    elif edit == 3 and len(levels) > 1:
        levels.pop()
    elif edit == 4 and levels[-1] != rest:
        levels.append(rest)
    elif edit == 5:
        levels.append("a")
    return "/".join(levels)


@given(
    st.lists(rules(), min_size=1, max_size=6),
    principals,
    clients,
    st.lists(filter_texts(names=False), max_size=4),
    st.integers(0, 5),
)
def test_subscribe_decisions_equal_the_reference(
    rule_list: list[Rule], who: Who, client: str, wanted: list[tuple[str, str]], where: int
) -> None:
    access = Policy(rule_list).access(who, client)
    sets = ref_sets(rule_list, who, client)
    close = []  # every edit of every rule's filter (as substituted for some safe names)
    for rule in rule_list:
        user = who.user if ref_name_ok(who.user) else "a"
        text = ref_substitute(rule, user, client if ref_name_ok(client) else "b")
        assert text is not None
        close += [(near(text, rule.dialect, edit, where), rule.dialect) for edit in range(6)]
    for text, dialect in wanted + close:
        try:
            parse_filter(text, dialect)
        except ValueError:
            continue  # an edit made it invalid
        expected = ref_may_subscribe(sets, text, dialect)
        assert access.may_subscribe(parse_filter(text, dialect)) is expected, (text, dialect)
        # asked again: the kept answer
        assert access.may_subscribe(parse_filter(text, dialect)) is expected


@given(filter_texts(names=False))
def test_the_example_topic_of_a_filter_is_one_it_matches(wanted: tuple[str, str]) -> None:
    flt = parse_filter(*wanted)
    topic = example_topic(flt)
    assert topic is not None
    assert flt.matches(topic)


# -- examples -----------------------------------------------------------------------------

ANON = Who(None, frozenset(), None)


def test_a_rule_with_a_user_placeholder_never_applies_to_an_anonymous_client() -> None:
    policy = Policy([Rule("*", "user/%u/>", allow=frozenset({PUBLISH}))])
    assert not policy.access(ANON, "c1").may_publish("user/c1/x")
    assert policy.access(Who("bob", frozenset(), None), "c1").may_publish("user/bob/x")


@pytest.mark.parametrize("name", ["", "a/b", "+", "#", "*", ">", "$SYS", "%u", "a\x00b"])
def test_an_unsafe_client_id_makes_its_rules_apply_to_nothing(name: str) -> None:
    assert not safe_name(name)
    policy = Policy([Rule("*", "dev/%c/#", "mqtt", allow=frozenset({PUBLISH, SUBSCRIBE}))])
    access = policy.access(ANON, name)
    assert not access.may_subscribe(parse_filter("dev/#", "mqtt"))
    assert not access.may_subscribe(parse_filter("#", "mqtt"))
    assert not access.may_publish("dev/x")


def test_a_name_too_long_for_the_filter_makes_the_rule_apply_to_nothing() -> None:
    policy = Policy([Rule("*", "dev/%c", allow=frozenset({PUBLISH}))])
    assert not policy.access(ANON, "x" * 250).may_publish("dev/" + "x" * 240)


def test_a_wider_subscription_than_any_rule_is_refused_and_a_narrower_one_granted() -> None:
    policy = Policy([Rule("*", "user/%c/#", "mqtt", allow=frozenset({SUBSCRIBE}))])
    access = policy.access(ANON, "c1")
    assert access.may_subscribe(parse_filter("user/c1/+/x", "mqtt"))
    assert access.may_subscribe(parse_filter("user/c1/>"))
    assert not access.may_subscribe(parse_filter("user/+/x", "mqtt"))
    assert not access.may_subscribe(parse_filter("user/#", "mqtt"))


def test_a_rule_that_matches_some_topics_of_a_filter_does_not_grant_it() -> None:
    access = Policy([Rule("*", "a/*", allow=frozenset({SUBSCRIBE}))]).access(ANON, "c")
    assert access.may_subscribe(parse_filter("a/b"))
    assert not access.may_subscribe(parse_filter("a/>"))
    assert not access.may_subscribe(parse_filter("a/#", "mqtt"))


def test_user_group_and_certificate_rules_name_only_their_clients() -> None:
    policy = Policy(
        [
            Rule("user:ann", "u/>", allow=frozenset({PUBLISH})),
            Rule("group:ops", "g/>", allow=frozenset({PUBLISH})),
            Rule("cert:CN=dev1,O=Acme", "c/>", allow=frozenset({PUBLISH})),
        ]
    )
    ann = policy.access(Who("ann", frozenset({"ops"}), None), "x")
    bob = policy.access(Who("bob", frozenset(), "CN=dev1,O=Acme"), "x")
    assert (ann.may_publish("u/1"), ann.may_publish("g/1"), ann.may_publish("c/1")) == (
        True,
        True,
        False,
    )
    assert (bob.may_publish("u/1"), bob.may_publish("g/1"), bob.may_publish("c/1")) == (
        False,
        False,
        True,
    )


def test_clients_with_the_same_rules_and_names_share_one_access() -> None:
    policy = Policy(
        [
            Rule("*", "public/>", allow=frozenset({SUBSCRIBE})),
            Rule("*", "dev/%c/>", allow=frozenset({PUBLISH})),
            Rule("user:ann", "x/>", allow=frozenset({PUBLISH})),
        ]
    )
    assert policy.access(ANON, "c1") is policy.access(ANON, "c1")
    assert policy.access(ANON, "c1") is not policy.access(ANON, "c2")
    no_names = Policy([Rule("*", "public/>", allow=frozenset({SUBSCRIBE}))])
    assert no_names.access(ANON, "c1") is no_names.access(Who("z", frozenset(), None), "c2")


def test_an_access_without_deny_subscribe_rules_says_so() -> None:
    policy = Policy(
        [
            Rule("*", "a/>", allow=frozenset({PUBLISH, SUBSCRIBE})),
            Rule("*", "a/b", deny=frozenset({PUBLISH})),
        ]
    )
    assert not policy.access(ANON, "c").has_denies
    assert not Access().has_denies


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"who": "bob"}, "who must be"),
        ({"who": "user:"}, "who must be"),
        ({"allow": frozenset({"read"})}, "allow may hold"),
        ({"allow": frozenset()}, "allow and deny are empty"),
        ({"deny": frozenset({PUBLISH})}, "both allowed and denied"),
        ({"filter": "a/>/b"}, "'>' must be the last level"),
        ({"dialect": "amqp"}, "dialect must be"),
    ],
)
def test_a_bad_rule_says_what_is_wrong(kwargs: dict, problem: str) -> None:
    fields = {"who": "*", "filter": "a/>", "allow": frozenset({PUBLISH})} | kwargs
    with pytest.raises(ValueError, match=problem):
        Rule(**fields)
