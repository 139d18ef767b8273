"""A bounded cache of match results, invalidated precisely.

The broker matches the same hot topics over and over (a popular page's
``view`` event), so like nats-server's sublist we keep ``topic -> result``.
A subscribe or unsubscribe must drop exactly the cached topics the changed
filter can match. Scanning every cached topic with the filter would cost
O(cache size) per subscribe; instead the cached topics are also kept in a
small trie of plain dicts, which the filter walks: a literal level follows
one child, a wildcard fans out only where it must. When the filter starts
with a wildcard it can reach every cached topic, and dropping the whole cache
is cheaper than walking it; a ``$`` prefix first level (``$SYS*``) only reaches
system topics, so it walks. Topics join that index only when a filter is
invalidated (or the oldest are swept one by one): subscriptions change rarely
next to publishes, and a cold topic stream would otherwise build an index
path for every miss only to drop it at the next sweep.

When the cache holds more than ``max_entries`` topics it is swept: by
default (``sweep_to=0``) emptied at once, which costs nothing and lets the
hot topics of a Zipf-shaped stream come straight back; with ``sweep_to > 0``
the oldest are dropped one by one until ``sweep_to`` remain (a batch sweep,
as in nats-server). Dropping one topic means walking its index path, ~2 us
per topic in profiles of the broker on a cold topic stream, which is why
emptying is the default.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

from routing.filters import STAR, Filter, Rest, Token

DEFAULT_MAX_ENTRIES: Final = 4096
DEFAULT_SWEEP_TO: Final = 0

Result = frozenset[Hashable]
_END: Final = None  # key under which an index node stores its topic


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    entries: int
    hits: int
    misses: int
    evictions: int
    invalidated: int
    clears: int


class MatchCache:
    """``topic -> frozenset`` of subscribers, bounded, with per-filter invalidation."""

    __slots__ = (
        "_index",
        "_unindexed",
        "clears",
        "evictions",
        "hits",
        "invalidated",
        "max_entries",
        "misses",
        "results",
        "sweep_to",
    )

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, sweep_to: int | None = None):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if sweep_to is None:
            sweep_to = DEFAULT_SWEEP_TO
        if not 0 <= sweep_to < max_entries:
            raise ValueError("sweep_to must be in [0, max_entries)")
        self.max_entries = max_entries
        self.sweep_to = sweep_to
        self.results: dict[str, Result] = {}
        self._index: dict[Any, Any] = {}
        # Topics cached but not in _index yet: indexed when a filter must be invalidated
        # (rare next to puts), so a cold topic stream does not build paths it never walks.
        self._unindexed: list[str] = []
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidated = 0
        self.clears = 0

    def __len__(self) -> int:
        return len(self.results)

    def get(self, topic: str) -> Result | None:
        result = self.results.get(topic)
        if result is None:
            self.misses += 1
        else:
            self.hits += 1
        return result

    def put(self, topic: str, levels: Sequence[str], result: Result) -> None:
        """Cache ``result`` for ``topic`` (``levels`` are its levels, kept for the API)."""
        results = self.results
        if topic not in results:
            self._unindexed.append(topic)
        results[topic] = result
        if len(results) > self.max_entries:
            self._sweep()

    def clear(self) -> None:
        if self.results:
            self.clears += 1
        self.results = {}
        self._index = {}
        self._unindexed = []

    def _index_pending(self) -> None:
        """Add the topics cached since the last invalidation to the index."""
        index = self._index
        for topic in self._unindexed:
            node = index
            for level in topic.split("/"):
                child = node.get(level)
                if child is None:
                    child = node[level] = {}
                node = child
            node[_END] = topic
        self._unindexed = []

    def invalidate(self, flt: Filter) -> None:
        """Forget every cached topic ``flt`` can match."""
        if not self.results:
            return
        if flt.excludes_system:  # a wildcard first level: it can reach every cached topic
            self.clear()
            return
        if self._unindexed:
            self._index_pending()
        found: list[str] = []
        _collect(self._index, flt.levels, 0, flt.rest, found)
        for topic in found:
            self._forget(topic)
        self.invalidated += len(found)

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            entries=len(self.results),
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            invalidated=self.invalidated,
            clears=self.clears,
        )

    def _sweep(self) -> None:
        if self.sweep_to == 0:
            self.evictions += len(self.results)
            self.results = {}
            self._index = {}
            self._unindexed = []
            return
        if self._unindexed:
            self._index_pending()  # _forget walks the index
        excess = len(self.results) - self.sweep_to
        for topic in list(islice(self.results, excess)):
            self._forget(topic)
        self.evictions += excess

    def _forget(self, topic: str) -> None:
        del self.results[topic]
        path = []
        node = self._index
        for level in topic.split("/"):
            path.append((node, level))
            node = node[level]
        del node[_END]
        for parent, level in reversed(path):
            if parent[level]:
                break
            del parent[level]


def _collect(
    node: dict[Any, Any], tokens: tuple[Token, ...], i: int, rest: Rest | None, out: list[str]
) -> None:
    """Append the indexed topics below ``node`` that ``tokens[i:]`` + ``rest`` match."""
    if i == len(tokens):
        if rest is None or rest.min_levels == 0:
            topic = node.get(_END)
            if topic is not None:
                out.append(topic)
        if rest is not None:
            stack = [child for key, child in node.items() if key is not _END]
            while stack:
                below = stack.pop()
                for key, child in below.items():
                    if key is _END:
                        out.append(child)
                    else:
                        stack.append(child)
        return
    token = tokens[i]
    if token.__class__ is str:
        child = node.get(token)
        if child is not None:
            _collect(child, tokens, i + 1, rest, out)
    elif token is STAR:
        for key, child in node.items():
            if key is not _END:
                _collect(child, tokens, i + 1, rest, out)
    else:
        prefix = token.prefix  # type: ignore[union-attr]
        for key, child in node.items():
            if key is not _END and key.startswith(prefix):
                _collect(child, tokens, i + 1, rest, out)
