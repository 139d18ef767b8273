"""Model-based test: random add/remove/match sequences against a naive model.

The model is a set of (filter, dialect, subscriber) entries matched with the
regex reference in tests/reference.py. Filters and topics come from a tiny
alphabet so wildcards, prefixes, the `$` rule and `#`-matches-parent really
collide. A small cache size makes its generations turn over; the invariant
checks that every cached answer, in either generation, equals a fresh
uncached walk. The variants keep the cache warm across many changes (a larger
cache, and a rule that matches every topic seen so far), empty it when full,
sweep it one topic at a time, or have the table ask its trie whether an
unsubscribed subscriber still wants a cached topic.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

import routing.table
from routing import MQTT, MatchCache, SubscriptionTable, TopicError, parse_filter
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


def an_instance(text: str, dialect: str) -> str | None:
    """A topic the (valid) filter matches, its wildcards filled in; None if it has none."""
    levels = []
    for level in text.split("/"):
        if level in (("*", ">") if dialect == "native" else ("+", "#")):
            levels.append("a")
        elif dialect == "native" and level.endswith("*"):
            levels.append(level[:-1])  # a prefix matches itself
        elif "*" in level or ">" in level:
            return None  # an mqtt literal no topic holds
        else:
            levels.append(level)
    return "/".join(levels)


class TableModel(RuleBasedStateMachine):
    cache_size = 8

    def __init__(self) -> None:
        super().__init__()
        self.table = SubscriptionTable(cache_size=self.cache_size)
        self.model: set[tuple[str, str, str]] = set()
        self.seen: list[str] = []

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

    @rule(flt=filters(), subscriber=subscriber_strategy)
    def churn_around_a_cached_topic(self, flt: tuple[str, str], subscriber: str) -> None:
        """Cache a topic ``flt`` matches, subscribe ``flt`` and ``{first level}/#``, then
        unsubscribe ``flt``: the subscriber must stay in the cached answer through the
        wider filter (a random topic rarely meets a random filter, so this makes one)."""
        text, dialect = flt
        topic = an_instance(text, dialect)
        if topic is None or not valid(text, dialect):
            return
        self.seen.append(topic)
        self.match(topic)
        first = text.split("/")[0]
        if first in TOPIC_LEVELS:
            self.add((f"{first}/#", MQTT), subscriber)
        entry = self.add(flt, subscriber)
        self.match(topic)
        self.remove_again(entry)
        self.match(topic)

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

    @rule(
        entries=st.lists(added, max_size=6),
        others=st.lists(st.tuples(filters(), subscriber_strategy), max_size=3),
    )
    def remove_many(
        self, entries: list[tuple[str, str, str]], others: list[tuple[tuple[str, str], str]]
    ) -> None:
        """A batch of removals (repeats and entries never added included), as a broker
        removes the pipelined UNSUBs of one read: the same as one ``remove`` each."""
        batch = [e for e in entries if valid(e[0], e[1])]
        batch += [(t, d, s) for (t, d), s in others if valid(t, d)]
        present = 0
        for entry in batch:  # (in order: a repeat finds its entry gone)
            if entry in self.model:
                self.model.discard(entry)
                present += 1
        generation = self.table.generation
        assert self.table.remove_many(batch) == present
        assert self.table.generation == generation + present

    @rule(subscriber=subscriber_strategy)
    def remove_subscriber(self, subscriber: str) -> None:
        held = {e for e in self.model if e[2] == subscriber}
        assert self.table.remove_subscriber(subscriber) == len(held)
        self.model -= held

    @rule(target=topics, topic=topic_strategy)
    def new_topic(self, topic: str) -> str:
        self.seen.append(topic)
        return topic

    @rule(topic=topics)
    def match(self, topic: str) -> None:
        expected = {s for (t, d, s) in self.model if ref_matches(t, d, topic)}
        assert self.table.match(topic) == expected

    @rule()
    def match_every_topic_seen(self) -> None:
        """Warm the cache with every topic so far, so that changes meet many cached ones."""
        for topic in self.seen:
            expected = {s for (t, d, s) in self.model if ref_matches(t, d, topic)}
            assert self.table.match(topic) == expected, topic

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
    def trie_is_compact(self) -> None:
        """No container where a lone child or subscriber would do, no node left over."""
        trie = self.table._trie
        stack = [trie._root]
        reachable = 0
        while stack:
            node = stack.pop()
            reachable += 1
            for slot in (node.literal, node.prefixes):
                if isinstance(slot, dict):
                    assert len(slot) >= 2
                    assert all(child.key == key for key, child in slot.items())
                    stack.extend(slot.values())
                elif slot is not None:
                    stack.append(slot)
            if node.star is not None:
                stack.append(node.star)
            for holder in (node.exact, node.rest):
                if isinstance(holder, dict):
                    assert len(holder) >= 2 or next(iter(holder.values())) >= 2
            if node is not trie._root:
                assert not node.is_empty()
        assert reachable == trie.nodes
        if not self.model:
            assert trie.nodes == 1

    @invariant()
    def cached_answers_are_fresh(self) -> None:
        cache = self.table._cache
        if cache is None:
            return
        assert len(cache) <= cache.max_entries
        assert not cache.results.keys() & cache.old.keys()  # a topic is in one generation
        for topic, result in (*cache.results.items(), *cache.old.items()):
            assert result == self.table.match_uncached(topic), topic

    @invariant()
    def cache_index_holds_exactly_the_indexed_topics(self) -> None:
        """Each built position's buckets hold the cached topics not pending, by level."""
        cache = self.table._cache
        if cache is None:
            return
        pending = set(cache._unindexed)
        cached = cache.results.keys() | cache.old.keys()
        assert len(pending) == len(cache._unindexed) and pending <= cached
        for position, index in cache._indexed:
            assert cache._by_level[position] is index
            expected: dict[str, set[str]] = {}
            for topic in cached - pending:
                levels = topic.split("/")
                if len(levels) > position:
                    expected.setdefault(levels[position], set()).add(topic)
            assert {level: set(bucket) for level, bucket in index.items()} == expected


class TableModelWithoutCache(TableModel):
    cache_size = 0


class TableModelWarmCache(TableModel):
    """A cache that holds every topic drawn: answers live through many changes."""

    cache_size = 256


class TableModelEmptiedWhenFull(TableModel):
    """The cache is emptied at once when full, instead of keeping two generations."""

    def __init__(self) -> None:
        super().__init__()
        self.table._cache = MatchCache(8, sweep_to=0)


class TableModelSweepOneByOne(TableModel):
    """Sweeps drop the oldest topics one by one, each leaving the cache's index."""

    def __init__(self) -> None:
        super().__init__()
        self.table._cache = MatchCache(8, sweep_to=4)


class TableModelTrieWants(TableModel):
    """Every subscriber holding two filters or more asks the trie after an unsubscribe."""

    cache_size = 256

    def __init__(self) -> None:
        super().__init__()
        self._few = routing.table._FEW_FILTERS
        routing.table._FEW_FILTERS = 0  # type: ignore[misc]

    def teardown(self) -> None:
        routing.table._FEW_FILTERS = self._few  # type: ignore[misc]


TestTableModel = TableModel.TestCase
TestTableModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestTableModelWithoutCache = TableModelWithoutCache.TestCase
TestTableModelWithoutCache.settings = settings(
    max_examples=75, stateful_step_count=40, deadline=None
)
TestTableModelWarmCache = TableModelWarmCache.TestCase
TestTableModelWarmCache.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestTableModelEmptiedWhenFull = TableModelEmptiedWhenFull.TestCase
TestTableModelEmptiedWhenFull.settings = settings(
    max_examples=75, stateful_step_count=40, deadline=None
)
TestTableModelSweepOneByOne = TableModelSweepOneByOne.TestCase
TestTableModelSweepOneByOne.settings = settings(
    max_examples=75, stateful_step_count=40, deadline=None
)
TestTableModelTrieWants = TableModelTrieWants.TestCase
TestTableModelTrieWants.settings = settings(max_examples=75, stateful_step_count=50, deadline=None)
