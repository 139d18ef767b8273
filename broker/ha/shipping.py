"""The primary's side of replication: every committed batch as a record, shipped in order.

The store's writer (``Store._run_batch``) calls ``prepare`` in its worker thread before the
transaction (the batch's works described, the record encoded, the new position written by
the batch's last work), ``adopt`` once it committed (``discard`` when it did not), then
``durable``: with ``sync`` that waits until the standby acknowledged the record (it
acknowledges what is in its journal with fdatasync), so the PUBACKs waiting on the batch go
out after both copies are durable. Outcomes are delivered in commit order, so waiting per
batch keeps the order.

**Shipped before the commit.** ``prepare`` hands the record to the sender (a thread-safe
wake-up of the trio thread) before the primary's own transaction starts, so the standby
journals it while the primary commits it: the two disks' fsyncs overlap instead of adding
up. The batch is still confirmed only after both (``durable`` is called after the commit).
Such a record is *pending* on the standby: it journals and acknowledges it, but applies it
to its store only once the primary says it committed (``["COMMITTED", seq]``, or the
committed seq that every ``RECORD`` frame carries). A transaction that fails after its
record was sent is withdrawn (``["WITHDRAW", seq]``): the standby takes it out of its
journal and goes on, in sync, without a snapshot. At most one record is pending at a time
(the next batch is prepared after this one's outcome), so a withdrawn seq is always the
newest, and the next record has the same seq with another digest. ACKs name the count of
WITHDRAWs the standby had processed when it sent them: one that predates the newest
withdraw (of the withdrawn record, maybe) counts for nothing, so no batch is confirmed on
the ACK of another record.

**In sync.** A standby counts once it has been sent every record there is (after a
snapshot, if it needed one); from then on each batch waits for its ack. A standby that is
absent, catching up, or silent for ``ack_timeout`` (it is dropped) is not waited for: the
primary goes on confirming on its own disk alone (``confirms_alone`` counts them) rather
than stop, as Kafka does with ``min.insync.replicas = 1``. What that loses is in
docs/ha.md.

**Backlog.** The newest records are kept (at most ``backlog_bytes``) so that a standby
that reconnects continues from its position; one older than the backlog, new, or whose
digest at its seq differs from ours (diverged) gets a snapshot (``Store.backup``: a
consistent copy between two commits) and then the records after it. A standby that falls
out of the backlog while connected is disconnected and comes back for a snapshot: the
primary's memory is bounded whatever the standby does.

One standby at a time: a new authenticated connection replaces the old one (a restarted
standby must not wait for the old socket to time out). With ``tls`` (``[ha] ca``, ``cert``,
``key``) a connection is first a mutual TLS handshake; one that fails (plain text, a
certificate the pair's CA did not sign) is counted (``tls_failures``), logged and closed
before anything of the store is sent.
"""

from __future__ import annotations

import math
import os
import sqlite3
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from broker.ha.journal import replay
from broker.ha.link import (
    LinkAuthError,
    LinkError,
    LinkStream,
    LinkTlsError,
    accept_link,
    single_link_error,
)
from broker.ha.records import (
    GENESIS,
    BatchClock,
    Position,
    chain,
    describe_all,
    encode_record,
    read_position,
    write_position,
)
from broker.ha.tls import PairTls, TlsHandshakeFailed
from broker.log import get_logger
from broker.security.tls import peer_address
from broker.store.records import StoreError
from broker.store.sqlite import Work

if TYPE_CHECKING:
    from broker.store.store import Store

__all__ = ["BACKLOG_BYTES", "CHUNK_BYTES", "HELP", "Shipper", "ShipperCounters"]

#: Record bytes the primary keeps for standbys that reconnect.
BACKLOG_BYTES = 64 << 20
#: Bytes per snapshot frame.
CHUNK_BYTES = 1 << 20
#: Seconds a standby has for the handshake and its position.
HANDSHAKE_TIMEOUT = 10.0
#: Seconds between the primary's BEATs: the standby's sign that the primary lives (its
#: failure timeout counts from the last frame heard), and what its ACKs refer to.
BEAT_INTERVAL = 0.1
#: BEATs remembered for the ACKs that name them.
BEATS_KEPT = 256
#: Seconds the sender waits for a next record (which carries the committed seq) before it
#: tells the standby of a commit in a frame of its own (``COMMITTED``).
MARK_DELAY = 0.005


class WriteGate(Protocol):
    """The election's side of a primary (``broker.ha.elector.Elector``)."""

    def refusal(self) -> str | None: ...
    def lease_renewed_since(self, since: float) -> bool: ...
    def on_standby_ack(self, term: int, sent_at: float) -> None: ...
    def on_partner_term(self, term: int) -> None: ...


log = get_logger("topiary.ha.shipping")


#: What each of ``Shipper.statistics`` is: (kind, help) for /metrics (``topiary_ha_<name>``).
HELP: dict[str, tuple[str, str]] = {
    "records": ("counter", "Store batches committed as replication records."),
    "record_bytes": ("counter", "Bytes of replication records committed."),
    "records_sent": ("counter", "Records sent to the standby."),
    "records_discarded": (
        "counter",
        "Batches prepared (and maybe sent) whose transaction failed here (e.g. disk full).",
    ),
    "withdrawals_sent": (
        "counter",
        "Records the standby had been sent and was told to withdraw (WITHDRAW): their "
        "commit failed here.",
    ),
    "bytes_sent": ("counter", "Record and snapshot bytes sent to the standby."),
    "snapshots_sent": ("counter", "Snapshots sent to a new, lagging or diverged standby."),
    "standby_connections": ("counter", "Authenticated standby connections."),
    "standby_dropped": ("counter", "Standby connections dropped (silent, behind, bad frame)."),
    "auth_failures": ("counter", "Replication connections without the pair's secret."),
    "tls_failures": (
        "counter",
        "Replication connections whose TLS handshake failed (not TLS, a bad certificate).",
    ),
    "standby_faults": (
        "counter",
        "Standby connections the standby ended because its store refused the records "
        "(its disk full): dropped, nothing of it counted as written.",
    ),
    "confirms_waited": ("counter", "Batches whose confirmation waited for the standby."),
    "confirms_alone": ("counter", "Batches confirmed with no standby in sync (sync = true)."),
    "term": ("gauge", "The term this primary writes in."),
    "seq": ("gauge", "The seq of the newest record."),
    "standby_acked_seq": ("gauge", "The newest seq the standby has durably (0: none)."),
    "lag_records": ("gauge", "Records the standby has not acknowledged."),
    "lag_bytes": ("gauge", "Bytes of records the standby has not acknowledged."),
    "in_sync": ("gauge", "1 while a standby is caught up and waited for."),
    "fenced": ("gauge", "1 when this primary met a newer term and refuses writes."),
    "seconds_since_contact": ("gauge", "Seconds since the standby was heard (-1: never)."),
}


@dataclass(slots=True)
class ShipperCounters:
    records: int = 0  # records committed (batches)
    record_bytes: int = 0
    records_sent: int = 0
    records_discarded: int = 0  # batches prepared whose transaction failed (discard)
    withdrawals_sent: int = 0  # WITHDRAW frames: a record sent, then not committed here
    bytes_sent: int = 0
    snapshots_sent: int = 0
    standby_connections: int = 0
    standby_dropped: int = 0  # disconnected: silent, fell out of the backlog, protocol error
    auth_failures: int = 0
    tls_failures: int = 0  # TLS handshakes that failed (with [ha] ca/cert/key)
    standby_faults: int = 0  # the standby said it cannot store the records (FAULT)
    confirms_waited: int = 0  # batches whose confirmation waited for the standby's ack
    confirms_alone: int = 0  # batches confirmed with no standby in sync (sync = true)

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class _Prepared:
    position: Position
    body: bytes


@dataclass(slots=True)
class _Session:
    """What one standby connection has been sent (touched only in the trio thread)."""

    cursor: int  # the newest record sent (or, after a withdraw, the one before it)
    told: int = 0  # the newest committed seq the standby was told
    withdraw: int | None = None  # a WITHDRAW to send before anything else
    withdraws: int = 0  # WITHDRAWs decided for this connection: what current ACKs name


class Shipper:
    """The primary's replication state; ``attach`` it to a store, ``serve`` the link."""

    def __init__(
        self,
        *,
        term: int,
        secret: bytes,
        sync: bool = True,
        ack_timeout: float = 2.0,
        backlog_bytes: int = BACKLOG_BYTES,
        tls: PairTls | None = None,
    ) -> None:
        self.term = term
        self.tls = tls
        self.secret = secret
        self.sync = sync
        self.ack_timeout = ack_timeout
        self.backlog_bytes = backlog_bytes
        self.counters = ShipperCounters()
        self.clock = BatchClock()
        self.position = Position()
        self._store: Store | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._top = Position()  # the newest record shipped (committed, or pending)
        self._session: _Session | None = None  # the standby connection records go to
        self._base = Position()  # the position before the backlog's first record
        self._origin = Position()  # the position at ``attach``
        self._backlog: deque[tuple[Position, bytes]] = deque()
        self._backlog_size = 0
        self._grew = trio.Event()  # set (and replaced) at every new record
        self._acked = 0  # the in-sync standby's last acknowledged seq
        self._in_sync = False
        self._lost_at = -math.inf  # when the last in-sync standby was lost (trio time)
        self._acks = trio.Event()  # set (and replaced) when _acked or _in_sync changes
        self._standby: trio.CancelScope | None = None
        self.last_contact: float | None = None  # trio time the standby was last heard
        #: Why this primary refuses writes (it met a partner of a newer term), or None.
        self.fenced: str | None = None
        #: The election (witness failover): asked before each confirmation, told of ACKs.
        self.gate: WriteGate | None = None
        self._beats: deque[tuple[int, float]] = deque(maxlen=BEATS_KEPT)
        self._beat = 0

    def statistics(self) -> dict[str, int | float]:
        """Counters and gauges for STATS and /metrics (``HELP`` says what each is)."""
        seq = self.position.seq
        acked = min(self._acked, seq) if self._standby is not None else seq
        behind = [body for position, body in self._backlog if acked < position.seq <= seq]
        heard = self.last_contact
        return {
            **self.counters.snapshot(),
            "term": self.term,
            "seq": seq,
            "standby_acked_seq": acked if self._standby is not None else 0,
            "lag_records": seq - acked if self._standby is not None else 0,
            "lag_bytes": sum(len(body) for body in behind),
            "in_sync": int(self._in_sync),
            "fenced": int(self.fenced is not None),
            "seconds_since_contact": -1.0 if heard is None else trio.current_time() - heard,
        }

    @property
    def in_sync(self) -> bool:
        """A standby is connected, caught up, and waited for by confirmations (``sync``)."""
        return self._in_sync

    # -- the store's hooks ---------------------------------------------------------------------

    async def attach(self, store: Store) -> None:
        """Ship ``store``'s batches from now on (its position read, its clock replaced).
        Records this broker journaled as a standby and did not apply (it was killed, or
        promoted and killed) are applied first: it acknowledged them."""
        position = await store.read(partial(replay, directory=store.directory))
        if position == Position():
            # Never shipped: whatever the store holds is in no record, so no standby may
            # continue from it. A random origin for the chain makes every standby take a
            # snapshot first (it is stored with the first batch).
            position = Position(self.term, 0, os.urandom(len(GENESIS)))
        self.position = self._base = self._origin = self._top = position
        self._store = store
        self._token = trio.lowlevel.current_trio_token()
        store.attach_replication(self, self.clock)

    def prepare(self, works: list[Work]) -> _Prepared:
        """In the writer's worker thread, before the batch: describe it and append the
        work that stores the new position in the same transaction. A fenced primary raises
        ``StoreError`` (the store fails the batch: nothing is confirmed). The record goes to
        the sender at once (``_ship`` in the trio thread, queued before the store hears the
        transaction's outcome): the standby journals it while we commit."""
        if self.fenced is not None:
            raise StoreError(f"not stored: {self.fenced}")
        self.clock.now = time.time()
        seq = self.position.seq + 1
        body = encode_record(self.term, seq, self.clock.now, describe_all(works))
        position = Position(self.term, seq, chain(self.position.digest, body))
        works.append(partial(write_position, position))
        prepared = _Prepared(position, body)
        assert self._token is not None
        self._token.run_sync_soon(self._ship, prepared)
        return prepared

    def _ship(self, prepared: _Prepared) -> None:
        """The record joins the backlog (the sender's queue), pending until ``adopt``."""
        if prepared.position == self._top:
            return  # (adopt came first)
        if self._top != self.position:
            # A pending record neither adopted nor discarded (its batch raised): not ours.
            self._withdraw_top()
        self._top = prepared.position
        self._backlog.append((prepared.position, prepared.body))
        self._backlog_size += len(prepared.body)
        while self._backlog_size > self.backlog_bytes and len(self._backlog) > 1:
            self._base, body = self._backlog.popleft()
            self._backlog_size -= len(body)
        self._wake()

    def adopt(self, prepared: _Prepared) -> None:
        """The batch committed: it is the newest record (the standby is told so)."""
        self._ship(prepared)
        self.position = prepared.position
        self.counters.records += 1
        self.counters.record_bytes += len(prepared.body)
        self._wake()

    def discard(self, prepared: _Prepared) -> None:
        """The batch's transaction failed: its record is withdrawn (from the standby too,
        if it was sent), and the standby stays."""
        self.counters.records_discarded += 1
        if self._top == prepared.position:
            self._withdraw_top()
            self._wake()

    def _withdraw_top(self) -> None:
        """Take the pending record off the backlog; a standby that was sent it gets a
        WITHDRAW before anything else, and its ACKs sent before it processes that one
        count for nothing from now on (``_Session.withdraws``)."""
        position, body = self._backlog.pop()
        self._backlog_size -= len(body)
        self._top = self.position
        session = self._session
        if session is not None and session.cursor >= position.seq:
            session.cursor = position.seq - 1
            session.withdraw = position.seq
            session.withdraws += 1
            if self._acked >= position.seq:
                self._acked = position.seq - 1
                self._acks_changed()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = trio.Event()

    async def durable(self, prepared: _Prepared) -> str | None:
        """With ``sync``: return once the in-sync standby acknowledged the record, or at once
        when no standby is in sync (counted as ``confirms_alone``). Then, with a ``gate``,
        the batch is confirmed only if this broker may still write (a process paused
        before the PUBACK must not confirm after its lease ran out): else the reason. A
        batch confirmed alone waits, with a gate, for a lease asked for after the standby
        was lost: until then the standby may be promoted without it (the primary cut from
        both the standby and the witness would confirm what the new primary never gets)."""
        alone = False
        if self.sync:
            seq = prepared.position.seq
            if not self._in_sync:
                alone = True
            else:
                self.counters.confirms_waited += 1
                while self._in_sync and self._acked < seq:
                    await self._acks.wait()
                alone = self._acked < seq
            if alone:
                self.counters.confirms_alone += 1
        if self.gate is not None:
            if alone:
                # Bounded: the lease is renewed every lease/3, or runs out (a refusal).
                while self.gate.refusal() is None and not self.gate.lease_renewed_since(
                    self._lost_at
                ):
                    await trio.sleep(0.01)
            return self.gate.refusal()
        return None

    def _acks_changed(self) -> None:
        self._acks.set()
        self._acks = trio.Event()

    # -- the link ------------------------------------------------------------------------------

    async def serve(
        self,
        listeners: list[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept standbys on ``listeners`` until cancelled."""
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener, nursery)
            task_status.started()

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._serve_standby, stream)

    async def _serve_standby(self, stream: trio.abc.Stream) -> None:
        if self.tls is not None:
            peer = peer_address(stream)
            try:
                stream = await self.tls.accept(stream, HANDSHAKE_TIMEOUT)
            except TlsHandshakeFailed as exc:
                self.counters.tls_failures += 1
                log.warning("standby refused: TLS handshake failed", peer=peer, reason=str(exc),
                            tls_failures=self.counters.tls_failures)  # fmt: skip
                return
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                link = await accept_link(stream, self.secret)
                hello = await link.receive()
            theirs = _position(hello)
        except (LinkError, trio.TooSlowError) as exc:
            if isinstance(exc, LinkAuthError):
                self.counters.auth_failures += 1
            elif isinstance(exc, LinkTlsError):
                self.counters.tls_failures += 1
            log.warning("standby refused", reason=str(exc))
            await trio.aclose_forcefully(stream)
            return
        if theirs.term > self.term:
            # The partner served a newer term: this broker was replaced and must not write.
            if self.gate is not None:
                self.gate.on_partner_term(theirs.term)
            self.fenced = f"replaced: the partner is in term {theirs.term}, we in {self.term}"
            log.error("fenced", reason=self.fenced)
            await link.aclose()
            return
        if self._standby is not None:
            self._standby.cancel()  # the newest connection of the standby wins
        scope = trio.CancelScope()
        self._standby = scope
        self.counters.standby_connections += 1
        self.last_contact = trio.current_time()
        log.info("standby connected", term=theirs.term, seq=theirs.seq, ours=self.position.seq)
        try:
            with scope:
                await self._stream_to(link, theirs)
        except LinkError as exc:
            self.counters.standby_dropped += 1
            log.warning("standby dropped", reason=str(exc))
        finally:
            if self._standby is scope:
                self._standby = None
                if self._in_sync:
                    self._in_sync = False
                    self._lost_at = trio.current_time()
                    self._acks_changed()
            await link.aclose()

    def _continues(self, theirs: Position) -> bool:
        """Whether the backlog continues ``theirs`` (same seq, same digest)."""
        if theirs.seq == self._base.seq:
            return theirs.digest == self._base.digest
        if theirs.seq == self._top.seq:
            return theirs.digest == self._top.digest
        index = theirs.seq - self._base.seq - 1
        return 0 <= index < len(self._backlog) and self._backlog[index][0].digest == theirs.digest

    async def _stream_to(self, link: LinkStream, theirs: Position) -> None:
        if self._continues(theirs):
            cursor = theirs.seq
        else:
            why = "new" if theirs.seq == 0 and theirs.digest == GENESIS else "behind or diverged"
            log.info("sending a snapshot", standby_seq=theirs.seq, why=why)
            cursor = await self._send_snapshot(link)
        self._acked = cursor
        session = _Session(cursor, told=min(cursor, self.position.seq))
        self._session = session
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive_acks, link, session)
                nursery.start_soon(self._send_beats, link)
                await self._send_records(link, session)
        except BaseExceptionGroup as group:
            raise single_link_error(group) from None
        finally:
            if self._session is session:
                self._session = None

    async def _send_records(self, link: LinkStream, session: _Session) -> None:
        """Every record after the session's cursor, as they come (a WITHDRAW first when
        one is due; a COMMITTED when no record followed a commit for ``MARK_DELAY``),
        until the link fails. ``session.cursor`` moves before each send: a ``discard``
        meanwhile sees the record as sent."""
        while True:
            if session.withdraw is not None:
                seq, session.withdraw = session.withdraw, None
                self.counters.withdrawals_sent += 1
                log.info("record withdrawn from the standby", seq=seq)
                await link.send(["WITHDRAW", seq])
                continue
            cursor = session.cursor
            if cursor < self._base.seq:
                raise LinkError(f"the standby fell out of the backlog (at seq {cursor})")
            if cursor >= self._top.seq:
                if not self._in_sync:
                    self._in_sync = True
                    self._acks_changed()
                    log.info("standby in sync", seq=cursor)
                if session.told < min(cursor, self.position.seq):
                    # A record to come would carry the committed seq: wait a little for one.
                    with trio.move_on_after(MARK_DELAY) as waiting:
                        await self._grew.wait()
                    if waiting.cancelled_caught:
                        session.told = min(session.cursor, self.position.seq)
                        await link.send(["COMMITTED", session.told])
                    continue
                await self._grew.wait()
                continue
            position, body = self._backlog[cursor - self._base.seq]
            session.cursor = position.seq
            session.told = self.position.seq
            await link.send(["RECORD", body, position.digest, session.told])
            self.counters.records_sent += 1
            self.counters.bytes_sent += len(body)

    async def _send_beats(self, link: LinkStream) -> None:
        """``["BEAT", term, n]`` every ``BEAT_INTERVAL``; an ACK naming n proves the standby
        heard this primary after n was sent (``Role.on_standby_ack``)."""
        while True:
            self._beat += 1
            self._beats.append((self._beat, trio.current_time()))
            await link.send(["BEAT", self.term, self._beat])
            await trio.sleep(BEAT_INTERVAL)

    def _beat_sent_at(self, beat: int) -> float | None:
        for number, sent_at in reversed(self._beats):
            if number == beat:
                return sent_at
            if number < beat:
                break
        return None

    async def _receive_acks(self, link: LinkStream, session: _Session) -> None:
        """``["ACK", seq, withdraws]`` (with the election ``["ACK", seq, withdraws, term,
        beat]``): records up to ``seq`` are durable on the standby, which had processed
        ``withdraws`` WITHDRAWs of this connection. Fewer than we decided: it may name a
        withdrawn record, so its seq counts for nothing (its term and beat still do)."""
        while True:
            with trio.move_on_after(self.ack_timeout) as waiting:
                message = await link.receive()
            if waiting.cancelled_caught:
                raise LinkError(f"no word from the standby for {self.ack_timeout} s")
            self.last_contact = trio.current_time()
            if message[0] == "FAULT":  # the standby could not store what it was sent
                self.counters.standby_faults += 1
                why = message[1] if len(message) == 2 and isinstance(message[1], str) else "?"
                raise LinkError(f"the standby cannot store the records: {why:.500}")
            if (
                message[0] != "ACK"
                or len(message) not in (3, 5)
                or not all(isinstance(value, int) for value in message[1:])
            ):
                raise LinkError(f"expected ACK, got {message[0]!r:.40}")
            if len(message) == 5 and self.gate is not None:  # ACK seq withdraws term beat
                if message[3] > self.term:
                    self.gate.on_partner_term(message[3])
                sent_at = self._beat_sent_at(message[4])
                if sent_at is not None:
                    self.gate.on_standby_ack(message[3], sent_at)
            seq, withdraws = message[1], message[2]
            if withdraws > session.withdraws:
                raise LinkError(f"ACK after {withdraws} withdraws, we sent {session.withdraws}")
            if withdraws < session.withdraws:
                continue  # sent before our newest WITHDRAW reached the standby
            if seq > session.cursor:
                raise LinkError(f"ACK of seq {seq} that was never sent")
            if seq > self._acked:
                self._acked = seq
                self._acks_changed()

    async def _send_snapshot(self, link: LinkStream) -> int:
        """A consistent copy of the store, in chunks; the seq it holds."""
        assert self._store is not None
        store = self._store
        handle, name = tempfile.mkstemp(prefix="ha-snapshot-", dir=store.directory)
        os.close(handle)
        path = Path(name)
        try:
            try:
                await store.backup(path)
                position = await trio.to_thread.run_sync(_snapshot_position, path, self._origin)
            except (StoreError, OSError, sqlite3.Error) as exc:  # e.g. our disk is full
                raise LinkError(f"cannot make a snapshot: {exc}") from exc
            size = path.stat().st_size
            await link.send(["SNAPSHOT", size])
            with path.open("rb") as file:
                while chunk := await trio.to_thread.run_sync(file.read, CHUNK_BYTES):
                    await link.send(["CHUNK", chunk])
                    self.counters.bytes_sent += len(chunk)
            await link.send(["SNAPSHOT_END", position.term, position.seq, position.digest])
        finally:
            path.unlink(missing_ok=True)
        self.counters.snapshots_sent += 1
        return position.seq


def _position(message: list[Any]) -> Position:
    if (
        message[0] != "POSITION"
        or len(message) != 4
        or not isinstance(message[1], int)
        or not isinstance(message[2], int)
        or not isinstance(message[3], bytes)
    ):
        raise LinkError(f"expected POSITION, got {message[0]!r:.40}")
    return Position(message[1], message[2], message[3])


def _snapshot_position(path: Path, origin: Position) -> Position:
    """The position a snapshot holds; one taken before the first batch since ``attach``
    holds none, and is given the chain's origin (the state the first record follows)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        position = read_position(conn)
        if position == Position():
            conn.execute("BEGIN")
            write_position(origin, _Conn(conn))  # type: ignore[arg-type]
            conn.execute("COMMIT")
            position = origin
        return position
    finally:
        conn.close()


class _Conn:
    """Enough of a backend for ``write_position``."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
