"""Mesh shapes as data, (ids, edges), shared by the in-memory and the process tests.

For an edge ``(a, b)`` of a mesh of processes, ``a`` dials ``b``.
"""

from __future__ import annotations

Edges = list[tuple[str, str]]

# -- topologies as data: (ids, edges); for an edge (a, b), a dials b -------------------------

LINE = (["a", "b", "c"], [("a", "b"), ("b", "c")])
RING4 = (["r0", "r1", "r2", "r3"], [("r0", "r1"), ("r1", "r2"), ("r2", "r3"), ("r3", "r0")])
STAR5 = (["hub", "s1", "s2", "s3", "s4"], [("hub", f"s{i}") for i in range(1, 5)])


def grid(n: int) -> tuple[list[str], Edges]:
    """``n`` x ``n`` brokers ``g00`` .. ``g{n-1}{n-1}``, linked to their right and lower
    neighbours."""
    ids = [f"g{r}{c}" for r in range(n) for c in range(n)]
    edges = []
    for r in range(n):
        for c in range(n):
            if c + 1 < n:
                edges.append((f"g{r}{c}", f"g{r}{c + 1}"))
            if r + 1 < n:
                edges.append((f"g{r}{c}", f"g{r + 1}{c}"))
    return ids, edges


GRID3 = grid(3)
TOPOLOGIES: dict[str, tuple[list[str], Edges]] = {
    "line": LINE,
    "ring4": RING4,
    "star5": STAR5,
    "grid3x3": GRID3,
}
