"""Model-based test: random add/remove/match sequences against a naive model.

The model is a set of (filter, dialect, subscriber) entries matched with the
regex reference in tests/reference.py. Filters and topics come from a tiny
alphabet so wildcards, prefixes, the `$` rule and `#`-matches-parent really
collide. A small cache size makes sweeps happen; the invariant checks that
every cached answer equals a fresh uncached walk.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from routing import SubscriptionTable, TopicError, parse_filter
from tests.reference import ref_matches

NATIVE_LEVELS = ["a", "b", "ab", "$a", "*", "a*", "$*", "$a*", ">"]
MQTT_LEVELS = ["a", "b", "ab", "$a", "+", "#", "*", "$*"]
TOPIC_LEVELS = ["a", "b", "ab", "abc", "$", "$a", "$ab", "ba"]


@st.composite
def filters(draw: st.DrawFn) -> tuple[str, str]:
    dialect = draw(st.sampled_from(["native", "mqtt"]))
    alphabet = NATIVE_LEVELS if dialect == "native" else MQTT_LEVELS
    levels = draw(st.lists(st.sampled_from(alphabet), min_size=1, max_size=4))
    return "/".join(levels), dialect


topic_strategy = st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=4).map("/".join)
subscriber_strategy = st.sampled_from(["s1", "s2", "s3"])


def valid(text: str, dialect: str) -> bool:
    forbidden_inside = {"native": ">", "mqtt": "#"}[dialect]
    levels = text.split("/")
    if forbidden_inside in levels[:-1]:
        return False
    if dialect == "native":
        return all(("*" not in lvl or lvl.index("*") == len(lvl) - 1) for lvl in levels)
    return True


class TableModel(RuleBasedStateMachine):
    cache_size = 8

    def __init__(self) -> None:
        super().__init__()
        self.table = SubscriptionTable(cache_size=self.cache_size)
        self.model: set[tuple[str, str, str]] = set()

    added = Bundle("added")
    topics = Bundle("topics")

    @rule(target=added, flt=filters(), subscriber=subscriber_strategy)
    def add(self, flt: tuple[str, str], subscriber: str) -> tuple[str, str, str]:
        text, dialect = flt
        entry = (text, dialect, subscriber)
        if not valid(text, dialect):
            try:
                self.table.add(text, subscriber, dialect)
            except TopicError:
                return entry
            raise AssertionError(f"{text!r} ({dialect}) should have been refused")
        assert self.table.add(text, subscriber, dialect) == (entry not in self.model)
        self.model.add(entry)
        return entry

    @rule(entries=st.lists(st.tuples(filters(), subscriber_strategy), max_size=6))
    def add_many(self, entries: list[tuple[tuple[str, str], str]]) -> None:
        """A batch of parsed filters (duplicates within it included), as a broker adds the
        pipelined SUBs of one read."""
        batch = [
            (parse_filter(text, dialect), subscriber)
            for (text, dialect), subscriber in entries
            if valid(text, dialect)
        ]
        new = {(f.text, f.dialect, s) for f, s in batch} - self.model
        generation = self.table.generation
        assert self.table.add_many(batch) == len(new)
        assert self.table.generation == generation + len(new)
        self.model |= new

    @rule(entry=added)
    def remove_again(self, entry: tuple[str, str, str]) -> None:
        text, dialect, subscriber = entry
        if not valid(text, dialect):
            return
        assert self.table.remove(text, subscriber, dialect) == (entry in self.model)
        self.model.discard(entry)

    @rule(target=topics, topic=topic_strategy)
    def new_topic(self, topic: str) -> str:
        return topic

    @rule(topic=topics)
    def match(self, topic: str) -> None:
        expected = {s for (t, d, s) in self.model if ref_matches(t, d, topic)}
        assert self.table.match(topic) == expected

    @rule(prefix=st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=5))
    def filters_under(self, prefix: list[str]) -> None:
        def lives_under(text: str, dialect: str) -> bool:
            levels = text.split("/")
            wild = {"native": ("*", ">"), "mqtt": ("+", "#")}[dialect]
            head = levels[: len(prefix)]
            if dialect == "native":
                head_is_literal = all("*" not in lvl and lvl != ">" for lvl in head)
            else:
                head_is_literal = all(lvl not in wild for lvl in head)
            return head == prefix and head_is_literal

        expected = {(t, d) for (t, d, _s) in self.model if lives_under(t, d)}
        found = self.table.filters_under("/".join(prefix))
        assert len(found) == len(expected)
        assert {(f.text, f.dialect) for f in found} == expected

    @invariant()
    def size_and_filters_agree(self) -> None:
        assert len(self.table) == len(self.model)
        for subscriber in ("s1", "s2", "s3"):
            held = {t for (t, _d, s) in self.model if s == subscriber}
            assert self.table.filters_of(subscriber) == held

    @invariant()
    def cached_answers_are_fresh(self) -> None:
        cache = self.table._cache
        if cache is None:
            return
        assert len(cache.results) <= cache.max_entries
        for topic, result in cache.results.items():
            assert result == self.table.match_uncached(topic), topic


class TableModelWithoutCache(TableModel):
    cache_size = 0


TestTableModel = TableModel.TestCase
TestTableModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestTableModelWithoutCache = TableModelWithoutCache.TestCase
TestTableModelWithoutCache.settings = settings(
    max_examples=75, stateful_step_count=40, deadline=None
)
