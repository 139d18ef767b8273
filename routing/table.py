"""The subscription table: (filter, subscriber) entries and who wants a topic.

Three structures, each answering one question:

- ``MatchTrie``: who wants this topic? (the hot path)
- a pygtrie keyed by where filters live (their leading literal levels, at
  most ``INDEX_DEPTH``), each node holding the group of filters that live
  there: which filters live under ``beacon/eu``? (prefix questions for
  route summarization and operators). Built at the first such question and
  kept from then on: a broker that is never asked pays nothing for it
- ``MatchCache``: the answer for a hot topic without walking anything; a
  subscribe or unsubscribe patches the cached answers its filter matches
  (``_wants`` says whether an unsubscribed subscriber still wants a topic).

An entry is (filter text, dialect, subscriber). Parsed filters are shared
between the subscribers that hold the same text, and the pygtrie only
changes when a new place in the hierarchy gains or loses its last filter
(a pygtrie walk is pure Python and costs as much as the rest of a
subscribe; a storm of filters on new sites would pay it every time, so it
only exists once asked for), so subscribe and unsubscribe stay cheap. ``generation`` moves
on every change, so caches kept elsewhere (per connection, per peer link)
can tell they are stale without being told.

Memory: a broker holds 50,000 filters and more, most of them native, held
by one subscriber, alone in their place in the hierarchy. So what is
common costs no container: a native filter's record is keyed by its text
(an MQTT one by (text, dialect)), a holder count is kept only from two
holders on, and a group of one filter is the filter itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import pygtrie

from routing.cache import DEFAULT_MAX_ENTRIES, MatchCache, Result
from routing.filters import NATIVE, Filter, parse_filter
from routing.topics import check_common, split_topic
from routing.trie import MatchTrie

EMPTY: Final[Result] = frozenset()
# Filters are indexed by at most this many leading literal levels: deep enough to tell
# sites apart in beacon/{region}/{country}/{site}/..., shallow enough that most new
# filters join an existing group instead of adding pygtrie nodes.
INDEX_DEPTH: Final = 4
# After an unsubscribe, whether the subscriber still wants an affected cached topic: the
# filters of one holding at most this many are tested one by one, else the trie is walked.
_FEW_FILTERS: Final = 8


@dataclass(frozen=True, slots=True)
class TableStatistics:
    """Counters an operator graphs; a snapshot, not live."""

    subscriptions: int
    filters: int
    subscribers: int
    trie_nodes: int
    generation: int
    matches: int
    cache_entries: int
    cache_hits: int
    cache_misses: int
    cache_evictions: int
    cache_invalidated: int
    cache_clears: int


class SubscriptionTable:
    """Wildcard subscriptions, matched by walking a trie of levels.

    ``cache_size=0`` turns the match cache off (for high churn, or to
    measure cold matching).
    """

    def __init__(self, *, cache_size: int = DEFAULT_MAX_ENTRIES) -> None:
        self._trie = MatchTrie()
        self._cache: MatchCache | None = MatchCache(cache_size) if cache_size > 0 else None
        # key (_key: the text of a native filter, else (text, dialect)) -> the distinct
        # Filter, and how many subscribers hold it when more than one: dicts rather than a
        # record object per filter, which the cyclic GC would have to track and traverse
        self._records: dict[Key, Filter] = {}
        self._holders: dict[Key, int] = {}
        # pygtrie: the literal heads filters live at (values unused: True); the plain dict
        # maps each head to its group, the Filter itself while it is alone, else a dict
        # used as an ordered set. Only a new or emptied head walks the pygtrie, and only
        # once filters_under has made it (None until then).
        self._by_path: pygtrie.Trie | None = None
        self._groups: dict[tuple[str, ...], Filter | dict[Filter, None]] = {}
        # subscriber -> its Filter, or a set once it holds two: most subscribers hold one
        # (every broker subscription is its own subscriber), and a set per entry costs
        # ~200 bytes and an allocation the GC must track
        self._by_subscriber: dict[Hashable, Filter | set[Filter]] = {}
        self._entries = 0
        self._cold_matches = 0
        self.generation = 0

    def __len__(self) -> int:
        return self._entries

    def __contains__(self, entry: object) -> bool:
        """``(filter_text, subscriber)`` or ``(filter_text, subscriber, dialect)``."""
        if not isinstance(entry, tuple) or len(entry) not in (2, 3):
            return False
        text, subscriber, *rest = entry
        dialect = rest[0] if rest else NATIVE
        record = self._records.get(_key(text, dialect))
        held = self._by_subscriber.get(subscriber)
        return record is not None and _holds(held, record)

    def add(self, filter: str | Filter, subscriber: Hashable, dialect: str = NATIVE) -> bool:
        """Subscribe; True if the (filter, subscriber) pair is new.

        An invalid filter raises TopicError and changes nothing.
        """
        # A broker adds a parsed Filter per SUB, tens of thousands pipelined: its path is
        # inlined (no helper calls), the string forms take the general one.
        if isinstance(filter, Filter):
            text, dialect = filter.text, filter.dialect
        else:
            text, dialect = _text_and_dialect(filter, dialect)
        key = _key(text, dialect)
        record = self._records.get(key)
        held = self._by_subscriber.get(subscriber)
        if record is None:
            flt = filter if isinstance(filter, Filter) else parse_filter(text, dialect)
        else:
            flt = record
            if _holds(held, flt):
                return False
        if held is None:
            self._by_subscriber[subscriber] = flt
        elif held.__class__ is set:
            held.add(flt)  # type: ignore[union-attr]
        else:
            self._by_subscriber[subscriber] = {held, flt}  # type: ignore[arg-type]
        if record is None:
            self._records[key] = flt
            self._index_filter(flt)
        else:
            self._holders[key] = self._holders.get(key, 1) + 1
        self._trie.insert(flt, subscriber)
        self._entries += 1
        self.generation += 1
        cache = self._cache
        if cache is not None and (cache.results or cache.old):
            cache.add_subscriber(flt, subscriber)
        return True

    def add_many(self, entries: list[tuple[Filter, Hashable]]) -> int:
        """``add`` for each parsed (filter, subscriber) pair in order; how many were new.

        A broker adds the pipelined SUBs of one read at once: one loop, no call per entry
        but for a new filter's index entry and the trie.
        """
        records = self._records
        holders = self._holders
        by_subscriber = self._by_subscriber
        insert = self._trie.insert
        index = self._index_filter
        cache = self._cache
        added = 0
        for flt, subscriber in entries:
            key = flt.text if flt.dialect is NATIVE else (flt.text, flt.dialect)  # _key
            record = records.get(key)
            held = by_subscriber.get(subscriber)
            if record is None:
                records[key] = flt
                index(flt)
            else:
                if _holds(held, record):
                    continue
                flt = record
                holders[key] = holders.get(key, 1) + 1
            if held is None:
                by_subscriber[subscriber] = flt
            elif held.__class__ is set:
                held.add(flt)  # type: ignore[union-attr]
            else:
                by_subscriber[subscriber] = {held, flt}  # type: ignore[arg-type]
            insert(flt, subscriber)
            added += 1
            if cache is not None and (cache.results or cache.old):
                cache.add_subscriber(flt, subscriber)
        self._entries += added
        self.generation += added
        return added

    def remove(self, filter: str | Filter, subscriber: Hashable, dialect: str = NATIVE) -> bool:
        """Unsubscribe; True if the pair was present. An invalid filter raises TopicError."""
        text, dialect = _text_and_dialect(filter, dialect)
        key = _key(text, dialect)
        record = self._records.get(key)
        if record is None:
            if not isinstance(filter, Filter):
                parse_filter(text, dialect)  # a bad filter is an error, not "absent"
            return False
        flt = record
        held = self._by_subscriber.get(subscriber)
        if not _holds(held, flt):
            return False
        if held is flt:
            del self._by_subscriber[subscriber]
        else:
            held.discard(flt)  # type: ignore[union-attr]
            if not held:
                del self._by_subscriber[subscriber]
        holders = self._holders.pop(key, 1) - 1
        if holders > 1:
            self._holders[key] = holders
        elif not holders:
            del self._records[key]
            self._unindex_filter(flt)
        deleted = self._trie.delete(flt, subscriber)
        assert deleted, "trie and entry index disagree"
        self._entries -= 1
        self.generation += 1
        cache = self._cache
        if cache is not None and (cache.results or cache.old):
            cache.remove_subscriber(flt, subscriber, self._wants)
        return True

    def remove_many(self, entries: list[tuple[str, str, Hashable]]) -> int:
        """``remove`` for each (filter text, dialect, subscriber) in order, for filters the
        caller knows to be valid (it added them); how many were present.

        A broker removes the pipelined UNSUBs of one read at once: one loop, no call per
        entry but for the trie, the index and the cache.
        """
        records = self._records
        holders = self._holders
        by_subscriber = self._by_subscriber
        delete = self._trie.delete
        unindex = self._unindex_filter
        cache = self._cache
        wants = self._wants
        removed = 0
        for text, dialect, subscriber in entries:
            key = text if dialect == NATIVE else (text, dialect)  # _key
            flt = records.get(key)
            if flt is None:
                continue
            held = by_subscriber.get(subscriber)
            if held is flt:
                del by_subscriber[subscriber]
            elif held.__class__ is set and flt in held:  # type: ignore[operator]
                held.discard(flt)  # type: ignore[union-attr]
                if not held:
                    del by_subscriber[subscriber]
            else:
                continue  # (the subscriber does not hold it)
            left = holders.pop(key, 1) - 1
            if left > 1:
                holders[key] = left
            elif not left:
                del records[key]
                unindex(flt)
            deleted = delete(flt, subscriber)
            assert deleted, "trie and entry index disagree"
            removed += 1
            if cache is not None and (cache.results or cache.old):
                cache.remove_subscriber(flt, subscriber, wants)
        self._entries -= removed
        self.generation += removed
        return removed

    def remove_subscriber(self, subscriber: Hashable) -> int:
        """Drop every filter ``subscriber`` holds; returns how many."""
        held = _as_set(self._by_subscriber.get(subscriber))
        if not held:
            return 0
        count = 0
        for flt in list(held):
            count += self.remove(flt, subscriber)
        return count

    def match(self, topic: str) -> Result:
        """The subscribers that want ``topic``, each once. Raises TopicError if invalid."""
        cache = self._cache
        if cache is not None:
            try:
                result = cache.results.get(topic)
                if result is None and cache.old:
                    result = cache.revive(topic)  # the old generation (routing/cache.py)
            except TypeError:  # unhashable: split_topic below says what is wrong
                result = None
            if result is not None:
                cache.hits += 1
                return result
            cache.misses += 1
        levels = split_topic(topic)
        result = self._match_levels(levels)
        if cache is not None:
            cache.put(topic, levels, result)
        return result

    def match_uncached(self, topic: str) -> Result:
        """Match by walking the trie, ignoring and not filling the cache."""
        return self._match_levels(split_topic(topic))

    def filters_of(self, subscriber: Hashable) -> frozenset[str]:
        """The filter strings ``subscriber`` holds (in any dialect)."""
        return frozenset(f.text for f in _as_set(self._by_subscriber.get(subscriber)))

    def subscriptions_of(self, subscriber: Hashable) -> frozenset[Filter]:
        """The parsed filters ``subscriber`` holds, dialect included."""
        return frozenset(_as_set(self._by_subscriber.get(subscriber)))

    def subscribers(self) -> Iterator[Hashable]:
        return iter(list(self._by_subscriber))

    def filters(self) -> Iterator[Filter]:
        """Every distinct filter held by at least one subscriber."""
        return iter(list(self._records.values()))

    def filters_under(self, prefix: str) -> list[Filter]:
        """Distinct filters whose leading literal levels are ``prefix``'s levels.

        ``filters_under("beacon/eu")`` lists ``beacon/eu/>`` and
        ``beacon/eu/de/*/checkout``, not ``beacon/*/de``: this is a question
        about where filters live, not about which topics they match.
        """
        levels = tuple(check_common(prefix, "prefix"))
        if len(levels) > INDEX_DEPTH:
            depth = len(levels)
            return [
                f
                for f in _members(self._groups.get(levels[:INDEX_DEPTH]))
                if len(f.levels) >= depth
                and all(t.__class__ is str for t in f.levels[:depth])
                and f.levels[:depth] == levels
            ]
        by_path = self._by_path
        if by_path is None:  # the first prefix question: index where filters live
            by_path = self._by_path = pygtrie.Trie()
            for key in self._groups:
                by_path[key] = True
        try:
            heads = by_path.keys(prefix=levels)
        except KeyError:
            return []
        groups = self._groups
        return [flt for head in heads for flt in _members(groups[tuple(head)])]

    def statistics(self) -> TableStatistics:
        cache = self._cache
        stats = cache.statistics() if cache is not None else None
        return TableStatistics(
            subscriptions=self._entries,
            filters=len(self._records),
            subscribers=len(self._by_subscriber),
            trie_nodes=self._trie.nodes,
            generation=self.generation,
            matches=self._cold_matches + (stats.hits if stats else 0),
            cache_entries=stats.entries if stats else 0,
            cache_hits=stats.hits if stats else 0,
            cache_misses=stats.misses if stats else 0,
            cache_evictions=stats.evictions if stats else 0,
            cache_invalidated=stats.invalidated if stats else 0,
            cache_clears=stats.clears if stats else 0,
        )

    def _match_levels(self, levels: list[str]) -> Result:
        self._cold_matches += 1
        lone, dicts = self._trie.collect(levels)
        if not dicts:
            return frozenset(lone) if lone else EMPTY
        if lone:
            return frozenset(lone).union(*dicts)
        if len(dicts) == 1:
            return frozenset(dicts[0])
        return frozenset().union(*dicts)

    def _wants(self, subscriber: Hashable, levels: list[str]) -> bool:
        """Whether ``subscriber`` wants the topic of (valid) ``levels``, through any filter.

        A few filters are tested one by one; for more, one trie walk answers.
        """
        held = self._by_subscriber.get(subscriber)
        if held is None:
            return False
        if held.__class__ is not set:
            return held.matches_levels(levels)  # type: ignore[union-attr]
        if len(held) <= _FEW_FILTERS:  # type: ignore[arg-type]
            return any(flt.matches_levels(levels) for flt in held)  # type: ignore[union-attr]
        lone, dicts = self._trie.collect(levels)
        return subscriber in lone or any(subscriber in holder for holder in dicts)

    def _index_filter(self, flt: Filter) -> None:
        key = head = flt.levels[:INDEX_DEPTH]  # _literal_head, inlined: once per new filter
        for i, token in enumerate(head):
            if token.__class__ is not str:
                key = head[:i]
                break
        groups = self._groups
        group = groups.get(key)  # type: ignore[arg-type]
        if group is None:
            # A new place in the hierarchy: the only time pygtrie is touched (4-7 us a walk).
            groups[key] = flt  # type: ignore[index]
            if self._by_path is not None:
                self._by_path[key] = True
        elif group.__class__ is dict:
            group[flt] = None  # type: ignore[index]
        else:
            groups[key] = {group: None, flt: None}  # type: ignore[index,dict-item]

    def _unindex_filter(self, flt: Filter) -> None:
        key = _literal_head(flt)
        group = self._groups[key]
        if group.__class__ is dict:
            del group[flt]  # type: ignore[union-attr]
            if len(group) == 1:  # type: ignore[arg-type]
                self._groups[key] = next(iter(group))  # type: ignore[call-overload]
        else:
            del self._groups[key]
            if self._by_path is not None:
                del self._by_path[key]


Key = str | tuple[str, str]


def _key(text: str, dialect: str) -> Key:
    """A record's key: a native filter's text (a tuple would cost 56 bytes), else
    (text, dialect)."""
    return text if dialect == NATIVE else (text, dialect)


def _members(group: Filter | dict[Filter, None] | None) -> Iterable[Filter]:
    """The filters of a group (a lone Filter, or a dict of them), or none."""
    if group is None:
        return ()
    if group.__class__ is dict:
        return group  # type: ignore[return-value]
    return (group,)  # type: ignore[return-value]


def _holds(held: Filter | set[Filter] | None, flt: Filter) -> bool:
    if held is None:
        return False
    if held.__class__ is set:
        return flt in held  # type: ignore[operator]
    return held is flt


def _as_set(held: Filter | set[Filter] | None) -> set[Filter] | tuple[Filter, ...]:
    if held is None:
        return ()
    if held.__class__ is set:
        return held  # type: ignore[return-value]
    return (held,)  # type: ignore[return-value]


def _literal_head(flt: Filter) -> tuple[str, ...]:
    """Where a filter lives: its leading literal levels, at most INDEX_DEPTH of them."""
    head = flt.levels[:INDEX_DEPTH]
    for i, token in enumerate(head):
        if token.__class__ is not str:
            return head[:i]  # type: ignore[return-value]
    return head  # type: ignore[return-value]


def _text_and_dialect(filter: str | Filter, dialect: str) -> tuple[str, str]:
    if isinstance(filter, Filter):
        return filter.text, filter.dialect
    if dialect not in ("native", "mqtt"):
        raise ValueError(f"unknown filter dialect {dialect!r}; expected 'native' or 'mqtt'")
    if not isinstance(filter, str):
        parse_filter(filter, dialect)  # raises TopicError naming the type
    return filter, dialect
