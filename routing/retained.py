"""A trie of topics (not filters): the last value kept per topic, found by filter.

``RetainedTrie`` maps each topic to one value (a broker keeps the last retained message of a
topic in it) and answers "which topics does this filter match?" by walking only the branches
the filter can reach, one level per step:

- a literal level follows one child;
- ``*`` (native) or ``+`` (mqtt) follows every child;
- a prefix ``abc*`` follows the children whose level starts with ``abc`` (it looks at every
  child of that node to find them);
- a trailing ``>`` (one or more levels) or ``#`` (zero or more) takes the whole subtree.

The ``$`` rule holds as in ``Filter.matches``: a filter whose first level is a wildcard that
does not name ``$`` (``*``, ``+``, ``>``, ``#``, a prefix not starting with ``$``) skips the
first-level children that start with ``$``.

Cost: a walk visits the nodes on the paths to its answers plus the children of the nodes
where a wildcard level fans out, so it grows with the size of the answer (and the fan-out of
the levels a wildcard crosses), never with the number of topics held. Topics are taken as
valid (``routing.validate_topic``); the trie only splits them on ``/``.

Memory: one node per distinct topic level path, with a dict of children only where there
are children; removing a topic prunes the nodes left empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from routing.filters import STAR, Filter
from routing.topics import SEPARATOR

__all__ = ["RetainedTrie"]

V = TypeVar("V")


class _Node:
    __slots__ = ("children", "topic", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.topic: str | None = None  # set where a topic ends (its value is held here)
        self.value: object = None


class RetainedTrie(Generic[V]):
    """Topic -> value, with ``matching(filter)`` walking only what the filter can match."""

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, topic: str, value: V) -> None:
        """Hold ``value`` for ``topic``, replacing what was held."""
        node = self._root
        for level in topic.split(SEPARATOR):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        if node.topic is None:
            node.topic = topic
            self._count += 1
        node.value = value

    def get(self, topic: str) -> V | None:
        """The value held for ``topic``, or None."""
        node = self._find(topic)
        if node is None or node.topic is None:
            return None
        return node.value  # type: ignore[return-value]

    def discard(self, topic: str) -> V | None:
        """Forget ``topic``; the value it held, or None when it held none."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split(SEPARATOR):
            children = node.children
            child = None if children is None else children.get(level)
            if child is None:
                return None
            path.append((node, level))
            node = child
        if node.topic is None:
            return None
        value = node.value
        node.topic = None
        node.value = None
        self._count -= 1
        # prune the nodes left with neither a topic nor children, from the leaf up
        for parent, level in reversed(path):
            if node.topic is not None or node.children:
                break
            children = parent.children
            assert children is not None
            del children[level]
            if not children:
                parent.children = None
            node = parent
        return value  # type: ignore[return-value]

    def items(self) -> Iterator[tuple[str, V]]:
        """Every (topic, value) held, in no particular order."""
        yield from self._subtree(self._root, include_self=False, skip_system=False)

    def matching(self, flt: Filter) -> Iterator[tuple[str, V]]:
        """The (topic, value) pairs whose topic ``flt`` matches, in no particular order."""
        levels = flt.levels
        depth = len(levels)
        rest = flt.rest
        skip_system = flt.excludes_system
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        pop = stack.pop
        push = stack.append
        while stack:
            node, i = pop()
            if i == depth:
                if rest is None:
                    if node.topic is not None:
                        yield node.topic, node.value  # type: ignore[misc]
                else:
                    yield from self._subtree(
                        node, include_self=rest.min_levels == 0, skip_system=skip_system and i == 0
                    )
                continue
            children = node.children
            if children is None:
                continue
            token = levels[i]
            if token.__class__ is str:
                child = children.get(token)  # type: ignore[call-overload]
                if child is not None:
                    push((child, i + 1))
            elif token is STAR:
                if i == 0 and skip_system:
                    for name, child in children.items():
                        if not name.startswith("$"):
                            push((child, 1))
                else:
                    for child in children.values():
                        push((child, i + 1))
            else:  # Prefix: its own text keeps '$' names out unless it starts with '$'
                prefix = token.prefix  # type: ignore[union-attr]
                for name, child in children.items():
                    if name.startswith(prefix):
                        push((child, i + 1))

    # -- helpers -------------------------------------------------------------------------

    def _find(self, topic: str) -> _Node | None:
        node = self._root
        for level in topic.split(SEPARATOR):
            children = node.children
            if children is None:
                return None
            child = children.get(level)
            if child is None:
                return None
            node = child
        return node

    @staticmethod
    def _subtree(node: _Node, *, include_self: bool, skip_system: bool) -> Iterator[tuple[str, V]]:
        """The (topic, value) pairs at and below ``node`` (``node`` itself if
        ``include_self``); ``skip_system`` leaves out its children starting with ``$``."""
        if include_self and node.topic is not None:
            yield node.topic, node.value  # type: ignore[misc]
        children = node.children
        if children is None:
            return
        stack = [child for name, child in children.items() if not (skip_system and name[:1] == "$")]
        pop = stack.pop
        extend = stack.extend
        while stack:
            node = pop()
            if node.topic is not None:
                yield node.topic, node.value  # type: ignore[misc]
            if node.children is not None:
                extend(node.children.values())
