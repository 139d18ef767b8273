"""A client's session: its subscriptions, its sequence numbers, its outbound queue.

The router hands messages to sessions synchronously (``deliver``); a
connection's writer drains them. The queue is bounded in messages and payload
bytes, so a slow consumer never makes the broker's memory grow: past the bound
its messages are dropped and counted, and after ``slow_consumer_drops`` drops
in a row (no progress in between) it is disconnected with SLOW_CONSUMER. The
publisher and every other subscriber never wait for it. Loss is never silent:
the next message that does reach the client says how many were dropped
before it (MSG ``discarded``), the drops are logged with the client id (at
most once per ``DROP_LOG_INTERVAL`` per session), and ``Broker.stats`` names
the sessions that dropped most.

Control frames (SUBACK, PUBACK, PING, PONG, replies) are never dropped and go in
a priority lane, ahead of the messages queued before them: a client behind on
its messages still gets its replies and our PINGs at once. They answer the
client's own requests, so when too many are queued the connection stops
reading that client until its writer catches up: backpressure on the one
client that caused it. An UNSUBACK is the exception: it promises that no MSG
of that subscription follows, so it waits in line behind the messages
(``send_control(..., ordered=True)``).

A transient session lives as long as its connection. A durable session
(client id + durable flag) lives in the store and outlives its connections:
every message for it gets a sequence number and is stored (the broker's
append), and the queue here is only the fast path to a connected client.
When the queue is full, or no connection is attached, the message is not
lost but deferred: the connection's writer sends strictly in sequence order
and fills any gap from the store (``needs_fill``), so a durable client gets
every message after its last ack, in order, however fast or slow it reads.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final, Protocol

import trio

from broker.core.counters import Counters
from broker.core.message import Message
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger

if TYPE_CHECKING:
    from broker.security.identity import Identity
    from routing import Filter
    from routing.acl import Access

#: How a front end encodes one delivery into a batch: (parts, message, sub id, seq) -> size.
AppendMessage = Callable[[list[bytes | memoryview], Message, int, int], int]
#: The same with the count of messages dropped just before it (only called when > 0):
#: (parts, message, sub id, seq, discarded) -> size.
AppendDiscarded = Callable[[list[bytes | memoryview], Message, int, int, int], int]
#: How a front end encodes a run of queued deliveries in one call: (parts, outbox, start,
#: end, byte budget) -> (index after the last encoded, size, payload bytes). It encodes
#: (message, sub id, seq) entries from ``start`` on and stops at any other entry, at a
#: sampled message (``routed_at``), or once ``budget`` bytes are appended; what it leaves is
#: the caller's.
AppendRun = Callable[
    [list[bytes | memoryview], list["bytes | tuple[Message, int, int]"], int, int, int],
    tuple[int, int, int],
]

DROP_LOG_INTERVAL = 10.0  # seconds: a session's drops are logged at most this often

log = get_logger("topiary.session")

#: Sessions whose wake is held while a reader handles a read's worth of requests
#: (``hold_wakes``): flushed together before the reader awaits (``flush_wakes``). A context
#: variable, so only the holding task's own deliveries are held (not another task's, nor
#: another broker's in another thread); None while it holds none.
_held: ContextVar[list[Session] | None] = ContextVar("topiary_held_wakes", default=None)


#: A reader's turns that what its read queued for an idle subscriber may wait for: the
#: front ends' readers write it once the read's frames are handled, or every this many turns
#: of a read that takes longer (one write per subscriber per read, each subscriber waiting
#: for at most this many of that reader's turns).
HELD_TURNS: Final = 4


def hold_wakes() -> None:
    """Hold the wakes of idle writers until ``flush_wakes``: a reader about to handle what
    it read (it must flush before it waits for anything; a bare checkpoint, the yield at
    the end of a turn, may keep them held). A session whose front end can write directly
    (``Session.direct``) then has what the read queued for it written in one send, in this
    task's turn, without waking its writer."""
    if _held.get() is None:
        _held.set([])


def flush_wakes() -> None:
    """Write (``Session.direct``) or wake each session held since ``hold_wakes``."""
    held = _held.get()
    if held is None:
        return
    _held.set(None)
    for session in held:
        if session._writer is not None:  # else woken meanwhile (a reply, the close)
            direct = session.direct
            if direct is None or not direct():
                session.wake()


class Holder(Protocol):
    """A front end's connection holding a durable session (``Session.connection``)."""

    def take_over(self, why: str = ...) -> None:
        """Close because another connection claims the session, or it was dropped."""


@dataclass(frozen=True, slots=True)
class OutboundLimits:
    messages: int = 10_000
    bytes: int = 16 * 1024 * 1024
    slow_consumer_drops: int = 10_000


class SubRef:
    """What the subscription table holds: one (filter, dialect) of one session.

    A session subscribing twice to the same filter gets two subscription ids
    and one table entry, so it still receives each message once.
    """

    __slots__ = ("_ids", "dialect", "filter", "session")

    def __init__(self, session: Session, filter: str, dialect: str) -> None:
        self.session = session
        self.filter = filter
        self.dialect = dialect
        # The subscription ids: the lone id itself (nearly always), else a tuple (empty
        # once the last is gone). A broker holds one SubRef per subscription, and a tuple
        # of one would cost 48 bytes each; neither form is tracked by the cyclic GC.
        self._ids: int | tuple[int, ...] = ()

    @property
    def sub_ids(self) -> tuple[int, ...]:
        """The subscription ids this entry stands for, in the order they were given."""
        ids = self._ids
        return (ids,) if ids.__class__ is int else ids  # type: ignore[return-value]

    @sub_ids.setter
    def sub_ids(self, ids: tuple[int, ...]) -> None:
        self._ids = ids[0] if len(ids) == 1 else ids

    @property
    def sub_id(self) -> int:
        """The first subscription id: the one a MSG names (``sub_ids[0]``, no tuple)."""
        ids = self._ids
        return ids if ids.__class__ is int else ids[0]  # type: ignore[return-value,index]

    def __repr__(self) -> str:
        return f"<SubRef {self.session.client_id} {self.filter!r} {self.dialect} {self.sub_ids}>"


class Session:
    """A subscriber's state in the core: subscriptions, sequence numbers, outbound queue.

    Front ends attach a connection to it and drain it (``take_batch`` with their own
    encoder); the router only calls ``deliver``. Shared groups subclass it (``Group``).
    """

    shared: ClassVar[bool] = False  # True for a shared group's session

    # Slots, and what only some sessions need made when first needed: an idle connection
    # costs its session a few hundred bytes, not kilobytes (docs/benchmarks.md, Memory).
    __slots__ = (
        "__weakref__",
        "_committed",
        "_control",
        "_control_bytes",
        "_discards",
        "_drained",
        "_drop_log_due",
        "_drops_in_a_row",
        "_drops_logged",
        "_next_sub_id",
        "_outbox",
        "_queued_bytes",
        "_queued_messages",
        "_untold_drops",
        "_writer",
        "accepting",
        "acked",
        "acl",
        "backlog",
        "backlog_bytes",
        "backlog_messages",
        "client_id",
        "committed_upto",
        "connection",
        "counters",
        "deferred",
        "delivered",
        "direct",
        "dropped",
        "durable",
        "failure",
        "last_ack",
        "limits",
        "on_failure",
        "on_revoked",
        "owner",
        "principal",
        "quota_dropped",
        "ready",
        "refs",
        "sampled",
        "sent_upto",
        "seq",
        "subs",
    )

    def __init__(
        self,
        client_id: str,
        limits: OutboundLimits,
        counters: Counters,
        *,
        durable: bool = False,
        seq: int = 0,
        last_ack: int = 0,
    ) -> None:
        self.client_id = client_id
        self.durable = durable
        # durable only: the identity that may open and drop it (``Identity.owner``); None
        # for a transient session, a shared group, or one stored before owners existed
        self.owner: str | None = None
        # durable only: the connection reading this session (None while away), what it was
        # sent, what the client acked, and what the store has committed
        self.connection: Holder | None = None
        self.last_ack = last_ack
        self.sent_upto = last_ack
        self.committed_upto = seq
        self.deferred = 0
        # A resumed durable session sends nothing but replies until the client's first
        # request has been answered, so the client can subscribe before its backlog comes.
        self.ready = True
        self._committed: trio.Event | None = None  # made by the first wait_committed
        # durable only: pending (unacked, not trimmed) messages as (last seq, bytes, count,
        # trio time routed); one entry per message, except one entry for a backlog restored
        # from the store, stamped with the time of the restore (made by the first track)
        self.backlog: deque[tuple[int, int, int, float]] | None = None
        self.backlog_messages = 0
        self.backlog_bytes = 0
        self.quota_dropped = 0
        # for operators (counted since the broker started): MSGs handed to the socket, and
        # messages an ack released (a restored backlog counts once its last seq is acked)
        self.delivered = 0
        self.acked = 0
        # trio times routed of the sampled messages (``Message.routed_at``) that
        # ``take_batch`` encoded; the front end's writer observes and clears them once sent
        self.sampled: list[float] = []
        self.limits = limits
        self.counters = counters
        self.subs: dict[int, SubRef] = {}
        self.refs: dict[tuple[str, str], SubRef] = {}
        self._next_sub_id = 1
        self.seq = seq
        self.dropped = 0
        self._drops_in_a_row = 0
        # Loss is never silent: drops not yet told to the client, then per queued seq the
        # count its MSG carries (made on the first drop); the next drop log is due at
        self._untold_drops = 0
        self._discards: dict[int, int] | None = None
        self._drop_log_due = 0.0
        self._drops_logged = 0
        # The priority lane: encoded replies that go before any queued message. Lists, not
        # deques (56 bytes empty against 760): take_batch consumes a batch from the front
        # with one slice deletion.
        self._control: list[bytes] = []
        # The data lane: (message, sub id, seq) to encode, and replies that must keep
        # their place behind the messages (encoded, bytes).
        self._outbox: list[bytes | tuple[Message, int, int]] = []
        self._queued_messages = 0
        self._queued_bytes = 0
        self._control_bytes = 0
        # The writer task parked in wait_data, woken (rescheduled) when there is something
        # to send: lighter than a trio.Event per session, which would also need a waiter
        # set and a coroutine of its own.
        self._writer: trio.lowlevel.Task | None = None
        # Set while the client's replies fit the queue; None stands for a set one (made
        # when they first do not fit).
        self._drained: trio.Event | None = None
        self.accepting = True  # False once the connection is closing: nothing after its ERROR
        self.failure: RemoteProtocolError | None = None
        # What the front end's connection does when the session fails (``fail``): set by
        # the connection that reads the session.
        self.on_failure: Callable[[RemoteProtocolError], None] | None = None
        # A transient session's front end may write what was queued itself while its writer
        # is parked (``flush_wakes``): this does (take_batch and one non-blocking send) and
        # says whether the writer may stay parked (all sent, nothing left queued). Set by
        # the connection, on a plain socket; None otherwise.
        self.direct: Callable[[], bool] | None = None
        # Topic ACLs (routing.acl): the client's compiled rules (None: no policy, all is
        # allowed), who they were made for, and what the connection does when a new rule
        # set removes subscriptions (``Broker.set_policy``): all set by the front end.
        self.acl: Access | None = None
        self.principal: tuple[Identity, str] | None = None
        self.on_revoked: Callable[[list[tuple[int, Filter]]], None] | None = None

    # -- subscriptions -------------------------------------------------------------------

    def subscribe(self, filter: str, dialect: str) -> tuple[int, SubRef, bool]:
        """A new subscription id; the ref and whether the table needs an entry for it."""
        sub_id = self._next_sub_id
        self._next_sub_id += 1
        key = (filter, dialect)
        ref = self.refs.get(key)
        is_new = ref is None
        if ref is None:
            ref = self.refs[key] = SubRef(self, filter, dialect)
        ref.sub_ids += (sub_id,)
        self.subs[sub_id] = ref
        return sub_id, ref, is_new

    def subscribe_many(
        self, filters: list[Filter]
    ) -> tuple[list[int], list[tuple[Filter, SubRef]]]:
        """``subscribe`` for each filter in order: the new ids, and (filter, ref) for each
        ref the table needs an entry for."""
        first = self._next_sub_id
        self._next_sub_id = first + len(filters)
        sub_ids = list(range(first, first + len(filters)))
        new: list[tuple[Filter, SubRef]] = []
        refs = self.refs
        subs = self.subs
        for sub_id, flt in zip(sub_ids, filters, strict=True):
            key = (flt.text, flt.dialect)
            ref = refs.get(key)
            if ref is None:
                ref = refs[key] = SubRef(self, flt.text, flt.dialect)
                new.append((flt, ref))
            ref.sub_ids += (sub_id,)
            subs[sub_id] = ref
        return sub_ids, new

    def unsubscribe(self, sub_id: int) -> tuple[SubRef, bool] | None:
        """The ref the id belonged to and whether its table entry must go; None if unknown."""
        ref = self.subs.pop(sub_id, None)
        if ref is None:
            return None
        ids = ref.sub_ids
        ref.sub_ids = () if len(ids) == 1 else tuple(i for i in ids if i != sub_id)
        if ref.sub_ids:
            return ref, False
        del self.refs[(ref.filter, ref.dialect)]
        return ref, True

    # -- outbound ------------------------------------------------------------------------

    def deliver(self, message: Message, sub_id: int) -> bool:
        """Queue ``message``; False (counted) when the queue is full.

        A durable session never drops: the message has a sequence number and the broker
        stores it; if it cannot be queued now the writer fetches it from the store later.
        """
        limits = self.limits
        if self.durable:
            self.seq += 1
            if (
                self.connection is not None
                and self.accepting
                and self._queued_messages < limits.messages
                and self._queued_bytes + message.size <= limits.bytes
            ):
                self._outbox.append((message, sub_id, self.seq))
                self._queued_messages += 1
                self._queued_bytes += message.size
            else:
                self.deferred += 1
            self.wake()
            return True
        if not self.accepting:
            self.dropped += 1
            self.counters.dropped += 1
            return False
        queued = self._queued_messages
        queued_bytes = self._queued_bytes + message.size
        if queued >= limits.messages or queued_bytes > limits.bytes:
            self._drop()
            self._drops_in_a_row += 1
            if self._drops_in_a_row >= limits.slow_consumer_drops:
                self.fail(
                    ErrorCode.SLOW_CONSUMER,
                    f"slow consumer: {self._drops_in_a_row} messages dropped in a row "
                    f"with {self._queued_messages} queued",
                )
            return False
        seq = self.seq = self.seq + 1
        if self._untold_drops:  # this message tells the client about the drops before it
            discards = self._discards
            if discards is None:
                discards = self._discards = {}
            discards[seq] = self._untold_drops
            self._untold_drops = 0
        outbox = self._outbox
        if not outbox:  # else the writer finds this entry when it looks at the queue again
            held = _held.get() if self.direct is not None else None
            if held is not None and self._writer is not None:
                held.append(self)  # written, or the writer woken, by flush_wakes
            else:
                self.wake()
        outbox.append((message, sub_id, seq))
        self._queued_messages = queued + 1
        self._queued_bytes = queued_bytes
        return True

    def _drop(self) -> None:
        """A message for this (transient) session did not fit its queue: count it, tell the
        client with the next one, log it now and then."""
        self.dropped += 1
        self.counters.dropped += 1
        self._untold_drops += 1
        now = time.monotonic()
        if now >= self._drop_log_due:
            self._drop_log_due = now + DROP_LOG_INTERVAL
            log.warning(
                "messages dropped",
                client=self.client_id,
                dropped=self.dropped - self._drops_logged,
                dropped_total=self.dropped,
                queued=self._queued_messages,
                queued_bytes=self._queued_bytes,
                why="outbound queue full: the client reads too slowly",
            )
            self._drops_logged = self.dropped

    def push(self, message: Message, sub_id: int, seq: int) -> None:
        """Queue a MSG that must not be dropped (a group member's share: its prefetch
        window, not the queue limits, bounds how many there are)."""
        self._outbox.append((message, sub_id, seq))
        self._queued_messages += 1
        self._queued_bytes += message.size
        self.wake()

    def send_control(self, data: bytes, *, ordered: bool = False) -> None:
        """Queue an encoded control frame; never dropped. It goes ahead of the queued
        messages, unless ``ordered`` (then after them, in line)."""
        if ordered:
            self._outbox.append(data)
        else:
            self._control.append(data)
        self._control_bytes += len(data)
        if self._control_bytes > self.limits.bytes and self._drained is None:
            self._drained = trio.Event()
        self.wake()

    def fail(self, code: ErrorCode, text: str) -> None:
        """Ask the connection to close with ERROR(code, text)."""
        if self.failure is None:
            self.failure = RemoteProtocolError(code, text)
            if self.on_failure is not None:
                self.on_failure(self.failure)

    # -- durable sessions ----------------------------------------------------------------

    def attach(self, connection: Holder) -> None:
        """A connection takes this durable session: resend everything after the last ack."""
        self.connection = connection
        self.accepting = True
        self.failure = None
        self.on_failure = None
        self._outbox = [e for e in self._outbox if e.__class__ is bytes]
        self._queued_messages = 0
        self._queued_bytes = 0
        self._control_bytes = sum(len(e) for e in self._outbox) + sum(  # type: ignore[arg-type]
            len(e) for e in self._control
        )
        self.sent_upto = self.last_ack
        self.ready = False

    def detach(self, connection: Holder) -> None:
        if self.connection is connection:
            self.connection = None
            self.on_failure = None
            self.on_revoked = None
            self.sampled.clear()
            self._control.clear()
            self._outbox.clear()
            self._queued_messages = 0
            self._queued_bytes = 0
            self._control_bytes = 0

    def track(self, seq: int, size: int, at: float, count: int = 1) -> None:
        """``count`` messages through ``seq`` are pending since trio time ``at``."""
        if self.backlog is None:
            self.backlog = deque()
        self.backlog.append((seq, size, count, at))
        self.backlog_messages += count
        self.backlog_bytes += size

    @property
    def pending_messages(self) -> int:
        """Messages routed to this durable session and not yet acked (or trimmed)."""
        return self.backlog_messages

    @property
    def oldest_pending_at(self) -> float | None:
        """Trio time the oldest pending message was routed (for a backlog restored from the
        store: the time of the restore, as the store keeps no routing time); None if none."""
        backlog = self.backlog
        return backlog[0][3] if backlog else None  # (None until the first track)

    def release_through(self, seq: int) -> None:
        """Messages up to ``seq`` were acked or trimmed: they no longer count."""
        backlog = self.backlog
        while backlog and backlog[0][0] <= seq:  # (None until the first track)
            _seq, size, count, _at = backlog.popleft()
            self.backlog_messages -= count
            self.backlog_bytes -= size
            self.acked += count

    def would_overflow(self, size: int, max_messages: int, max_bytes: int) -> bool:
        return self.backlog_messages + 1 > max_messages or self.backlog_bytes + size > max_bytes

    def trim_to(self, max_messages: int, max_bytes: int) -> tuple[int, int]:
        """Drop the oldest until within quota: (last seq dropped, how many), or (0, 0)."""
        through = dropped = 0
        while self.backlog and (  # (None until the first track)
            self.backlog_messages > max_messages or self.backlog_bytes > max_bytes
        ):
            seq, size, count, _at = self.backlog.popleft()
            self.backlog_messages -= count
            self.backlog_bytes -= size
            through, dropped = seq, dropped + count
        self.quota_dropped += dropped
        return through, dropped

    def mark_committed(self, seq: int) -> None:
        if seq > self.committed_upto:
            self.committed_upto = seq
            if self._committed is not None:
                self._committed.set()

    def needs_fill(self) -> bool:
        """Is the next message to send missing from the queue (so it is in the store)?"""
        if not self.durable or not self.ready or self.sent_upto >= self.seq or self._control:
            return False  # (replies, WELCOME first of all, go out before anything else)
        if self._outbox:
            entry = self._outbox[0]
            if entry.__class__ is bytes:
                return False  # an ordered reply first
            return entry[2] > self.sent_upto + 1  # type: ignore[index]
        return True

    def fill_target(self) -> int:
        """The last seq to fetch from the store before the queue can go on."""
        for entry in self._outbox:
            if entry.__class__ is not bytes:
                return entry[2] - 1  # type: ignore[index]
        return self.seq

    async def wait_committed(self, seq: int) -> None:
        while self.committed_upto < seq:
            self._committed = trio.Event()  # (mark_committed sets it)
            await self._committed.wait()

    def wake(self) -> None:
        """Wake the writer: there is something to send (or it should notice the close)."""
        writer = self._writer
        if writer is not None:
            self._writer = None
            trio.lowlevel.reschedule(writer)

    def discard_messages(self) -> int:
        """Drop every queued MSG (a connection being closed); keep control frames. A
        transient session counts them as dropped; a durable one still has them stored."""
        kept = [entry for entry in self._outbox if entry.__class__ is bytes]
        discarded = len(self._outbox) - len(kept)
        self._outbox = kept
        self._discards = None
        if not self.durable:
            self.dropped += discarded
            self.counters.dropped += discarded
        self._queued_messages = 0
        self._queued_bytes = 0
        return discarded

    @property
    def queued(self) -> int:
        """Frames waiting for the writer (replies and messages)."""
        return len(self._control) + len(self._outbox)

    async def wait_data(self) -> None:
        """Return once something is queued (at once if it is); one writer at a time."""
        if self._outbox or self._control:
            return
        self._writer = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort_wait)

    def _abort_wait(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._writer = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait_control_drained(self) -> None:
        """Wait until the client's own replies fit in the queue again."""
        if self._drained is not None:
            await self._drained.wait()

    def take_batch(
        self,
        append_msg: AppendMessage,
        max_bytes: int = 256 * 1024,
        append_discarded: AppendDiscarded | None = None,
        max_messages: int = 1 << 62,
        append_run: AppendRun | None = None,
    ) -> tuple[bytes, int]:
        """Encode queued frames into one write of about ``max_bytes``: every reply of the
        priority lane, then messages (with the front end's ``append_msg``, or, for a message
        after drops, ``append_discarded`` when given), at most ``max_messages`` of them (a
        front end's in-flight window); (bytes, MSG count). Sampled messages
        leave their routing time in ``sampled`` for the caller to observe once the bytes are
        sent. A transient session with no drops to tell has its runs of plain messages
        encoded by ``append_run`` when given (the same bytes, one call per run)."""
        parts: list[bytes | memoryview] = []
        size = 0
        messages = 0
        skipped = 0
        payload_bytes = 0
        control_bytes = 0
        control = self._control
        if control:
            parts.extend(control)
            control_bytes = size = sum(map(len, control))
            control.clear()
        outbox = self._outbox
        durable = self.durable
        end = len(outbox)
        if durable:
            append_run = None  # (its entries are checked against sent_upto one by one)
        i = 0  # entries taken from the front of the outbox (deleted at once, below)
        while i < end and size < max_bytes and messages < max_messages:
            entry = outbox[i]
            if entry.__class__ is bytes:
                i += 1
                parts.append(entry)  # type: ignore[arg-type]
                control_bytes += len(entry)  # type: ignore[arg-type]
                size += len(entry)  # type: ignore[arg-type]
                continue
            if append_run is not None and self._discards is None:
                stop = end if end - i <= max_messages - messages else i + max_messages - messages
                after, added, payload = append_run(parts, outbox, i, stop, max_bytes - size)
                if after > i:
                    messages += after - i
                    payload_bytes += payload
                    size += added
                    i = after
                    continue
            message, sub_id, seq = entry  # type: ignore[misc]
            if durable:
                if seq > self.sent_upto + 1 or not self.ready:
                    break  # a gap: the writer fills it from the store first
                i += 1
                messages += 1
                payload_bytes += message.size
                if seq <= self.sent_upto:
                    skipped += 1
                    continue  # already sent by a fill
                self.sent_upto = seq
            else:
                i += 1
                messages += 1
                payload_bytes += message.size
                discards = self._discards
                if discards is not None:
                    discarded = discards.pop(seq, 0)
                    if not discards:
                        self._discards = None
                    if discarded and append_discarded is not None:
                        if message.routed_at:
                            self.sampled.append(message.routed_at)
                        size += append_discarded(parts, message, sub_id, seq, discarded)
                        continue
            if message.routed_at:  # one message in Broker.latency_sample_every
                self.sampled.append(message.routed_at)
            size += append_msg(parts, message, sub_id, seq)
        if i == end:
            outbox.clear()
        elif i:
            del outbox[:i]
        self.delivered += messages - skipped
        self._queued_messages -= messages
        self._queued_bytes -= payload_bytes
        self._control_bytes -= control_bytes
        if parts:
            self._drops_in_a_row = 0
        if self._drained is not None and self._control_bytes <= self.limits.bytes:
            self._drained.set()
            self._drained = None
        return b"".join(parts), messages
