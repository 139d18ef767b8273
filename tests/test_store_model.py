"""Model-based test of the store's SQL (``SqliteBackend``) against a dict of sessions.

The model is what DESIGN.md says a durable session is: per client id a group, filters,
``last_ack``, ``next_seq`` and a dict of pending deliveries (seq -> message); plus the list of
recent publisher ids. Rules run batches of 1-4 operations through ``run_batch`` (one
transaction, a savepoint each), so operations that fail (unknown session, a seq stored twice)
share transactions with ones that succeed, exactly as under group commit. Seqs are assigned
the broker's way, from the model's ``next_seq``, and sometimes reuse a pending seq or skip
ahead. Client ids and publisher ids come from tiny pools so that operations collide, and a
small dedup window makes pruning happen.

After every step the invariant compares everything the backend can tell with the model: the
session records, every pending queue with its messages, the messages table (each message
once, ``refs`` exact, nothing unreferenced left) and the dedup ids, plus the in-memory counts.
The backend runs with synchronous=OFF (no crash here), so examples stay fast.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from broker.store import DB_FILENAME, SessionRecord, StoredMessage, StoreError
from broker.store.sqlite import Append, SqliteBackend

CLIENTS = ["a", "b", "c"]
PUBLISHER_IDS = ["p0", "p1", "p2", "p3", "p4", "p5"]
FILTERS = [("x/>", "native"), ("x/#", "mqtt"), ("y", "native")]
DEDUP_WINDOW = 3


@dataclass
class ModelSession:
    group: str | None
    last_ack: int = 0
    next_seq: int = 1
    filters: set[tuple[str, str]] = field(default_factory=set)
    pending: dict[int, StoredMessage] = field(default_factory=dict)  # seq -> message

    def record(self, client_id: str) -> SessionRecord:
        return SessionRecord(
            client_id,
            self.group,
            self.last_ack,
            self.next_seq,
            tuple(sorted(self.filters)),
            len(self.pending),
            sum(len(m.payload) for m in self.pending.values()),
        )


class Failed(Exception):
    """What the model expects when the store must raise StoreError."""


# Operation specs: (name, *choices). They become concrete operations (with seqs) only when the
# batch is built, from the model's state at that point of the batch.
# A client is picked when the batch is built: GHOST (no session) or an index into the sessions
# that exist at that point, so that most operations name a live session.
GHOST = -1
some_client = st.integers(GHOST, 5)
SPECS = {
    "append": st.tuples(
        st.just("append"),
        st.lists(some_client, min_size=1, max_size=3),
        st.sampled_from(["next"] * 6 + ["gap", "reuse"]),
        st.sampled_from([None, None, None, *PUBLISHER_IDS]),
        st.integers(0, 5),  # payload size
        st.booleans(),  # headers or not
    ),
    "ack": st.tuples(st.just("ack"), some_client, st.integers(0, 8)),
    "ack_one": st.tuples(st.just("ack_one"), some_client, st.integers(0, 8)),
    "trim": st.tuples(st.just("trim"), some_client, st.integers(0, 3)),
    "trim_through": st.tuples(st.just("trim_through"), some_client, st.integers(0, 8)),
    "create": st.tuples(st.just("create"), st.sampled_from(CLIENTS), st.sampled_from([None, "g"])),
    "drop": st.tuples(st.just("drop"), st.sampled_from(CLIENTS)),
    "set_filters": st.tuples(
        st.just("set_filters"), some_client, st.lists(st.sampled_from(FILTERS))
    ),
    "add_filter": st.tuples(st.just("add_filter"), some_client, st.sampled_from(FILTERS)),
    "remove_filter": st.tuples(st.just("remove_filter"), some_client, st.sampled_from(FILTERS)),
}
# Weights by repetition: queues must grow for acks and trims to mean something.
WEIGHTED = ["append"] * 12 + ["ack", "trim", "create", "drop", "set_filters", "add_filter"]
WEIGHTED += ["trim_through"] * 2
WEIGHTED += ["ack_one"] * 3 + ["remove_filter"]
op_specs = st.sampled_from(WEIGHTED).flatmap(SPECS.__getitem__)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="topiary-store-model-"))
        self.backend = self._open()
        self.sessions: dict[str, ModelSession] = {}
        self.published: list[str] = []
        self.serial = 0

    def _open(self) -> SqliteBackend:
        return SqliteBackend.open(self.dir / DB_FILENAME, dedup_window=DEDUP_WINDOW, durable=False)

    def teardown(self) -> None:
        self.backend.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- from a spec to (backend work, expected outcome), applying it to the model ---------------

    def client(self, choice: int) -> str:
        existing = sorted(self.sessions)
        if choice == GHOST or not existing:
            return "ghost"
        return existing[choice % len(existing)]

    def seq_for(self, client_id: str, mode: str) -> int:
        session = self.sessions.get(client_id)
        if session is None:
            return 1
        if mode == "reuse" and session.pending:
            return min(session.pending)
        return session.next_seq + (2 if mode == "gap" else 0)

    def pick_seq(self, client_id: str, choice: int) -> int:
        """A seq worth acking: a pending one, last_ack, next_seq - 1, beyond, or 0."""
        session = self.sessions.get(client_id)
        if session is None:
            return choice
        candidates = [*sorted(session.pending), session.last_ack, session.next_seq - 1]
        candidates += [session.next_seq + 1, 0]
        return candidates[choice % len(candidates)]

    def concretize(self, spec: tuple[Any, ...]) -> tuple[Any, Any]:
        """Return (work, expected) and apply the operation to the model when it succeeds."""
        name = spec[0]
        backend = SqliteBackend
        if name == "create":
            _, client_id, group = spec
            self.sessions.setdefault(client_id, ModelSession(group))
            expected = self.sessions[client_id].record(client_id)
            return partial(backend.create_session, client_id=client_id, group=group), expected
        if name == "drop":
            (_, client_id) = spec
            existed = self.sessions.pop(client_id, None) is not None
            return partial(backend.drop_session, client_id=client_id), existed
        if name == "append":
            clients = list(dict.fromkeys(self.client(choice) for choice in spec[1]))
            return self.concretize_append(clients, *spec[2:])
        client_id = self.client(spec[1])
        session = self.sessions.get(client_id)
        if name == "ack":
            seq = self.pick_seq(client_id, spec[2])
            work = partial(backend.ack, client_id=client_id, seq=seq)
            if session is None:
                return work, Failed
            removed = [s for s in session.pending if s <= seq]
            for s in removed:
                del session.pending[s]
            if seq > session.last_ack:
                session.last_ack = seq
                session.next_seq = max(session.next_seq, seq + 1)
            return work, len(removed)
        if name == "ack_one":
            seq = self.pick_seq(client_id, spec[2])
            work = partial(backend.ack_one, client_id=client_id, seq=seq)
            if session is None:
                return work, Failed
            if seq not in session.pending:
                return work, False
            lowest = min(session.pending)
            del session.pending[seq]
            if seq == lowest:
                following = min(session.pending, default=None)
                watermark = session.next_seq - 1 if following is None else following - 1
                session.last_ack = max(session.last_ack, watermark)
            return work, True
        if name == "trim":
            keep = spec[2]
            work = partial(backend.trim, client_id=client_id, keep_messages=keep)
            if session is None:
                return work, Failed
            ordered = sorted(session.pending)
            dropped = ordered[: max(0, len(ordered) - keep)]
            for s in dropped:
                del session.pending[s]
            return work, len(dropped)
        if name == "trim_through":
            seq = self.pick_seq(client_id, spec[2])
            work = partial(backend.trim_through, client_id=client_id, seq=seq)
            if session is None:
                return work, Failed
            dropped = [s for s in session.pending if s <= seq]
            for s in dropped:
                del session.pending[s]
            return work, len(dropped)
        if name == "set_filters":
            filters = spec[2]
            work = partial(backend.set_filters, client_id=client_id, filters=tuple(filters))
            if session is None:
                return work, Failed
            session.filters = set(filters)
            return work, None
        flt, dialect = spec[2]
        if name == "add_filter":
            work = partial(backend.add_filter, client_id=client_id, filter=flt, dialect=dialect)
            if session is not None:
                session.filters.add((flt, dialect))
        else:
            work = partial(backend.remove_filter, client_id=client_id, filter=flt, dialect=dialect)
            if session is not None:
                session.filters.discard((flt, dialect))
        return work, (Failed if session is None else None)

    def concretize_append(
        self, clients: list[str], mode: str, publisher_id: str | None, size: int, has_headers: bool
    ) -> tuple[Any, Any]:
        self.serial += 1
        headers = {"h": str(self.serial)} if has_headers else None
        message = StoredMessage(0, f"m{self.serial}", f"t/{self.serial}", bytes(size), headers)
        deliveries = tuple((client_id, self.seq_for(client_id, mode)) for client_id in clients)
        # What the Store queues: consecutive appends of a batch are stored together.
        work = Append(
            message.msg_id,
            message.topic,
            message.payload,
            None if headers is None else msgpack.packb(headers),
            deliveries,
            publisher_id,
        )
        # The duplicate check comes first: a duplicate stores nothing and checks nothing else.
        if publisher_id is not None and publisher_id in self.published:
            return work, False
        for client_id, seq in deliveries:
            session = self.sessions.get(client_id)
            if session is None or seq in session.pending:
                return work, Failed
        if publisher_id is not None:
            self.published.append(publisher_id)
        for client_id, seq in deliveries:
            session = self.sessions[client_id]
            session.pending[seq] = StoredMessage(
                seq, message.msg_id, message.topic, message.payload, headers
            )
            session.next_seq = max(session.next_seq, seq + 1)
        return work, True

    # -- rules -----------------------------------------------------------------------------------

    @initialize()
    def two_sessions(self) -> None:
        self.batch([("create", "a", None), ("create", "b", "g")])

    @rule(specs=st.lists(op_specs, min_size=1, max_size=4))
    def batch(self, specs: list[tuple[Any, ...]]) -> None:
        works, expected = [], []
        for spec in specs:
            work, outcome = self.concretize(spec)
            works.append(work)
            expected.append(outcome)
        committed, outcomes = self.backend.run_batch(works)
        assert committed
        if len(self.published) > DEDUP_WINDOW + self.backend.dedup_slack:
            del self.published[:-DEDUP_WINDOW]
        for spec, want, (ok, value) in zip(specs, expected, outcomes, strict=True):
            if want is Failed:
                assert not ok and isinstance(value, StoreError), (spec, value)
            else:
                assert ok, (spec, value)
                assert value == want, (spec, value, want)

    @rule()
    def reopen(self) -> None:
        self.backend.close()
        self.backend = self._open()

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def sessions_match(self) -> None:
        expected = [self.sessions[c].record(c) for c in sorted(self.sessions)]
        assert self.backend.sessions() == expected
        for client_id in CLIENTS:
            session = self.sessions.get(client_id)
            assert self.backend.session(client_id) == (
                None if session is None else session.record(client_id)
            )

    @invariant()
    def pending_queues_match(self) -> None:
        for client_id, session in self.sessions.items():
            want = [session.pending[s] for s in sorted(session.pending)]
            assert self.backend.pending(client_id, -1, 1_000) == want
            if len(want) > 1:  # paging: after the first, at most one
                assert self.backend.pending(client_id, want[0].seq, 1) == want[1:2]

    @invariant()
    def messages_are_stored_once_with_exact_refs(self) -> None:
        refs: dict[str, int] = {}
        for session in self.sessions.values():
            for message in session.pending.values():
                refs[message.msg_id] = refs.get(message.msg_id, 0) + 1
        rows = self.backend.conn.execute("SELECT msg_id, refs FROM messages").fetchall()
        assert sorted(rows) == sorted(refs.items())
        assert self.backend.messages == len(rows)
        deliveries = self.backend.conn.execute("SELECT count(*) FROM deliveries").fetchone()[0]
        assert self.backend.deliveries == deliveries == sum(refs.values())
        assert self.backend.sessions_count == len(self.sessions)

    @invariant()
    def dedup_ids_match(self) -> None:
        rows = self.backend.conn.execute("SELECT msg_id FROM published ORDER BY rowid")
        assert [msg_id for (msg_id,) in rows] == self.published
        assert self.backend.published == len(self.published)


StoreModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, print_blob=True
)
TestStoreModel = StoreModel.TestCase
