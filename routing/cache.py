"""A bounded cache of match results, kept exact through subscription changes.

The broker matches the same hot topics over and over (a popular page's
``view`` event), so like nats-server's sublist we keep ``topic -> result``;
a hit is one dict lookup. A subscribe or unsubscribe changes the answers of
the cached topics its filter matches, and of no others. Those answers are
patched in place (``add_subscriber``: the answer gains the subscriber;
``remove_subscriber``: it loses it unless another of its filters still
matches), so the cache stays warm through churn; ``invalidate`` drops them
instead. Either way, the cost of a change must grow with the cached topics
the filter matches, not with the cached topics it leaves alone.

To find those topics without walking the others, cached topics are indexed
by level position: ``_by_level[i]`` maps a level's text to the cached topics
holding that text at position ``i``. A filter looks up the buckets of its
literal levels, deepest first (deep levels tend to be rare; a bucket of at
most ``_FEW`` topics ends the search), and tests only the topics of the
smallest with ``Filter.matches_levels``: ``beacon/*/*/s1/*/view`` reads the
``s1`` bucket at position 3, the few cached topics on that site, so a
wildcard in the middle fans out over nothing. A level no cached topic holds
at that position answers "none" in one lookup. A filter without wildcards
matches its own text only and needs no index. A position is indexed the
first time a filter needs it (the buckets of the positions already indexed
being absent or too large) and stays indexed: a stream of ``beacon/...``
topics gets an index of its site level, not of ``beacon``, which every
cached topic would share. A filter with no literal level but a first-level
prefix (``$SYS*/>``, ``$*``) tests the cached topics that start with it; one
with neither (``>``, ``*/*``, ``#``) can reach every non-system topic, and the
cache is emptied instead (counted in ``clears``).

Topics join the index only when a filter needs it (or the oldest are swept
one by one): a put only records the topic as pending, since subscriptions
change rarely next to publishes and a cold topic stream would otherwise index
every miss only to drop it at the next sweep. The first change after a burst
of puts indexes them all, once each.

``invalidated`` counts cached answers a subscription change altered, patched
or dropped. The cache holds at most ``max_entries`` topics. By default it
keeps two generations (``sweep_to=None``): ``results``, the young one, takes
every new answer, and once it holds half of ``max_entries`` it becomes the old
one (``old``) and the previous old one is dropped at once; a topic found in
the old generation moves back to the young one. So a hit is still one dict
lookup, a topic asked for again within a generation survives the sweep, and
on a Zipf-shaped stream with more distinct topics than entries (the wild-1k
benchmark's ~59,000 topics in 200,000 publishes, 16,384 entries) the hit rate
goes from 57% (emptied when full) to 61%, 67% with twice the entries. The
built positions are emptied at a generation change and the surviving topics
are pending again (dropping the others from their buckets one by one would
cost a split and a bucket per position each), so a topic is indexed at most
twice per generation it lives through, and only when a change needs it.
``sweep_to=0`` empties the cache at once when full; ``sweep_to > 0`` drops
the oldest one by one until ``sweep_to`` remain (a batch sweep, as in
nats-server), each leaving its buckets.

Equal answers are one object: a put or a patch interns its frozenset (many
topics share an answer: ~530 distinct ones for the 59,000 topics above), which
saves its ~200 bytes per topic and lets a caller that keys on the answer (the
broker's delivery plans) find it by identity. The interned answers are
forgotten at each generation change (or sweep), so they never outnumber the
cached topics.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Final

from routing.filters import NATIVE, STAR, Filter
from routing.topics import MAX_LEVELS

DEFAULT_MAX_ENTRIES: Final = 4096
#: None: two generations (see the module docstring); 0: emptied when full.
DEFAULT_SWEEP_TO: Final[int | None] = None

Result = frozenset[Hashable]
# The cached topics holding one level text at one position. A dict used as a set: a dict
# holding only strings is not tracked by the cyclic GC (a set always is), so a warm cache's
# thousands of buckets add nothing to a full collection.
Bucket = dict[str, None]
_FEW: Final = 8  # a bucket this small ends the search for a smaller one
# A new position is indexed for a filter whose smallest bucket among the positions already
# indexed holds more than 1/_NARROW of the cached topics (or which has none).
_NARROW: Final = 8


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    entries: int
    hits: int
    misses: int
    evictions: int
    invalidated: int
    clears: int


class MatchCache:
    """``topic -> frozenset`` of subscribers, bounded, exact through subscription changes."""

    __slots__ = (
        "_answers",
        "_by_level",
        "_deepest",
        "_indexed",
        "_unindexed",
        "_young_max",
        "clears",
        "evictions",
        "hits",
        "invalidated",
        "max_entries",
        "misses",
        "old",
        "results",
        "sweep_to",
    )

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, sweep_to: int | None = DEFAULT_SWEEP_TO
    ):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if sweep_to is not None and not 0 <= sweep_to < max_entries:
            raise ValueError("sweep_to must be in [0, max_entries)")
        if sweep_to is None and max_entries < 2:
            sweep_to = 0  # no room for two generations
        self.max_entries = max_entries
        self.sweep_to = sweep_to
        # Two generations when sweep_to is None, each at most half of max_entries; else
        # the young one alone, up to max_entries. Disjoint: a topic is in one of them.
        self._young_max = max_entries // 2 if sweep_to is None else max_entries
        self.results: dict[str, Result] = {}
        self.old: dict[str, Result] = {}
        # Each distinct answer once (see the module docstring).
        self._answers: dict[Result, Result] = {}
        # _by_level[i]: level text -> the cached topics holding it at position i, or None
        # while no filter has needed position i; _indexed lists the (i, index) pairs built.
        self._by_level: list[dict[str, Bucket] | None] = [None] * MAX_LEVELS
        self._indexed: list[tuple[int, dict[str, Bucket]]] = []
        self._deepest = -1  # the deepest position built: topics are split no further
        # Topics cached but not in the built indexes yet: added when a filter needs them
        # (rare next to puts), so a cold topic stream does not index what it never reads.
        self._unindexed: list[str] = []
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidated = 0
        self.clears = 0

    def __len__(self) -> int:
        return len(self.results) + len(self.old)

    def get(self, topic: str) -> Result | None:
        result = self.results.get(topic)
        if result is None:
            result = self.revive(topic)
            if result is None:
                self.misses += 1
                return None
        self.hits += 1
        return result

    def revive(self, topic: str) -> Result | None:
        """The answer for ``topic`` if the old generation holds it, which moves it to the
        young one; None otherwise. For the caller that looked in ``results`` already (a hit
        there is one dict lookup); it counts the hit or the miss."""
        old = self.old
        if not old:
            return None
        result = old.pop(topic, None)
        if result is not None:
            results = self.results
            if len(results) >= self._young_max:
                self._next_generation()
                self.results[topic] = result
                self._unindexed.append(topic)  # (every young topic is pending now)
            else:
                results[topic] = result  # (pending or indexed already: it stays so)
        return result

    def put(self, topic: str, levels: Sequence[str], result: Result) -> None:
        """Cache ``result`` for ``topic`` (``levels`` are its levels, kept for the API)."""
        answers = self._answers
        result = answers.setdefault(result, result)
        if len(answers) > self._young_max:  # (patches add answers too: keep them bounded)
            self._answers = {result: result}
        results = self.results
        if topic in results:
            results[topic] = result
            return
        # (a put without a look first may find the topic in the old generation)
        pending = self.old.pop(topic, None) is None
        if self.sweep_to is None and len(results) >= self._young_max:
            self._next_generation()
            results = self.results
            pending = True  # every young topic is pending after a generation change
        results[topic] = result
        if pending:
            self._unindexed.append(topic)
        if len(results) > self.max_entries:
            self._sweep()

    def clear(self) -> None:
        if self.results or self.old:
            self.clears += 1
        self._empty()

    def invalidate(self, flt: Filter) -> None:
        """Forget every cached topic ``flt`` can match."""
        found = self._affected(flt)
        if not found:
            return
        for topic in found:
            self._forget(topic)
        self.invalidated += len(found)

    def add_subscriber(self, flt: Filter, subscriber: Hashable) -> None:
        """``subscriber`` now holds ``flt``: add it to the cached answers ``flt`` matches."""
        found = self._affected(flt)
        if not found:
            return
        results, old = self.results, self.old
        answers = self._answers
        changed = 0
        for topic in found:
            generation = results if topic in results else old
            result = generation[topic]
            if subscriber not in result:
                patched = result | {subscriber}
                generation[topic] = answers.setdefault(patched, patched)
                changed += 1
        self.invalidated += changed
        if len(answers) > self._young_max:
            self._answers = {}

    def remove_subscriber(
        self,
        flt: Filter,
        subscriber: Hashable,
        still_wants: Callable[[Hashable, list[str]], bool] | None = None,
    ) -> None:
        """``subscriber`` dropped ``flt``: take it out of the cached answers ``flt`` matches.

        ``still_wants(subscriber, levels)`` says whether the subscriber still wants a
        topic through another filter it holds (it then stays in that answer); None
        means it holds no other filter.
        """
        found = self._affected(flt)
        if not found:
            return
        results, old = self.results, self.old
        answers = self._answers
        changed = 0
        for topic in found:
            generation = results if topic in results else old
            result = generation[topic]
            if subscriber in result and (
                still_wants is None or not still_wants(subscriber, topic.split("/"))
            ):
                patched = result - {subscriber}
                generation[topic] = answers.setdefault(patched, patched)
                changed += 1
        self.invalidated += changed
        if len(answers) > self._young_max:
            self._answers = {}

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            entries=len(self.results) + len(self.old),
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            invalidated=self.invalidated,
            clears=self.clears,
        )

    def _affected(self, flt: Filter) -> list[str] | None:
        """The cached topics ``flt`` matches, each in every built index.

        None when there is nothing to do: the cache is empty, or ``flt`` has no level
        to look up and the cache was emptied.
        """
        results, old = self.results, self.old
        if not results and not old:
            return None
        cached = len(results) + len(old)
        text = flt.text
        if flt.rest is None and ("*" if flt.dialect == NATIVE else "+") not in text:
            # No wildcard: it matches its own text only (an mqtt text holding `*` or `>`
            # is no topic). No index needed, but _forget expects the topic in the built ones.
            if text not in results and text not in old:
                return []
            if self._unindexed:
                self._index_pending()
            return [text]
        if self._unindexed:
            self._index_pending()
        levels = flt.levels
        by_level = self._by_level
        best: Bucket | None = None
        for i in range(len(levels) - 1, -1, -1):  # the built positions, deepest first
            token = levels[i]
            if token.__class__ is str:
                index = by_level[i]
                if index is None:
                    continue
                bucket = index.get(token)  # type: ignore[arg-type]
                if bucket is None:
                    return []  # no cached topic holds this level here
                if best is None or len(bucket) < len(best):
                    best = bucket
                    if len(bucket) <= _FEW:
                        break
        if best is None or len(best) * _NARROW > cached:
            # The built positions do not narrow the search down: build the filter's
            # others, deepest first, until one does.
            for i in range(len(levels) - 1, -1, -1):
                token = levels[i]
                if token.__class__ is str and by_level[i] is None:
                    bucket = self._build(i).get(token)  # type: ignore[arg-type]
                    if bucket is None:
                        return []
                    if best is None or len(bucket) < len(best):
                        best = bucket
                        if len(bucket) * _NARROW <= cached:
                            break
        candidates: Bucket | list[str]
        if best is not None:
            candidates = best
        else:  # no literal level
            first = levels[0] if levels else STAR
            if first is STAR:
                self.clear()
                return None
            prefix: str = first.prefix  # type: ignore[union-attr]
            candidates = [topic for topic in results if topic.startswith(prefix)]
            candidates += [topic for topic in old if topic.startswith(prefix)]
        matches = flt.matches_levels
        found = []
        for topic in candidates:  # a loop, not a comprehension: usually 0-2 candidates
            if matches(topic.split("/")):
                found.append(topic)
        return found

    def _build(self, position: int) -> dict[str, Bucket]:
        """Index every cached topic (none pending) by its level at ``position``."""
        index: dict[str, Bucket] = {}
        for generation in (self.results, self.old):
            for topic in generation:
                levels = topic.split("/", position + 1)  # the levels after it stay joined
                if len(levels) > position:
                    level = levels[position]
                    bucket = index.get(level)
                    if bucket is None:
                        index[level] = {topic: None}
                    else:
                        bucket[topic] = None
        self._by_level[position] = index
        self._indexed.append((position, index))
        self._deepest = max(self._deepest, position)
        return index

    def _index_pending(self) -> None:
        """Add the topics cached since the last change to the built indexes."""
        indexed = self._indexed
        if indexed:
            split = self._deepest + 1
            for topic in self._unindexed:
                levels = topic.split("/", split)
                depth = len(levels)
                for position, index in indexed:
                    if position < depth:
                        level = levels[position]
                        bucket = index.get(level)
                        if bucket is None:
                            index[level] = {topic: None}
                        else:
                            bucket[topic] = None
        self._unindexed = []

    def _empty_indexes(self) -> None:
        """The positions built stay built, and empty."""
        if self._indexed:
            self._indexed = [(position, {}) for position, _ in self._indexed]
            for position, index in self._indexed:
                self._by_level[position] = index

    def _empty(self) -> None:
        """No topics, no answers kept."""
        self.results = {}
        self.old = {}
        self._answers = {}
        self._unindexed = []
        self._empty_indexes()

    def _next_generation(self) -> None:
        """The young generation becomes the old one; the old one's topics are dropped, and
        the answers interned so far forgotten (the cached ones stay shared)."""
        self.evictions += len(self.old)
        self.old = self.results
        self.results = {}
        self._answers = {}
        if self._indexed:  # rebuilt from the survivors, when a change needs them
            self._empty_indexes()
            self._unindexed = list(self.old)
        else:
            self._unindexed = []  # (nothing built: _build reads the cached topics)

    def _sweep(self) -> None:
        if not self.sweep_to:  # (None cannot get here: a young generation stays in bounds)
            self.evictions += len(self.results)
            self._empty()
            return
        if self._unindexed:
            self._index_pending()  # _forget leaves the topic's buckets
        excess = len(self.results) - self.sweep_to
        for topic in list(islice(self.results, excess)):
            self._forget(topic)
        self.evictions += excess
        self._answers = {}

    def _forget(self, topic: str) -> None:
        """Drop a topic (none pending) from its generation and from its buckets."""
        if topic in self.results:
            del self.results[topic]
        else:
            del self.old[topic]
        if self._indexed:
            levels = topic.split("/", self._deepest + 1)
            depth = len(levels)
            for position, index in self._indexed:
                if position < depth:
                    level = levels[position]
                    bucket = index[level]
                    if len(bucket) == 1:
                        del index[level]
                    else:
                        del bucket[topic]
