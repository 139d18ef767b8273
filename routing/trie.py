"""The match trie: one node per filter level, with wildcard slots.

Like the level structure in nats-server's sublist, each node keeps its
literal children (``literal``) plus dedicated slots for ``*`` (``star``) and
for prefix stars (``prefixes``, by prefix), and holds subscribers where a
filter ends: ``exact`` (the filter ends here) and ``rest`` (native ``>``
here: one or more levels follow). MQTT ``a/#`` matches ``a`` and one or more
levels below it, which is ``a`` and ``a/>``: it is held in both slots of
node ``a``. Matching a topic follows, per level, at most one literal child,
the star child and the prefix children that fit, so its cost grows with
topic depth and the size of the answer, never with the number of
subscriptions.

Memory: a broker holds about 1.6 nodes per distinct filter, and most nodes
have one literal child and one subscriber, so neither gets a container of
its own (a dict costs 184-224 bytes, the node itself 88):

- ``literal`` and ``prefixes`` hold the lone child itself, which knows its
  token (``key``), and become a dict token -> child at the second child;
- a holder slot holds the lone subscriber itself, and becomes a dict
  subscriber -> reference count once a second subscriber, or a second
  reference of the same one, arrives (one subscriber may reach the same
  node through two filters: ``a/*`` native and ``a/+`` mqtt). Subscribers
  are hashable, so never a dict; ``None`` is kept in a dict, since an empty
  slot is None.

A walk that misses the match cache begins where the walk of its topic's
first ``HEAD_LEVELS`` levels ended, kept by those levels (``_heads``: the
topics of a hierarchy share few heads, ~40 in the ``beacon`` workload), so it
visits only the nodes of its last levels: a cold match of a six-level topic
over 10,000 filters takes 1.5 us instead of 1.95. Any insert or delete empties
``_heads`` (a walk holds nodes and holders), and it keeps at most
``MAX_HEADS`` walks.

Removing the last reference prunes empty nodes and shrinks a dict of one
back to the lone form, so an emptied trie has a single root node again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from routing.filters import STAR, Filter

#: The levels of a topic whose walk ``collect`` keeps (see ``MatchTrie._heads``), and how
#: many such walks it keeps (emptied when full).
HEAD_LEVELS = 3
MAX_HEADS = 4096
#: What a holder slot keeps: a lone subscriber, or subscriber -> reference count.
Holder = Hashable | dict[Hashable, int]


class _Node:
    __slots__ = ("exact", "key", "literal", "prefixes", "rest", "star")

    def __init__(self, key: str | None = None) -> None:
        self.key = key  # the literal token or prefix this node is reached by (None for *)
        self.literal: _Node | dict[str, _Node] | None = None
        self.star: _Node | None = None
        self.prefixes: _Node | dict[str, _Node] | None = None
        self.exact: Holder | None = None
        self.rest: Holder | None = None

    def is_empty(self) -> bool:
        return (
            self.literal is None
            and self.star is None
            and self.prefixes is None
            and self.exact is None
            and self.rest is None
        )


def _holding(holder: Holder | None, subscriber: Hashable) -> bool:
    if holder is None:
        return False
    if holder.__class__ is dict:
        return subscriber in holder  # type: ignore[operator]
    return holder is subscriber or holder == subscriber


def _release(holder: Holder, subscriber: Hashable) -> Holder | None:
    """The slot's new value with one reference of ``subscriber`` (which it holds) less."""
    if holder.__class__ is not dict:
        return None
    count = holder[subscriber]  # type: ignore[index]
    if count > 1:
        holder[subscriber] = count - 1  # type: ignore[index]
    else:
        del holder[subscriber]  # type: ignore[attr-defined]
        if not holder:  # (only when it held None alone)
            return None
    if len(holder) == 1:  # type: ignore[arg-type]
        ((only, left),) = holder.items()  # type: ignore[union-attr]
        if left == 1 and only is not None:
            return only  # back to the lone form
    return holder


def _child(children: _Node | dict[str, _Node] | None, key: str) -> _Node | None:
    """The child reached by ``key`` in a ``literal`` or ``prefixes`` slot."""
    if children is None:
        return None
    if children.__class__ is _Node:
        return children if children.key == key else None  # type: ignore[union-attr]
    return children.get(key)  # type: ignore[union-attr]


def _add_child(children: _Node | dict[str, _Node] | None, child: _Node) -> _Node | dict:
    """The slot's new value once ``child`` (with its ``key``) joins it."""
    if children is None:
        return child
    if children.__class__ is _Node:
        return {children.key: children, child.key: child}  # type: ignore[union-attr]
    children[child.key] = child  # type: ignore[index]
    return children  # type: ignore[return-value]


def _drop_child(children: _Node | dict[str, _Node], key: str) -> _Node | dict | None:
    """The slot's new value once the child at ``key`` is gone."""
    if children.__class__ is _Node:
        return None
    del children[key]  # type: ignore[union-attr]
    if len(children) == 1:  # type: ignore[arg-type]
        (only,) = children.values()  # type: ignore[union-attr]
        return only
    return children


def _hold(holder: Holder | None, subscriber: Hashable) -> Holder:
    """The slot's new value with one more reference of ``subscriber``."""
    if holder is None:
        return subscriber if subscriber is not None else {None: 1}
    if holder.__class__ is dict:
        holder[subscriber] = holder.get(subscriber, 0) + 1  # type: ignore[index,union-attr]
        return holder
    if holder is subscriber or holder == subscriber:
        return {subscriber: 2}
    return {holder: 1, subscriber: 1}


class MatchTrie:
    """Filters -> subscribers, answering "who wants this topic" by walking levels."""

    __slots__ = ("_heads", "_root", "nodes")

    def __init__(self) -> None:
        self._root = _Node()
        self.nodes = 1
        # The walk of a topic's first HEAD_LEVELS levels, by those levels: (the nodes
        # reached, the lone subscribers and the dicts of the holders met on the way). Most
        # topics of a hierarchy share few heads (beacon/{region}/{country}: ~40), so a
        # cold topic walks its last levels only. Emptied by every change of the trie.
        self._heads: dict[tuple[str, ...], tuple[list[_Node], list, list]] = {}

    def insert(self, flt: Filter, subscriber: Hashable) -> None:
        if self._heads:
            self._heads = {}
        node = self._root
        for token in flt.levels:
            if token.__class__ is str:
                children = node.literal
                if children.__class__ is _Node:
                    child = children if children.key == token else None  # type: ignore[union-attr]
                else:
                    child = children.get(token) if children is not None else None  # type: ignore[union-attr,arg-type]
                if child is None:
                    child = _Node(token)  # type: ignore[arg-type]
                    node.literal = _add_child(children, child)
                    self.nodes += 1
            elif token is STAR:
                child = node.star
                if child is None:
                    child = node.star = _Node()
                    self.nodes += 1
            else:
                prefix = token.prefix  # type: ignore[union-attr]
                child = _child(node.prefixes, prefix)
                if child is None:
                    child = _Node(prefix)
                    node.prefixes = _add_child(node.prefixes, child)
                    self.nodes += 1
            node = child
        rest = flt.rest  # exact, rest, or both for MQTT '#' (see the module docstring)
        if rest is None or not rest.min_levels:
            holder = node.exact
            if holder is None and subscriber is not None:
                node.exact = subscriber
            else:
                node.exact = _hold(holder, subscriber)
        if rest is not None:
            holder = node.rest
            if holder is None and subscriber is not None:
                node.rest = subscriber
            else:
                node.rest = _hold(holder, subscriber)

    def delete(self, flt: Filter, subscriber: Hashable) -> bool:
        """Drop one reference; False when the filter/subscriber was not there.

        Callers keep their own record of what they inserted and delete only that: an MQTT
        ``a/#`` shares its slots with ``a`` and ``a/>``, so a subscriber holding both of
        those would pass for a holder of ``a/#`` too.
        """
        if self._heads:
            self._heads = {}
        path: list[tuple[_Node, object]] = []
        node: _Node | None = self._root
        for token in flt.levels:
            assert node is not None
            if token.__class__ is str:  # _child, inlined: a broker deletes once per UNSUB
                children = node.literal
                if children.__class__ is _Node:
                    child = children if children.key == token else None  # type: ignore[union-attr]
                else:
                    child = children.get(token) if children is not None else None  # type: ignore[union-attr,arg-type]
            elif token is STAR:
                child = node.star
            else:
                child = _child(node.prefixes, token.prefix)  # type: ignore[union-attr]
            if child is None:
                return False
            path.append((node, token))
            node = child
        assert node is not None
        rest = flt.rest
        if rest is None:
            holder = node.exact
            if not _holding(holder, subscriber):
                return False
            node.exact = _release(holder, subscriber)  # type: ignore[arg-type]
        elif rest.min_levels:
            holder = node.rest
            if not _holding(holder, subscriber):
                return False
            node.rest = _release(holder, subscriber)  # type: ignore[arg-type]
        else:  # MQTT '#': both slots
            if not (_holding(node.exact, subscriber) and _holding(node.rest, subscriber)):
                return False
            node.exact = _release(node.exact, subscriber)  # type: ignore[arg-type]
            node.rest = _release(node.rest, subscriber)  # type: ignore[arg-type]
        if node.exact is None or node.rest is None:  # (else the node is not empty)
            self._prune(path, node)
        return True

    def _prune(self, path: list[tuple[_Node, object]], node: _Node) -> None:
        for parent, token in reversed(path):
            if not node.is_empty():
                return
            if token.__class__ is str:
                assert parent.literal is not None
                parent.literal = _drop_child(parent.literal, token)  # type: ignore[arg-type]
            elif token is STAR:
                parent.star = None
            else:
                assert parent.prefixes is not None
                parent.prefixes = _drop_child(parent.prefixes, token.prefix)  # type: ignore[attr-defined]
            self.nodes -= 1
            node = parent

    def collect(self, levels: Sequence[str]) -> tuple[list[Hashable], list[dict[Hashable, int]]]:
        """Who holds a filter matching the (valid) topic ``levels``: the lone subscribers
        of the matching holders, and the dicts of the others.

        A subscriber may appear more than once; the caller deduplicates.
        """
        first = levels[0]
        if first[:1] == "$":
            # System topic: only a literal first level or a `$` prefix (`$*`, `$SYS*`) may
            # match it; a non-empty prefix that fits `first` starts with `$`.
            root = self._root
            child = _child(root.literal, first)
            nodes = [child] if child is not None else []
            if root.prefixes is not None:
                _fitting(root.prefixes, first, nodes)
            lone: list[Hashable] = []
            dicts: list[dict[Hashable, int]] = []
            nodes = _descend(nodes, levels[1:], lone, dicts)
        elif len(levels) > HEAD_LEVELS:  # the head's walk is known, or kept (``_heads``)
            head = tuple(levels[:HEAD_LEVELS])
            walked = self._heads.get(head)
            if walked is None:
                lone, dicts = [], []
                walked = (_descend([self._root], head, lone, dicts), lone, dicts)
                if len(self._heads) >= MAX_HEADS:
                    self._heads = {}
                self._heads[head] = walked
            nodes, lone, dicts = walked[0], walked[1][:], walked[2][:]
            nodes = _descend(nodes, levels[HEAD_LEVELS:], lone, dicts)
        else:
            lone, dicts = [], []
            nodes = _descend([self._root], levels, lone, dicts)
        for node in nodes:
            holder = node.exact
            if holder is not None:
                if holder.__class__ is dict:
                    dicts.append(holder)  # type: ignore[arg-type]
                else:
                    lone.append(holder)
        return lone, dicts


def _descend(
    nodes: list[_Node],
    levels: Sequence[str],
    lone: list[Hashable],
    dicts: list[dict[Hashable, int]],
) -> list[_Node]:
    """The nodes reached from ``nodes`` by ``levels``; the holders of a ``>`` met on the
    way are appended to ``lone`` and ``dicts``."""
    for level in levels:
        if not nodes:
            return nodes
        nxt: list[_Node] = []
        for node in nodes:
            holder = node.rest
            if holder is not None:
                if holder.__class__ is dict:
                    dicts.append(holder)  # type: ignore[arg-type]
                else:
                    lone.append(holder)
            literal = node.literal
            if literal is not None:
                if literal.__class__ is _Node:
                    if literal.key == level:  # type: ignore[union-attr]
                        nxt.append(literal)  # type: ignore[arg-type]
                else:
                    child = literal.get(level)  # type: ignore[union-attr]
                    if child is not None:
                        nxt.append(child)
            if node.star is not None:
                nxt.append(node.star)
            if node.prefixes is not None:
                _fitting(node.prefixes, level, nxt)
        nodes = nxt
    return nodes


def _fitting(prefixes: _Node | dict[str, _Node], level: str, into: list[_Node]) -> None:
    """Append the prefix children whose prefix ``level`` starts with."""
    if prefixes.__class__ is _Node:
        if level.startswith(prefixes.key):  # type: ignore[union-attr,arg-type]
            into.append(prefixes)  # type: ignore[arg-type]
    elif len(prefixes) <= len(level) + 1:  # type: ignore[arg-type]
        for prefix, child in prefixes.items():  # type: ignore[union-attr]
            if level.startswith(prefix):
                into.append(child)
    else:
        for end in range(len(level) + 1):
            child = prefixes.get(level[:end])  # type: ignore[union-attr]
            if child is not None:
                into.append(child)
