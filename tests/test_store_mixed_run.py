"""A batch of appends and ``trim_through`` works (a durable session at its quota,
drop-oldest) leaves exactly the rows that running its works one at a time leaves
(``SqliteBackend._mixed_run`` coalesces each session's trims)."""

from __future__ import annotations

import tempfile
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import DB_FILENAME
from broker.store.sqlite import Append, SqliteBackend, Work

CLIENTS = ["a", "b", "c"]

#: One publish: the sessions it goes to (indexes; 3, rarely, is a session that does not
#: exist: the batch then runs one work at a time), a publisher id (from a tiny pool, so that
#: duplicates happen) and the payload size.
PUBLISH = st.tuples(
    st.lists(st.sampled_from([0, 1, 2] * 10 + [3]), min_size=0, max_size=3, unique=True),
    st.sampled_from([None, None, "p0", "p1", "p2"]),
    st.integers(0, 4),
)
#: A stray trim, not the broker's way: any session, any seq (below, at or past its newest).
STRAY = st.tuples(st.sampled_from([0, 1, 2] * 10 + [3]), st.integers(-1, 12))
STEP = st.one_of(PUBLISH, PUBLISH, PUBLISH, STRAY)


def _open(directory: str, retention: float) -> SqliteBackend:
    backend = SqliteBackend.open(
        Path(directory) / DB_FILENAME,
        retention_seconds=retention,
        dedup_window=1_000,
        durable=False,
        clock=lambda: 1000.0,
    )
    for client_id in CLIENTS:
        backend.run(partial(SqliteBackend.create_session, client_id=client_id, group=None))
    return backend


def _works(
    limits: list[int], steps: list[Any], next_seq: dict[str, int], held: dict[str, deque[int]]
) -> list[Work]:
    """The broker's works for ``steps``: each publish's append, then a trim through the
    oldest seqs of each session it leaves over its limit; stray trims among them."""
    names = [*CLIENTS, "ghost"]
    works: list[Work] = []
    for step in steps:
        if len(step) == 2:
            client, seq = step
            works.append(partial(SqliteBackend.trim_through, client_id=names[client], seq=seq))
            continue
        targets, publisher_id, size = step
        deliveries = []
        for target in targets:
            client_id = names[target]
            seq = next_seq.get(client_id, 1)
            next_seq[client_id] = seq + 1
            deliveries.append((client_id, seq))
        n = len(works)
        works.append(
            Append(f"m{n}", "t", b"x" * size, None, tuple(deliveries), publisher_id, n % 5 == 0)
        )
        for client_id, seq in deliveries:
            if client_id == "ghost":
                continue
            queue = held[client_id]
            queue.append(seq)
            limit = limits[CLIENTS.index(client_id)]
            through = None
            while len(queue) > limit:
                through = queue.popleft()
            if through is not None:
                works.append(partial(SqliteBackend.trim_through, client_id=client_id, seq=through))
    return works


def _state(backend: SqliteBackend) -> tuple[Any, ...]:
    conn = backend.conn
    return (
        conn.execute("SELECT * FROM messages ORDER BY rowid").fetchall(),
        conn.execute("SELECT * FROM deliveries ORDER BY client_id, seq").fetchall(),
        conn.execute("SELECT client_id, last_ack, next_seq FROM sessions ORDER BY 1").fetchall(),
        conn.execute("SELECT * FROM published ORDER BY rowid").fetchall(),
        conn.execute("SELECT * FROM retained").fetchall(),
        backend.counts(),
    )


def _outcomes(outcomes: list[tuple[bool, Any]]) -> list[tuple[bool, Any]]:
    return [(ok, value if ok else type(value)) for ok, value in outcomes]


@settings(max_examples=300, deadline=None)
@given(
    limits=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    before=st.lists(PUBLISH, max_size=6),
    steps=st.lists(STEP, min_size=1, max_size=30),
    retention=st.sampled_from([0.0, 0.0, 60.0]),
)
def test_a_batch_of_appends_and_trims_stores_what_one_work_at_a_time_stores(
    limits: list[int], before: list[Any], steps: list[Any], retention: float
) -> None:
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as each:
        batched, single = _open(one, retention), _open(each, retention)
        try:
            next_seq: dict[str, int] = {}
            held: dict[str, deque[int]] = {client_id: deque() for client_id in CLIENTS}
            for work in _works(limits, before, next_seq, held):  # rows there before the batch
                batched.run_batch([work])
                single.run_batch([work])
            works = _works(limits, steps, next_seq, held)
            _, outcomes = batched.run_batch(works)
            expected = [single.run_batch([work])[1][0] for work in works]
            assert _outcomes(outcomes) == _outcomes(expected)
            assert _state(batched) == _state(single)
        finally:
            batched.close()
            single.close()
