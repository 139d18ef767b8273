"""Shared groups: N instances of one service share one durable session.

A group is its own subscriber: ``Group`` is a durable ``Session`` as far as
routing and the store are concerned (its filters are in the table, its
messages are stored with sequence numbers). What differs is who reads it: each message goes to
exactly one connected member, round robin among the members that have room
in their prefetch window; a member acknowledges each message on its own
(ACK single, or cumulative over what it holds); when a member leaves, the
messages it held but had not acknowledged go back to the front of the queue
for the others, counted as redeliveries. So every message is processed by
some member at least once, and a member never holds more than its window.

The queue holds the messages not yet handed to a member: those routed while
the broker runs, and those found in the store at start-up.

Topic ACLs: a member is handed only messages its own rules let it have: the group's
subscription the message came by must be one the member's rules grant (``may_subscribe``:
a member that joins does not inherit what another member was allowed to subscribe), and
no deny-subscribe rule of the member may match the topic. A message that no member may
have is settled without delivery (counted in ``acl_denied_deliveries``; ``on_denied``
acknowledges it in the store), so it never blocks the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from broker.core.counters import Counters
from broker.core.message import Message
from broker.core.session import OutboundLimits, Session
from routing.acl import Access

GROUP_PREFIX = "$group/"


def group_session_id(name: str) -> str:
    """The store id of group ``name``'s shared session."""
    return f"{GROUP_PREFIX}{name}"


class Member:
    """One connection's membership: the messages of the group it holds, unacknowledged."""

    __slots__ = ("group", "inflight", "session")

    def __init__(self, group: Group, session: Session) -> None:
        self.group = group
        self.session = session  # the member connection's own outbound queue
        self.inflight: dict[int, tuple[Message, int]] = {}


class Group(Session):
    """A shared group's durable session, which hands each message to one member."""

    shared = True

    def __init__(
        self,
        name: str,
        limits: OutboundLimits,
        counters: Counters,
        prefetch: int,
        *,
        seq: int = 0,
        last_ack: int = 0,
    ) -> None:
        super().__init__(
            group_session_id(name), limits, counters, durable=True, seq=seq, last_ack=last_ack
        )
        self.name = name
        self.prefetch = prefetch
        self.queue: deque[tuple[int, Message, int]] = deque()
        self.members: list[Member] = []
        self._next = 0
        self.redelivered = 0
        # seq -> trio time routed, of every message not yet acked (queued or held by a
        # member); in seq order, as seqs are added in order and only ever removed
        self.pending_since: dict[int, float] = {}
        # Called with the seq of a message no member's rules let it have (settled
        # without delivery): the registry acknowledges it in the store.
        self.on_denied: Callable[[int], None] | None = None

    @property
    def pending_messages(self) -> int:
        """Messages routed to the group and not yet acked by a member."""
        return len(self.pending_since)

    @property
    def oldest_pending_at(self) -> float | None:
        """Trio time the oldest unacked message was routed (for messages restored from the
        store: the time of the restore); None if none."""
        return next(iter(self.pending_since.values()), None)

    def deliver(self, message: Message, sub_id: int) -> bool:
        """Number the message in the group's sequence and hand it to a member with room."""
        self.seq += 1
        self.pending_since[self.seq] = trio.current_time()
        self.offer(message, sub_id, self.seq)
        return True

    def restored(self, seq: int, message: Message, at: float) -> None:
        """Queue a message found in the store at start-up (pending since ``at``)."""
        self.queue.append((seq, message, 0))
        self.pending_since[seq] = at

    def offer(self, message: Message, sub_id: int, seq: int) -> None:
        self.queue.append((seq, message, sub_id))
        self.dispatch()

    def join(self, session: Session) -> Member:
        member = Member(self, session)
        self.members.append(member)
        self.dispatch()
        return member

    def leave(self, member: Member) -> int:
        """``member`` is gone: what it held goes back to the front of the queue."""
        if member in self.members:
            self.members.remove(member)
        held = sorted(member.inflight.items())
        member.inflight.clear()
        for seq, (message, sub_id) in reversed(held):
            self.queue.appendleft((seq, message, sub_id))
        self.redelivered += len(held)
        self.counters.group_redelivered += len(held)
        self.dispatch()
        return len(held)

    def ack(self, member: Member, seq: int, single: bool) -> list[int]:
        """The seqs this ack settles (only ones ``member`` holds)."""
        if single:
            done = [seq] if seq in member.inflight else []
        else:
            done = [s for s in member.inflight if s <= seq]
        pending_since = self.pending_since
        for s in done:
            del member.inflight[s]
            pending_since.pop(s, None)
        self.acked += len(done)
        if done:
            self.dispatch()
        return done

    def dispatch(self) -> None:
        """Hand queued messages to members with room (and whose rules allow them), round
        robin."""
        members = self.members
        queue = self.queue
        while queue and members:
            allowed = False  # some member may have the message at the head
            for _ in range(len(members)):
                self._next %= len(members)
                member = members[self._next]
                self._next += 1
                acl = member.session.acl
                if acl is not None and not self._allows(acl, queue[0]):
                    continue
                allowed = True
                if len(member.inflight) < self.prefetch:
                    seq, message, sub_id = queue.popleft()
                    member.inflight[seq] = (message, sub_id)
                    member.session.push(message, sub_id, seq)
                    self.delivered += 1
                    break
            else:
                if allowed:
                    return  # every window of a member that may have it is full
                seq, _message, _sub_id = queue.popleft()  # no member may: settled
                self.pending_since.pop(seq, None)
                self.acked += 1
                self.counters.acl_denied_deliveries += 1
                if self.on_denied is not None:
                    self.on_denied(seq)

    def _allows(self, acl: Access, entry: tuple[int, Message, int]) -> bool:
        """May a member with rules ``acl`` have this queued message?"""
        _seq, message, sub_id = entry
        ref = self.subs.get(sub_id)
        if ref is not None and not acl.may_subscribe_text(ref.filter, ref.dialect):
            return False
        return not (acl.has_denies and acl.denies(message.topic))

    def holds(self, member: Member, seq: int) -> bool:
        return seq in member.inflight
