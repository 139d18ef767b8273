"""Route summarization: the advertised set stays minimal and complete, as deltas.

Scenario tests pin the behaviours peers rely on (beacon/eu/> hiding its
sites, refcounts, dialect twins, the `$` rule, filters that match nothing);
a state machine over a tiny alphabet of filters, where covering, twins and
the `$` rule collide constantly, checks the invariants after every step
against brute force with covers().
"""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from routing import MQTT, NATIVE, Filter, Summarizer, SummaryChange, TopicError, covers
from routing.filters import parse_filter
from routing.summary import matches_nothing, sample_levels
from tests.reference import ref_matches

SITES = 200


def f(text: str, dialect: str = NATIVE) -> Filter:
    return parse_filter(text, dialect)


def sites() -> list[Filter]:
    return [f(f"beacon/eu/c{i}/site{i}/*") for i in range(SITES)]


def test_a_lone_filter_is_advertised() -> None:
    summary = Summarizer()
    change = summary.add(f("beacon/eu/>"))
    assert change == SummaryChange((f("beacon/eu/>"),), ())
    assert summary.advertised == {f("beacon/eu/>")}
    assert summary.is_advertised(f("beacon/eu/>"))


def test_filters_under_a_coverer_are_not_advertised() -> None:
    summary = Summarizer()
    summary.add(f("beacon/eu/>"))
    changes = [summary.add(site) for site in sites()]
    assert not any(changes)
    assert summary.advertised == {f("beacon/eu/>")}
    assert summary.statistics() == {"local": SITES + 1, "advertised": 1, "covered": SITES}


def test_removing_the_coverer_advertises_what_it_covered_in_one_change() -> None:
    summary = Summarizer()
    summary.add(f("beacon/eu/>"))
    for site in sites():
        summary.add(site)
    change = summary.remove(f("beacon/eu/>"))
    assert change.withdraw == (f("beacon/eu/>"),)
    assert set(change.advertise) == set(sites())
    assert len(change.advertise) == SITES
    assert summary.advertised == set(sites())


def test_adding_a_coverer_withdraws_what_it_covers_in_one_change() -> None:
    summary = Summarizer()
    for site in sites():
        summary.add(site)
    change = summary.add(f("beacon/eu/>"))
    assert change.advertise == (f("beacon/eu/>"),)
    assert set(change.withdraw) == set(sites())
    assert summary.advertised == {f("beacon/eu/>")}


def remove_a_coverer_of_nested_filters() -> SummaryChange:
    summary = Summarizer()
    summary.add(f("beacon/>"))
    for text in ("beacon/eu/de/site1", "beacon/eu/*/site1", "beacon/eu/>", "beacon/eu/d*/>"):
        summary.add(f(text))
    return summary.remove(f("beacon/>"))


def test_uncovered_filters_that_nest_advertise_only_the_widest() -> None:
    change = remove_a_coverer_of_nested_filters()
    assert change == SummaryChange((f("beacon/eu/>"),), (f("beacon/>"),))


def test_the_change_does_not_depend_on_the_order_uncovered_filters_are_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Narrowest first: each is advertised, then withdrawn again by a wider one in the same
    # pass, and must drop out of the change rather than be listed as advertised and withdrawn.
    widest_first = Summarizer._widest_first
    monkeypatch.setattr(
        Summarizer, "_widest_first", lambda self, flt: [-k for k in widest_first(self, flt)]
    )
    change = remove_a_coverer_of_nested_filters()
    assert change == SummaryChange((f("beacon/eu/>"),), (f("beacon/>"),))


def test_a_filter_another_advertised_filter_covers_stays_covered() -> None:
    summary = Summarizer()
    summary.add(f("beacon/eu/>"))
    summary.add(f("beacon/*/de"))
    summary.add(f("beacon/eu/de"))  # covered by both
    summary.add(f("beacon/eu/fr"))  # covered by beacon/eu/> only
    change = summary.remove(f("beacon/eu/>"))
    assert change == SummaryChange((f("beacon/eu/fr"),), (f("beacon/eu/>"),))
    assert summary.advertised == {f("beacon/*/de"), f("beacon/eu/fr")}


def test_removing_a_covered_filter_changes_nothing() -> None:
    summary = Summarizer()
    summary.add(f("beacon/eu/>"))
    summary.add(f("beacon/eu/de"))
    assert not summary.remove(f("beacon/eu/de"))
    assert summary.advertised == {f("beacon/eu/>")}


def test_a_second_reference_changes_nothing() -> None:
    summary = Summarizer()
    assert summary.add(f("a/b"))
    assert not summary.add(f("a/b"))
    assert len(summary) == 1
    assert summary.refcount(f("a/b")) == 2


def test_removing_one_of_two_references_keeps_the_filter() -> None:
    summary = Summarizer()
    summary.add(f("a/b"))
    summary.add(f("a/b"))
    assert not summary.remove(f("a/b"))
    assert f("a/b") in summary
    assert summary.advertised == {f("a/b")}
    assert summary.remove(f("a/b")) == SummaryChange((), (f("a/b"),))
    assert f("a/b") not in summary


def test_removing_an_unknown_filter_raises_key_error() -> None:
    summary = Summarizer()
    with pytest.raises(KeyError):
        summary.remove(f("a/b"))
    summary.add(f("a/b"))
    with pytest.raises(KeyError):
        summary.remove(f("a/b", MQTT))  # same text, other dialect: another filter
    summary.remove(f("a/b"))
    with pytest.raises(KeyError):
        summary.remove(f("a/b"))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (f("a/*"), f("a/+", MQTT)),
        (f("a/+", MQTT), f("a/*")),
        (f("a/>"), f("a/+/#", MQTT)),
        (f("a/b"), f("a/b", MQTT)),
    ],
)
def test_of_equivalent_filters_the_first_is_advertised(first: Filter, second: Filter) -> None:
    assert covers(first, second) and covers(second, first)
    summary = Summarizer()
    summary.add(first)
    assert not summary.add(second)
    assert summary.advertised == {first}


def test_removing_the_advertised_twin_advertises_the_other() -> None:
    summary = Summarizer()
    summary.add(f("a/*"))
    summary.add(f("a/+", MQTT))
    change = summary.remove(f("a/*"))
    assert change == SummaryChange((f("a/+", MQTT),), (f("a/*"),))


def test_when_a_coverer_goes_the_oldest_of_equivalent_filters_is_advertised() -> None:
    summary = Summarizer()
    summary.add(f("a/>"))
    summary.add(f("a/+", MQTT))
    summary.add(f("a/*"))
    summary.add(f("a/b"))
    change = summary.remove(f("a/>"))
    assert change == SummaryChange((f("a/+", MQTT),), (f("a/>"),))


def test_a_wildcard_first_filter_does_not_cover_a_system_topic() -> None:
    summary = Summarizer()
    summary.add(f(">"))
    assert summary.add(f("$sys/x")) == SummaryChange((f("$sys/x"),), ())
    assert summary.add(f("#", MQTT)) == SummaryChange((), ())  # twin of '>'
    assert summary.advertised == {f(">"), f("$sys/x")}


def test_a_system_filter_covers_system_topics_below_it() -> None:
    summary = Summarizer()
    summary.add(f("$sys/>"))
    assert not summary.add(f("$sys/a/b"))
    change = summary.add(f("$sys/#", MQTT))  # also matches "$sys": wider
    assert change == SummaryChange((f("$sys/#", MQTT),), (f("$sys/>"),))


def test_a_dollar_level_below_the_first_is_an_ordinary_level() -> None:
    summary = Summarizer()
    summary.add(f("a/$s"))
    summary.add(f("a/$s*/b"))
    change = summary.add(f("a/>"))
    assert change.advertise == (f("a/>"),)
    assert set(change.withdraw) == {f("a/$s"), f("a/$s*/b")}


def test_a_catch_all_does_not_withdraw_system_filters() -> None:
    summary = Summarizer()
    summary.add(f("$sys/a"))
    summary.add(f("a/b"))
    change = summary.add(f(">"))
    assert change == SummaryChange((f(">"),), (f("a/b"),))
    assert summary.advertised == {f(">"), f("$sys/a")}


def test_a_dollar_prefix_filter_is_advertised_beside_a_catch_all() -> None:
    summary = Summarizer()
    summary.add(f(">"))
    assert summary.add(f("$*/>")) == SummaryChange((f("$*/>"),), ())


def test_a_catch_all_does_not_withdraw_a_dollar_prefix_filter() -> None:
    summary = Summarizer()
    summary.add(f("$*/>"))
    assert summary.add(f(">")) == SummaryChange((f(">"),), ())


def test_a_dollar_prefix_filter_covers_the_system_filters_it_names() -> None:
    summary = Summarizer()
    summary.add(f("$s*/>"))
    assert not summary.add(f("$sys/a"))
    assert not summary.add(f("$s*/b/>"))


def test_a_dollar_prefix_filter_does_not_cover_other_system_filters() -> None:
    summary = Summarizer()
    summary.add(f("$s*/>"))
    assert summary.add(f("$t/a")) == SummaryChange((f("$t/a"),), ())


def test_a_dollar_prefix_filter_withdraws_only_the_system_filters_it_covers() -> None:
    summary = Summarizer()
    for text in ("$sys/a", "$s/b/c", "a/b", "$t"):
        summary.add(f(text))
    change = summary.add(f("$s*/>"))
    assert change.advertise == (f("$s*/>"),)
    assert set(change.withdraw) == {f("$sys/a"), f("$s/b/c")}


def test_removing_a_dollar_prefix_filter_advertises_what_it_covered() -> None:
    summary = Summarizer()
    summary.add(f("$*/>"))
    summary.add(f("$sys/a"))
    summary.add(f("a/b"))
    assert summary.remove(f("$*/>")) == SummaryChange((f("$sys/a"),), (f("$*/>"),))


def test_the_sample_of_a_dollar_prefix_filter_is_a_system_topic() -> None:
    assert sample_levels(f("$SYS*/>")) == ("$SYS", "x")


@pytest.mark.parametrize(
    "flt",
    [f("a/*", MQTT), f("a/>", MQTT), f("a/b*/c", MQTT), f("$*/a", MQTT), f("$s*/#", MQTT)],
)
def test_a_filter_that_matches_nothing_is_never_advertised(flt: Filter) -> None:
    assert matches_nothing(flt)
    assert covers(f("unrelated"), flt)  # covers() says yes, vacuously
    summary = Summarizer()
    assert not summary.add(flt)
    assert flt in summary
    assert summary.advertised == frozenset()
    assert summary.add(f(">")) == SummaryChange((f(">"),), ())
    assert summary.remove(f(">")) == SummaryChange((), (f(">"),))  # it stays unadvertised
    assert not summary.remove(flt)
    assert len(summary) == 0


def test_a_filter_that_matches_nothing_covers_nothing() -> None:
    summary = Summarizer()
    summary.add(f("a/*", MQTT))  # '*' is a literal character in mqtt: no topic holds it
    assert summary.add(f("a/x")) == SummaryChange((f("a/x"),), ())
    assert summary.statistics() == {"local": 2, "advertised": 1, "covered": 1}


def test_an_empty_change_is_false() -> None:
    assert not SummaryChange((), ())
    assert SummaryChange((f("a"),), ())
    assert SummaryChange((), (f("a"),))


def test_the_advertised_snapshot_is_stable_until_a_change() -> None:
    summary = Summarizer()
    summary.add(f("a"))
    before = summary.advertised
    summary.add(f("a"))
    assert summary.advertised is before
    summary.add(f("b"))
    assert before == {f("a")}
    assert summary.advertised == {f("a"), f("b")}


# -- properties over a tiny alphabet -----------------------------------------------------------

# Each level means something in one dialect and is a literal (or matches nothing) in the other:
# '$s', '$*' and '$s*' exercise the `$` rule (a `$` prefix names system topics in native and is
# a dead literal in mqtt), 'ab*' a prefix in native and a dead literal in mqtt.
LEVELS = ["a", "b", "$s", "ab*", "*", ">", "+", "#", "$*", "$s*"]
# Witnesses for every filter drawn from LEVELS: each prefix and one more character, a `$`
# level the `$s*` prefix rejects, and a level no literal or prefix accepts.
TOPICS = [
    "/".join(levels)
    for n in (1, 2, 3, 4)
    for levels in itertools.product(["a", "b", "ab", "abx", "$", "$s", "$sx", "x"], repeat=n)
]


@functools.cache
def matched(flt: Filter) -> frozenset[str]:
    """The TOPICS ``flt`` matches, by the reference matcher (independent of covers())."""
    return frozenset(t for t in TOPICS if ref_matches(flt.text, flt.dialect, t))


def _parse_or_none(dialect: str, levels: list[str]) -> Filter | None:
    try:
        return parse_filter("/".join(levels), dialect)
    except TopicError:
        return None


filters = st.builds(
    _parse_or_none,
    st.sampled_from([NATIVE, MQTT]),
    st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3),
).filter(lambda flt: flt is not None)


@settings(max_examples=300)
@given(filters)
def test_matches_nothing_agrees_with_covers(flt: Filter) -> None:
    # A filter is covered by two filters matching disjoint single topics only if it
    # matches no topic at all: covers() is exact, so this is a brute-force definition.
    nothing = covers(f("a"), flt) and covers(f("b"), flt)
    assert matches_nothing(flt) == nothing
    sample = sample_levels(flt)
    if sample is not None:
        assert flt.matches("/".join(sample))


class SummaryModel(RuleBasedStateMachine):
    """Random adds and removes; the deltas and the state checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.summary = Summarizer()
        self.refs: dict[Filter, int] = {}
        self.mirror: set[Filter] = set()  # what a peer built from the deltas
        self.arrivals: dict[Filter, int] = {}  # when each local filter was first added
        self.clock = 0

    held = Bundle("held")

    def apply(self, change: SummaryChange) -> None:
        assert not set(change.advertise) & set(change.withdraw)
        assert len(set(change.advertise)) == len(change.advertise)
        assert len(set(change.withdraw)) == len(change.withdraw)
        assert set(change.withdraw) <= self.mirror
        assert not set(change.advertise) & self.mirror
        self.mirror -= set(change.withdraw)
        self.mirror |= set(change.advertise)

    @rule(target=held, flt=filters)
    def add(self, flt: Filter) -> Filter:
        change = self.summary.add(flt)
        if flt in self.refs:
            assert not change
        self.refs[flt] = self.refs.get(flt, 0) + 1
        if flt not in self.arrivals:
            self.clock += 1
            self.arrivals[flt] = self.clock
        self.apply(change)
        return flt

    @rule(flt=held)
    def remove(self, flt: Filter) -> None:
        if flt not in self.refs:
            with pytest.raises(KeyError):
                self.summary.remove(flt)
            return
        change = self.summary.remove(flt)
        self.refs[flt] -= 1
        if self.refs[flt]:
            assert not change
        else:
            del self.refs[flt]
            del self.arrivals[flt]
        self.apply(change)

    @invariant()
    def deltas_reproduce_the_advertised_set(self) -> None:
        assert self.summary.advertised == self.mirror

    @invariant()
    def only_local_filters_that_match_something_are_advertised(self) -> None:
        for flt in self.summary.advertised:
            assert flt in self.refs
            assert not matches_nothing(flt)

    @invariant()
    def no_advertised_filter_covers_another(self) -> None:
        advertised = list(self.summary.advertised)
        for general in advertised:
            for specific in advertised:
                if general != specific:
                    assert not covers(general, specific), (general, specific)

    @invariant()
    def every_local_filter_is_advertised_or_covered(self) -> None:
        advertised = self.summary.advertised
        for flt in self.refs:
            if matches_nothing(flt) or flt in advertised:
                continue
            assert any(covers(other, flt) for other in advertised), flt

    @invariant()
    def of_equivalent_filters_the_oldest_is_advertised(self) -> None:
        for flt in self.summary.advertised:
            for other in self.refs:
                if covers(flt, other) and covers(other, flt) and not matches_nothing(other):
                    assert self.arrivals[other] >= self.arrivals[flt], (flt, other)

    @invariant()
    def the_advertised_filters_match_what_the_local_filters_match(self) -> None:
        # Checked by topic, system topics included: no match dropped, none added.
        local = frozenset().union(*map(matched, self.refs))
        assert frozenset().union(*map(matched, self.summary.advertised)) == local

    @invariant()
    def counts_agree(self) -> None:
        assert len(self.summary) == len(self.refs)
        for flt, refs in self.refs.items():
            assert flt in self.summary
            assert self.summary.refcount(flt) == refs
        local, advertised = len(self.refs), len(self.mirror)
        assert self.summary.statistics() == {
            "local": local,
            "advertised": advertised,
            "covered": local - advertised,
        }


TestSummaryModel = SummaryModel.TestCase
TestSummaryModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
