"""The match trie: one node per filter level, with wildcard slots.

Like the level structure in nats-server's sublist, each node keeps its
literal children in a dict plus dedicated slots for ``*`` (``star``) and for
prefix stars (``prefixes``, keyed by prefix), and holds subscribers where a
filter ends: ``exact`` (the filter ends here), ``rest_one`` (native ``>``
here) and ``rest_any`` (MQTT ``#`` here). Matching a topic follows, per
level, at most one literal child, the star child and the prefix children
that fit, so its cost grows with topic depth and the size of the answer,
never with the number of subscriptions.

Holders map subscriber -> reference count, because one subscriber may reach
the same node through two filters (``a/*`` native and ``a/+`` mqtt).
Removing the last reference prunes empty nodes, so an emptied trie has a
single root node again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from routing.filters import REST_ANY, REST_ONE, STAR, Filter

Holder = dict[Hashable, int]


class _Node:
    __slots__ = ("exact", "literal", "prefixes", "rest_any", "rest_one", "star")

    def __init__(self) -> None:
        self.literal: dict[str, _Node] | None = None
        self.star: _Node | None = None
        self.prefixes: dict[str, _Node] | None = None
        self.exact: Holder | None = None
        self.rest_one: Holder | None = None
        self.rest_any: Holder | None = None

    def is_empty(self) -> bool:
        return (
            self.literal is None
            and self.star is None
            and self.prefixes is None
            and self.exact is None
            and self.rest_one is None
            and self.rest_any is None
        )


def _holder_slot(flt: Filter) -> str:
    if flt.rest is None:
        return "exact"
    if flt.rest is REST_ONE or flt.rest.min_levels == 1:
        return "rest_one"
    assert flt.rest is REST_ANY or flt.rest.min_levels == 0
    return "rest_any"


class MatchTrie:
    """Filters -> subscribers, answering "who wants this topic" by walking levels."""

    __slots__ = ("_root", "nodes")

    def __init__(self) -> None:
        self._root = _Node()
        self.nodes = 1

    def insert(self, flt: Filter, subscriber: Hashable) -> None:
        node = self._root
        for token in flt.levels:
            if token.__class__ is str:
                children = node.literal
                if children is None:
                    children = node.literal = {}
                child = children.get(token)  # type: ignore[arg-type]
                if child is None:
                    child = children[token] = _Node()  # type: ignore[index]
                    self.nodes += 1
            elif token is STAR:
                child = node.star
                if child is None:
                    child = node.star = _Node()
                    self.nodes += 1
            else:
                prefixes = node.prefixes
                if prefixes is None:
                    prefixes = node.prefixes = {}
                child = prefixes.get(token.prefix)  # type: ignore[union-attr]
                if child is None:
                    child = prefixes[token.prefix] = _Node()  # type: ignore[union-attr]
                    self.nodes += 1
            node = child
        rest = flt.rest  # _holder_slot, inlined: a broker inserts once per SUB
        if rest is None:
            holder = node.exact
            if holder is None:
                holder = node.exact = {}
        elif rest.min_levels:
            holder = node.rest_one
            if holder is None:
                holder = node.rest_one = {}
        else:
            holder = node.rest_any
            if holder is None:
                holder = node.rest_any = {}
        holder[subscriber] = holder.get(subscriber, 0) + 1

    def delete(self, flt: Filter, subscriber: Hashable) -> bool:
        """Drop one reference; False when the filter/subscriber was not there."""
        path: list[tuple[_Node, object]] = []
        node: _Node | None = self._root
        for token in flt.levels:
            assert node is not None
            if token.__class__ is str:
                child = node.literal.get(token) if node.literal else None  # type: ignore[arg-type]
            elif token is STAR:
                child = node.star
            else:
                child = node.prefixes.get(token.prefix) if node.prefixes else None  # type: ignore[union-attr]
            if child is None:
                return False
            path.append((node, token))
            node = child
        assert node is not None
        slot = _holder_slot(flt)
        holder: Holder | None = getattr(node, slot)
        if holder is None or subscriber not in holder:
            return False
        count = holder[subscriber] - 1
        if count:
            holder[subscriber] = count
            return True
        del holder[subscriber]
        if not holder:
            setattr(node, slot, None)
        self._prune(path, node)
        return True

    def _prune(self, path: list[tuple[_Node, object]], node: _Node) -> None:
        for parent, token in reversed(path):
            if not node.is_empty():
                return
            if token.__class__ is str:
                assert parent.literal is not None
                del parent.literal[token]  # type: ignore[arg-type]
                if not parent.literal:
                    parent.literal = None
            elif token is STAR:
                parent.star = None
            else:
                assert parent.prefixes is not None
                del parent.prefixes[token.prefix]  # type: ignore[attr-defined]
                if not parent.prefixes:
                    parent.prefixes = None
            self.nodes -= 1
            node = parent

    def collect(self, levels: Sequence[str]) -> list[Holder]:
        """The holders whose filters match the (valid) topic ``levels``.

        A subscriber may appear in several holders; the caller deduplicates.
        """
        found: list[Holder] = []
        root = self._root
        first = levels[0]
        if first[0] == "$":
            # System topic: only a literal first level or a `$` prefix (`$*`, `$SYS*`) may
            # match it; a non-empty prefix that fits `first` starts with `$`.
            child = root.literal.get(first) if root.literal else None
            nodes = [child] if child is not None else []
            prefixes = root.prefixes
            if prefixes is not None:
                nodes.extend(
                    child for prefix, child in prefixes.items() if first.startswith(prefix)
                )
            start = 1
        else:
            nodes = [root]
            start = 0
        for i in range(start, len(levels)):
            if not nodes:
                return found
            level = levels[i]
            nxt: list[_Node] = []
            for node in nodes:
                if node.rest_one is not None:
                    found.append(node.rest_one)
                if node.rest_any is not None:
                    found.append(node.rest_any)
                literal = node.literal
                if literal is not None:
                    child = literal.get(level)
                    if child is not None:
                        nxt.append(child)
                if node.star is not None:
                    nxt.append(node.star)
                prefixes = node.prefixes
                if prefixes is not None:
                    if len(prefixes) <= len(level) + 1:
                        for prefix, child in prefixes.items():
                            if level.startswith(prefix):
                                nxt.append(child)
                    else:
                        for end in range(len(level) + 1):
                            child = prefixes.get(level[:end])
                            if child is not None:
                                nxt.append(child)
            nodes = nxt
        for node in nodes:
            if node.exact is not None:
                found.append(node.exact)
            if node.rest_any is not None:
                found.append(node.rest_any)
        return found
