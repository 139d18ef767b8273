"""Route summarization: advertise to peers only the filters nothing else covers.

A broker may hold 50,000 filters while a few wide ones (``beacon/eu/>``)
cover most of them. A peer only needs the wide ones: an event a covered
filter wants reaches this broker through its coverer anyway. ``Summarizer``
keeps that minimal set exact (``routing.covers``) as filters come and go,
and reports each change as a delta, so a peer link sends only what moved.

Each subscribe or unsubscribe costs work in proportion to the filters it
affects, not to all the filters held, because every question is answered
through one topic a filter matches (its *sample*):

- who covers F? A coverer matches every topic F matches, F's sample
  included, so matching the sample against a trie of the advertised
  filters finds every candidate;
- whom does F cover? Whatever F covers has its sample matched by F, so
  walking F over a trie of the local filters' samples (``_SampleIndex``)
  finds every candidate: the advertised ones when F is advertised, the
  others when F goes and what it covered may need advertising.

Candidates are confirmed with ``covers``, so the indexes only have to be
complete, never exact.

A filter that matches no valid topic (mqtt ``a/*``: ``*`` is an ordinary
character there and topics never contain it) is covered by every filter
(``covers`` says so, vacuously) and is never advertised: peers gain nothing
from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from routing.covering import covers
from routing.filters import NATIVE, STAR, Filter
from routing.trie import MatchTrie

# The value a sample gives a wildcard level: one byte, like the `*`, `+`, `>` or `#` it
# stands for, so a sample is never longer than its filter; never starts with `$` (a sample
# starts with `$` only when its filter names system topics: `$SYS/x`, `$SYS*/>`).
_FILL: Final = "x"


@dataclass(frozen=True, slots=True)
class SummaryChange:
    """What peers must be told after one add or remove.

    A filter never appears in both tuples; ``withdraw`` lists only filters
    that were advertised, ``advertise`` only ones that were not.
    """

    advertise: tuple[Filter, ...]
    withdraw: tuple[Filter, ...]

    def __bool__(self) -> bool:
        return bool(self.advertise or self.withdraw)


NO_CHANGE: Final = SummaryChange((), ())


def sample_levels(flt: Filter) -> tuple[str, ...] | None:
    """The levels of one valid topic ``flt`` matches; None when it matches none.

    Wildcards become ``"x"``, a prefix level ``abc*`` becomes ``abc`` (which
    it matches; ``$*`` becomes ``$``), ``>`` one ``"x"`` level, ``#`` none
    (one if it is the whole filter). Each level is no longer than the filter
    level it comes from, so the sample is within the byte and level limits
    whenever ``flt`` is.
    """
    if flt.dialect == NATIVE and "*" not in flt.text:  # literals, maybe a trailing '>'
        literals: tuple[str, ...] = flt.levels  # type: ignore[assignment]
        return literals if flt.rest is None else (*literals, _FILL)
    levels: list[str] = []
    for token in flt.levels:
        if token.__class__ is str:
            if "*" in token or ">" in token:  # mqtt only: a character no topic holds
                return None
            levels.append(token)  # type: ignore[arg-type]
        elif token is STAR:
            levels.append(_FILL)
        else:
            levels.append(token.prefix)  # type: ignore[union-attr]
    if flt.rest is not None:
        levels.extend([_FILL] * max(flt.rest.min_levels, 0 if levels else 1))
    return tuple(levels)


def matches_nothing(flt: Filter) -> bool:
    """True when no valid topic matches ``flt`` (mqtt ``a/*``; never a native filter)."""
    return sample_levels(flt) is None


# A node of the sample index is a plain dict, level -> child node, one object per node
# (the cyclic GC scans every container, so fewer objects make subscribe storms cheaper).
# Filters whose sample ends at a node sit under the key NUL, which no level holds: the
# Filter itself, or an ordered set (dict) of them when samples coincide (`a/*`, `a/x`).
_Tree = dict[str, Any]
_HERE: Final = "\x00"


class _SampleIndex:
    """Local filters keyed by their sample topic, to ask: which samples does F match?

    ``SubscriptionTable.filters_under`` could name candidates too, but only
    by F's literal head and at most ``INDEX_DEPTH`` levels deep: 50,000
    device filters under one four-level site would be scanned whole on every
    subscribe. Walking F's own levels prunes at every level.
    """

    __slots__ = ("_root",)

    def __init__(self) -> None:
        self._root: _Tree = {}

    def add(self, flt: Filter, sample: tuple[str, ...]) -> None:
        node = self._root
        for level in sample:
            child = node.get(level)
            if child is None:
                child = node[level] = {}
            node = child
        here = node.get(_HERE)
        if here is None:
            node[_HERE] = flt
        elif here.__class__ is dict:
            here[flt] = None
        else:
            node[_HERE] = {here: None, flt: None}  # an ordered set

    def remove(self, flt: Filter, sample: tuple[str, ...]) -> None:
        path: list[_Tree] = [self._root]
        for level in sample:
            path.append(path[-1][level])
        node = path[-1]
        here = node[_HERE]
        if here.__class__ is dict:
            del here[flt]
            if len(here) == 1:
                node[_HERE] = next(iter(here))
            return
        assert here == flt
        del node[_HERE]
        for depth in range(len(sample) - 1, -1, -1):  # prune the emptied branch
            if path[depth + 1]:
                return
            del path[depth][sample[depth]]

    def matched_by(self, flt: Filter) -> list[Filter]:
        """Every filter whose sample ``flt`` matches, ``$`` rule included."""
        found: list[Filter] = []
        tokens = flt.levels
        last = len(tokens)
        stack: list[tuple[_Tree, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == last:
                if flt.rest is None:
                    here = node.get(_HERE)
                    if here is not None:
                        _found_here(here, found)
                else:
                    _collect(node, flt.rest.min_levels, i == 0, found)
                continue
            token = tokens[i]
            if token.__class__ is str:
                child = node.get(token)  # type: ignore[call-overload]
                if child is not None:
                    stack.append((child, i + 1))
                continue
            if token is STAR:  # at level 0 it hides `$` samples
                for level, child in node.items():
                    if level != _HERE and not (i == 0 and level[:1] == "$"):
                        stack.append((child, i + 1))
                continue
            prefix = token.prefix  # type: ignore[union-attr]  # never "": that is STAR
            for level, child in node.items():
                if level.startswith(prefix):  # a `$` prefix names `$` samples
                    stack.append((child, i + 1))
        return found


def _found_here(here: Filter | dict[Filter, None], found: list[Filter]) -> None:
    if here.__class__ is dict:
        found.extend(here)  # type: ignore[arg-type]
    else:
        found.append(here)  # type: ignore[arg-type]


def _collect(top: _Tree, min_depth: int, hide_system: bool, found: list[Filter]) -> None:
    """Filters at least ``min_depth`` levels below ``top`` (for a trailing ``>``/``#``)."""
    stack: list[tuple[_Tree, int]] = [(top, 0)]
    while stack:
        node, depth = stack.pop()
        for level, child in node.items():
            if level == _HERE:
                if depth >= min_depth:
                    _found_here(child, found)
            elif not (hide_system and depth == 0 and level[:1] == "$"):
                stack.append((child, depth + 1))


class Summarizer:
    """The local filters (reference counted) and the minimal set advertised for them.

    Invariants after every call: the advertised filters are local filters;
    none covers another; every local filter that matches anything is
    advertised or covered by an advertised filter. Of equivalent filters
    (native ``a/*``, mqtt ``a/+``) the one that came first is advertised.

    The advertised filters live in a bare ``MatchTrie`` (what
    ``SubscriptionTable.match`` walks), not a whole ``SubscriptionTable``:
    its per-filter records and ``filters_under`` index (a pygtrie walk for
    every new place) are unused here and cost more than this whole class in
    a 50,000 filter storm.
    """

    def __init__(self) -> None:
        self._refs: dict[Filter, int] = {}
        # sample (None: matches nothing) and arrival number; a tuple, not an object: the
        # cyclic GC stops tracking a tuple of atoms, never an object
        self._info: dict[Filter, tuple[tuple[str, ...] | None, int]] = {}
        self._arrivals = 0
        self._advertised: dict[Filter, None] = {}  # an ordered set
        self._snapshot: frozenset[Filter] | None = frozenset()
        self._coverers = MatchTrie()  # the advertised filters: who covers F?
        self._samples = _SampleIndex()  # local filters that match something: whom F covers

    def add(self, flt: Filter) -> SummaryChange:
        """Take one more reference to ``flt``; only the first can change the summary."""
        refs = self._refs.get(flt)
        if refs is not None:
            self._refs[flt] = refs + 1
            return NO_CHANGE
        self._refs[flt] = 1
        self._arrivals += 1
        sample = sample_levels(flt)
        self._info[flt] = (sample, self._arrivals)
        if sample is None:
            return NO_CHANGE
        self._samples.add(flt, sample)
        if self._is_covered(flt, sample):
            return NO_CHANGE
        withdrawn = self._covered_by(flt)
        for old in withdrawn:
            self._withdraw(old)
        self._advertise(flt)
        return SummaryChange((flt,), tuple(withdrawn))

    def remove(self, flt: Filter) -> SummaryChange:
        """Drop one reference; the last one may uncover filters ``flt`` covered.

        Raises KeyError for a filter that is not held.
        """
        refs = self._refs[flt]
        if refs > 1:
            self._refs[flt] = refs - 1
            return NO_CHANGE
        del self._refs[flt]
        sample = self._info.pop(flt)[0]
        if sample is None:
            return NO_CHANGE
        self._samples.remove(flt, sample)
        if flt not in self._advertised:
            return NO_CHANGE  # an advertised filter covers it, and so all it covers
        self._withdraw(flt)
        return self._advertise_uncovered(flt)

    @property
    def advertised(self) -> frozenset[Filter]:
        """The advertised filters: a snapshot, built at most once per change."""
        if self._snapshot is None:
            self._snapshot = frozenset(self._advertised)
        return self._snapshot

    def is_advertised(self, flt: Filter) -> bool:
        return flt in self._advertised

    def __len__(self) -> int:
        """Distinct local filters, matches-nothing ones included."""
        return len(self._refs)

    def __contains__(self, flt: object) -> bool:
        """Is ``flt`` a local filter (held at least once)?"""
        return isinstance(flt, Filter) and flt in self._refs

    def refcount(self, flt: Filter) -> int:
        """How many references to ``flt`` are held (0 when none)."""
        return self._refs.get(flt, 0)

    def statistics(self) -> dict[str, int]:
        """Counters for operators; ``covered`` includes filters that match nothing."""
        local = len(self._refs)
        advertised = len(self._advertised)
        return {"local": local, "advertised": advertised, "covered": local - advertised}

    def _is_covered(self, flt: Filter, sample: tuple[str, ...]) -> bool:
        """Does an advertised filter cover ``flt``? Every coverer matches its sample."""
        lone, dicts = self._coverers.collect(sample)
        for other in lone:
            if covers(other, flt):  # type: ignore[arg-type]
                return True
        for holder in dicts:
            for other in holder:
                if covers(other, flt):  # type: ignore[arg-type]
                    return True
        return False

    def _covered_by(self, flt: Filter) -> list[Filter]:
        """The advertised filters ``flt`` covers (``flt`` itself not advertised)."""
        advertised = self._advertised
        return [
            other
            for other in self._samples.matched_by(flt)
            if other in advertised and covers(flt, other)
        ]

    def _advertise_uncovered(self, gone: Filter) -> SummaryChange:
        """After withdrawing ``gone``: advertise what it alone covered, minimally.

        Only local filters ``gone`` covered can have lost cover. Taking the
        widest first makes it rare that one advertised here is withdrawn
        again here; when it happens it simply drops out of the change, so the
        result does not depend on the order.
        """
        candidates = [
            flt
            for flt in self._samples.matched_by(gone)
            if flt not in self._advertised and covers(gone, flt)
        ]
        candidates.sort(key=self._widest_first)
        advertised: dict[Filter, None] = {}  # ordered: the change lists them as found
        withdrawn = [gone]
        for flt in candidates:
            sample = self._info[flt][0]
            assert sample is not None
            if self._is_covered(flt, sample):
                continue
            for old in self._covered_by(flt):
                self._withdraw(old)
                if old in advertised:
                    del advertised[old]
                else:  # cannot happen while the invariants hold; kept for exactness
                    withdrawn.append(old)
            self._advertise(flt)
            advertised[flt] = None
        return SummaryChange(tuple(advertised), tuple(withdrawn))

    def _widest_first(self, flt: Filter) -> tuple[int, int, int, bool, int, int]:
        """Sort key: a coverer sorts before what it covers; ties go to the oldest.

        A coverer's literal levels are a subset of the covered filter's, so
        it has no more of them; at equal literals its prefix levels are as
        many and no longer; then a trailing ``>``/``#`` before none, fewer
        required levels first (a topic has one at least). So a filter that
        strictly covers another sorts before it, and a covering pair ties
        only when the two are equivalent (checked over a small alphabet; the
        byte limit could make odd exceptions): the oldest is advertised, as
        when they are added.
        """
        literals = prefixes = prefix_chars = 0
        for token in flt.levels:
            if token.__class__ is str:
                literals += 1
            elif token is not STAR:
                prefixes += 1
                prefix_chars += len(token.prefix)  # type: ignore[union-attr]
        rest = flt.rest
        required = max(len(flt.levels) + (rest.min_levels if rest is not None else 0), 1)
        return (literals, prefixes, prefix_chars, rest is None, required, self._info[flt][1])

    def _advertise(self, flt: Filter) -> None:
        self._advertised[flt] = None
        self._coverers.insert(flt, flt)
        self._snapshot = None

    def _withdraw(self, flt: Filter) -> None:
        del self._advertised[flt]
        self._coverers.delete(flt, flt)
        self._snapshot = None
