"""A native client's requests after WELCOME: each frame becomes core calls and a reply.

``Requests.handle`` takes the frames of one read and looks each one's handler up in a
table keyed by frame class (``_HANDLERS``). Three things make it more than a table:

- PUBs, the hot path, are handled a run at a time (``_publish_run``): a plain PUB (no
  PUBACK asked, no headers, not retained) comes as its checked wire map
  (``Connection.plain_pubs``) and, when nothing about the client needs checking, is
  routed with one core call and nothing else.
- A run of pipelined SUBs or UNSUBs on a plain session is one core call and one write of
  replies, not one per frame (a client may send thousands at once).
- Work that must wait for the store (a filter or ack to write, a PUB whose durable
  subscribers are stored before it is confirmed) is deferred to ``_later`` and awaited
  before the next frame is handled, so each client's requests take effect in order while
  the handlers themselves stay synchronous. PUBACKs go through ``Confirms``.

Topic ACLs (``Session.acl``, set at WELCOME): a PUB the client's rules do not allow, or a
SUB they do not cover, is refused with ERROR NOT_AUTHORIZED naming the request; nothing is
routed or subscribed and the connection carries on. A group member's SUB is checked with
the member's own rules.

A SUB (unless ``retained`` is false) is followed by the retained messages its filter
matches, after its SUBACK: queued at once for a transient session, through the store for a
durable one (deferred like the rest), none for a shared group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

import routing
from broker.core import Broker, DurableWork, Group, Member, NotOwner, QuotaExceeded, Session
from broker.core.session import flush_wakes, hold_wakes
from broker.errors import ErrorCode, ProtocolError, RemoteProtocolError
from broker.log import get_logger
from broker.native.confirms import Confirms
from broker.security import ANONYMOUS, Identity
from broker.store import StoreError
from broker.wire.codec import fast_pub
from broker.wire.connection import NEED_DATA, Connection, ConnectionClosed, NeedData
from broker.wire.frames import (
    Ack,
    DropSession,
    Error,
    Ping,
    Pong,
    Pub,
    Routes,
    RoutesReply,
    SessionDropped,
    Sessions,
    SessionsReply,
    Stats,
    StatsReply,
    Sub,
    Unsub,
)

log = get_logger("topiary.connection")

#: Why ``Requests.handle`` stopped (see there).
Stop = NeedData | ConnectionClosed | RemoteProtocolError | None


class Requests:
    """One client's requests on its session, answered in order (see the module docstring).

    ``member`` is the client's membership of a shared group once it has joined (the owner
    of the connection makes it leave when the connection ends).
    """

    def __init__(
        self,
        broker: Broker,
        proto: Connection,
        session: Session,
        confirms: Confirms,
        joining: Group | None = None,
        peer: str = "?",
        identity: Identity = ANONYMOUS,
    ) -> None:
        self.broker = broker
        self.identity = identity  # the subject of this client's access decisions
        self.proto = proto
        self.session = session
        self.confirms = confirms
        self.peer = peer
        self.member: Member | None = None
        self._joining = joining  # the group to join once the first request is answered
        self._later: list[tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]] = []
        self._publish_bucket = broker.guard.publish_bucket()  # None: no publish rate limit

    async def handle(self, events: list[Any]) -> Stop:
        """Handle the events of one read (``Connection.next_events``), in order.

        Returns the event that ends them: NEED_DATA (read more), ``ConnectionClosed``
        (EOF) or an error that closes the connection; or None when the list stopped before
        a frame that changes the state (call ``next_events`` again before reading).
        """
        session = self.session
        handlers = _HANDLERS
        count = len(events)
        events.append(None)  # so that looking one event ahead needs no bounds check
        i = 0
        while i < count:
            event = events[i]
            i += 1
            cls = event.__class__
            if cls is dict or cls is Pub:  # (dict: a plain PUB, ``Connection.plain_pubs``)
                i = self._publish_run(events, i - 1)  # it and the PUBs right after it
            elif (handler := handlers.get(cls)) is None:
                # not a frame (the state table lets no other frame through)
                if event is NEED_DATA or isinstance(event, ConnectionClosed):
                    return event
                if not isinstance(event, RemoteProtocolError):
                    raise AssertionError(f"unhandled frame {event!r}")
                if event.closes_connection:
                    return event
                self._refuse(event)
                continue
            elif (cls is Sub or cls is Unsub) and cls is events[i].__class__ and self._plain():
                # pipelined SUBs or UNSUBs: a run in one pass
                if cls is Sub:
                    i = self._subscribe_run(events, i - 1)
                else:
                    i = self._unsubscribe_run(events, i - 1)
                continue
            else:
                handler(self, event)
            if self._later:
                flush_wakes()  # (held by the reader: nothing is held across an await)
                problem = await self._run_later()
                hold_wakes()
                if problem is not None:
                    return problem
            if not session.ready:  # its first request is answered: the backlog may come
                session.ready = True
                if self._joining is not None:
                    self.member = self._joining.join(session)
                    self._joining = None
                session.wake()
        return None

    # -- helpers -------------------------------------------------------------------------

    def _plain(self) -> bool:
        """Is a SUB or UNSUB here only a table change and a reply? (The client's own
        transient session, no group, no peers to sync with: then runs of them are batched.)"""
        session = self.session
        return (
            self.member is None
            and self._joining is None
            and session.ready
            and not session.durable
            and not self.broker.peering.active
        )

    def _owner(self) -> Session:
        """The session a SUB or UNSUB changes: the group's for a member (joined or about
        to join), else the client's own."""
        group = self.member.group if self.member is not None else self._joining
        return group if group is not None else self.session

    def _not_authorized(self, what: str, request_id: int | None) -> RemoteProtocolError:
        return RemoteProtocolError(
            ErrorCode.NOT_AUTHORIZED, f"{what} is not allowed by the topic ACLs", ref=request_id
        )

    def _refuse(self, exc: ProtocolError) -> None:
        """Refuse one request with ERROR; the connection carries on."""
        self.broker.counters.errors[str(exc.code)] += 1
        self.session.send_control(self.proto.send(Error.from_exception(exc)))

    # -- runs of PUBs, SUBs and UNSUBs ---------------------------------------------------

    def _publish_run(self, events: list[Any], start: int) -> int:
        """Handle the PUB at ``events[start]`` and the PUBs right after it, each as ``_pub``
        would, in order; returns the index after the last one handled.

        A publisher's read brings hundreds of PUBs, most of them plain (``PlainPub``: no
        PUBACK asked, no headers, not retained). When the client has no publish rate limit
        and no topic ACLs, a plain PUB within the payload limit needs none of ``_pub``'s
        refusals: it is routed straight from its map, by ``Broker.publish_run`` (many in one
        call) when the core's common path takes it, else here with ``publish``. Any other
        goes through ``_pub``. The run stops after a
        PUB that left work to await (``_later``), so that ``handle`` awaits it first, and
        after the first PUB of a session not ``ready`` yet (``handle`` makes it ready).
        """
        broker = self.broker
        publish = broker.publish
        max_payload = broker.config.max_payload
        checked = self._publish_bucket is not None or self.session.acl is not None
        later = self._later
        ready = self.session.ready
        # The plain PUBs the core routes on its common path, many per call; the rest here.
        run = None if checked or not ready else broker.publish_run
        i = start
        while True:
            if run is not None:
                i = run(events, i, max_payload)
                cls = events[i].__class__  # (the list ends with None)
                if cls is not dict and cls is not Pub:
                    return i
            event = events[i]
            i += 1
            if event.__class__ is not dict:
                self._pub(event)
            elif checked or len(event["payload"]) > max_payload:
                self._pub(fast_pub(event))  # (a valid PUB's map: its frame, for the checks)
            else:
                try:
                    work = publish(event["topic"], event["payload"], None, event.get("msg_id"))
                except QuotaExceeded as exc:
                    self._refuse(RemoteProtocolError(ErrorCode.QUOTA_EXCEEDED, str(exc)))
                    work = None
                if work is not None and (later or broker.persist_nowait(work) is None):
                    later.append((self._persist, (work, None)))
            cls = events[i].__class__  # (the list ends with None)
            if later or (cls is not dict and cls is not Pub) or not ready:
                return i

    def _subscribe_run(self, events: list[Any], start: int) -> int:
        """Handle the run of SUBs at ``events[start]`` (``_plain`` sessions only) as
        ``_sub`` would, one after the other, with their SUBACKs in one write; returns the
        index after the run."""
        end = start + 1
        while events[end].__class__ is Sub:  # (the list ends with None)
            end += 1
        frames = events[start:end]
        broker = self.broker
        session = self.session
        refused: list[bytes] = []
        if broker.guard.subscriptions_full(len(session.subs) + len(frames)):
            room = max(0, broker.guard.max_subscriptions - len(session.subs))
            refused = [self._over_limit(frame.id) for frame in frames[room:]]
            frames = frames[:room]
        acl = session.acl
        if acl is not None and not all(acl.may_subscribe(frame.parsed) for frame in frames):
            return self._subscribe_checked(frames, end, refused)
        sub_ids = broker.subscribe_many(session, [frame.parsed for frame in frames])
        replies = map(self.proto.send_suback, [frame.id for frame in frames], sub_ids)
        session.send_control(b"".join(replies) + b"".join(refused))
        if len(broker.retained):  # (the SUBACKs go ahead of the MSGs: control frames)
            for frame, sub_id in zip(frames, sub_ids, strict=True):
                if frame.retained:
                    broker.deliver_retained_nowait(session, sub_id, frame.parsed)
        return end

    def _subscribe_checked(self, frames: list[Sub], end: int, refused: list[bytes]) -> int:
        """A run of SUBs some of which the topic ACLs refuse: the others subscribed in one
        core call, and every SUBACK and ERROR in order, in one write (``refused``: the
        ERRORs of the run's tail, over the subscription limit, last)."""
        acl = self.session.acl
        assert acl is not None
        allowed = [acl.may_subscribe(frame.parsed) for frame in frames]
        broker = self.broker
        session = self.session
        granted = [frame.parsed for frame, ok in zip(frames, allowed, strict=True) if ok]
        sub_ids = iter(broker.subscribe_many(session, granted))
        parts = []
        given = []
        for frame, ok in zip(frames, allowed, strict=True):
            if ok:
                sub_id = next(sub_ids)
                given.append((frame, sub_id))
                parts.append(self.proto.send_suback(frame.id, sub_id))
            else:
                broker.counters.acl_denied_subscribe += 1
                exc = self._not_authorized(f"subscribing to {frame.filter!r}", frame.id)
                broker.counters.errors[str(exc.code)] += 1
                parts.append(self.proto.send(Error.from_exception(exc)))
        session.send_control(b"".join(parts) + b"".join(refused))
        if len(broker.retained):
            for frame, sub_id in given:
                if frame.retained:
                    broker.deliver_retained_nowait(session, sub_id, frame.parsed)
        return end

    def _unsubscribe_run(self, events: list[Any], start: int) -> int:
        """``_subscribe_run`` for a run of UNSUBs: UNSUBACKs, and ERRORs for unknown
        subscriptions, in order in one write."""
        end = start + 1
        while events[end].__class__ is Unsub:
            end += 1
        frames = events[start:end]
        dropped = self.broker.unsubscribe_many(self.session, [frame.sub for frame in frames])
        parts = []
        for frame, ok in zip(frames, dropped, strict=True):
            if ok:
                parts.append(self.proto.send_unsuback(frame.id))
            else:
                exc = RemoteProtocolError(
                    ErrorCode.UNKNOWN_SUBSCRIPTION,
                    f"no subscription {frame.sub} on this session",
                    ref=frame.id,
                )
                self.broker.counters.errors[str(exc.code)] += 1
                parts.append(self.proto.send(Error.from_exception(exc)))
        self.session.send_control(b"".join(parts), ordered=True)  # after the MSGs before it
        return end

    # -- one handler per frame class (the table is _HANDLERS, below) ---------------------

    def _pub(self, frame: Pub) -> None:
        broker = self.broker
        bucket = self._publish_bucket
        if bucket is not None and not bucket.take(trio.current_time()):
            text = broker.guard.publish_refused(self.session.client_id)
            self._refuse(RemoteProtocolError(ErrorCode.RATE_LIMITED, text, ref=frame.id))
            return
        acl = self.session.acl
        if acl is not None and not acl.may_publish(frame.topic):
            broker.counters.acl_denied_publish += 1
            self._refuse(self._not_authorized(f"publishing to {frame.topic!r}", frame.id))
            return
        if len(frame.payload) > broker.config.max_payload:
            self._refuse(
                RemoteProtocolError(
                    ErrorCode.PAYLOAD_TOO_LARGE,
                    f"payload of {len(frame.payload)} bytes exceeds the limit of "
                    f"{broker.config.max_payload}",
                    ref=frame.id,
                )
            )
            return
        gate = broker.write_refusal
        if gate is not None and frame.id is not None and (why := gate()) is not None:
            self._refuse(RemoteProtocolError(ErrorCode.FENCED, why, ref=frame.id))
            return
        try:
            if frame.retain:
                work = broker.publish(
                    frame.topic, frame.payload, frame.headers, frame.msg_id, retain=True
                )
            else:  # (the hot path: the call as it was before retained messages)
                work = broker.publish(frame.topic, frame.payload, frame.headers, frame.msg_id)
        except QuotaExceeded as exc:
            self._refuse(RemoteProtocolError(ErrorCode.QUOTA_EXCEEDED, str(exc), ref=frame.id))
            return
        if work is not None:
            pending = None if self._later else broker.persist_nowait(work)
            if pending is None:
                self._later.append((self._persist, (work, frame.id)))
            elif frame.id is not None:
                self.confirms.after(pending, frame.id)
        elif frame.id is not None:
            self.confirms.now(frame.id)

    def _sub(self, frame: Sub) -> None:
        broker = self.broker
        session = self.session
        acl = session.acl  # (a group member's own rules, whoever owns the subscription)
        if acl is not None and not acl.may_subscribe(frame.parsed):
            broker.counters.acl_denied_subscribe += 1
            self._refuse(self._not_authorized(f"subscribing to {frame.filter!r}", frame.id))
            return
        owner = (
            session if self.member is None and self._joining is None else self._owner()
        )  # (most sessions are nobody's group member: no call for them)
        if broker.guard.subscriptions_full(len(owner.subs)):
            self.session.send_control(self._over_limit(frame.id))
            return
        sub_id = broker.subscribe(owner, frame.parsed)
        reply = self.proto.send_suback(frame.id, sub_id)
        sync = frame.sync and broker.peering.active
        if owner.durable:
            self._later.append(
                (self._store_filter, (owner, frame.parsed, True, None if sync else reply))
            )
        if sync:
            self._later.append((self._sync_sub, (owner, sub_id, frame, reply)))
        elif not owner.durable:
            session.send_control(reply)
        if frame.retained and not owner.shared and len(broker.retained):
            if owner.durable or sync:  # after the deferred SUBACK, through the store
                self._later.append((self._send_retained, (owner, sub_id, frame.parsed)))
            else:  # the SUBACK (a control frame) goes ahead of them
                broker.deliver_retained_nowait(owner, sub_id, frame.parsed)

    def _over_limit(self, request_id: int) -> bytes:
        """The ERROR for a SUB past the client's ``max_subscriptions`` (counted)."""
        text = self.broker.guard.subscriptions_refused(self.session.client_id)
        exc = RemoteProtocolError(ErrorCode.LIMIT_EXCEEDED, text, ref=request_id)
        self.broker.counters.errors[str(exc.code)] += 1
        return self.proto.send(Error.from_exception(exc))

    def _unsub(self, frame: Unsub) -> None:
        owner = self._owner()
        ref = owner.subs.get(frame.sub)
        if self.broker.unsubscribe(owner, frame.sub):
            reply = self.proto.send_unsuback(frame.id)
            if owner.durable and ref is not None and not ref.sub_ids:
                flt = routing.parse_filter(ref.filter, ref.dialect)
                self._later.append((self._store_filter, (owner, flt, False, reply)))
            else:
                self.session.send_control(reply, ordered=True)  # no MSG of it follows
        else:
            self._refuse(
                RemoteProtocolError(
                    ErrorCode.UNKNOWN_SUBSCRIPTION,
                    f"no subscription {frame.sub} on this session",
                    ref=frame.id,
                )
            )

    def _ack(self, frame: Ack) -> None:
        session = self.session
        member = self.member
        if member is not None:
            settled = member.group.ack(member, frame.seq, frame.single)
            if frame.single and not settled:
                self._refuse(
                    RemoteProtocolError(
                        ErrorCode.INVALID_ACK,
                        f"sequence {frame.seq} is not held by this group member",
                    )
                )
            elif settled:
                self._later.append((self._store_ack_one, (member.group.client_id, settled)))
            return
        delivered = session.sent_upto if session.durable else session.seq
        if frame.seq > delivered:
            self._refuse(
                RemoteProtocolError(
                    ErrorCode.INVALID_ACK,
                    f"ack of sequence {frame.seq}, but only {delivered} were delivered",
                )
            )
        elif session.durable and frame.seq > session.last_ack:
            session.last_ack = frame.seq
            session.release_through(frame.seq)
            self._later.append((self._store_ack, (frame.seq,)))

    def _ping(self, frame: Ping) -> None:
        self.session.send_control(self.proto.send(Pong(id=frame.id)))

    def _pong(self, frame: Pong) -> None:
        pass  # the connection noted that the client was heard when the bytes arrived

    def _sessions(self, frame: Sessions) -> None:
        reply = SessionsReply(id=frame.id, sessions=self.broker.sessions_info())
        self.session.send_control(self.proto.send(reply))

    def _drop_session(self, frame: DropSession) -> None:
        self._later.append((self._drop_stored_session, (frame,)))

    def _routes(self, frame: Routes) -> None:
        reply = RoutesReply(id=frame.id, routes=self.broker.routes_info())
        self.session.send_control(self.proto.send(reply))

    def _stats(self, frame: Stats) -> None:
        self.session.send_control(
            self.proto.send(StatsReply(id=frame.id, stats=self.broker.stats()))
        )

    def _error(self, frame: Error) -> None:
        # After a closing ERROR the protocol drops what follows until EOF, and nothing more
        # is sent to this client (ClientConnection._finish checks).
        log.info("client error", peer=self.peer, code=frame.code, text=frame.text)

    # -- work that waits for the store ---------------------------------------------------

    async def _run_later(self) -> RemoteProtocolError | None:
        """Await the deferred jobs, in order; a store failure closes this client only."""
        later, self._later = self._later, []
        try:
            for job, args in later:
                await job(*args)
        except StoreError as exc:  # this client's request; others carry on
            self.broker.counters.store_errors += 1
            log.error("store failed", client=self.session.client_id, error=str(exc))
            return RemoteProtocolError(ErrorCode.INTERNAL, f"storage failed: {exc}")
        return None

    async def _persist(self, work: DurableWork, request_id: int | None) -> None:
        pending = await self.broker.persist(work)
        if request_id is not None:
            self.confirms.after(pending, request_id)

    async def _store_filter(
        self, owner: Session, flt: routing.Filter, add: bool, reply: bytes | None
    ) -> None:
        store = self.broker.store
        assert store is not None
        if add:
            await store.add_filter(owner.client_id, flt.text, flt.dialect)
        else:
            await store.remove_filter(owner.client_id, flt.text, flt.dialect)
        if reply is not None:  # an UNSUBACK waits in line behind the MSGs (no MSG follows it)
            self.session.send_control(reply, ordered=not add)

    async def _sync_sub(self, owner: Session, sub_id: int, frame: Sub, reply: bytes) -> None:
        """SUBACK only once every reachable broker has the route; else undo, and say so."""
        if await self.broker.peering.sync():
            self.session.send_control(reply)
            return
        ref = owner.subs.get(sub_id)
        self.broker.unsubscribe(owner, sub_id)
        if owner.durable and ref is not None and not ref.sub_ids:
            await self._store_filter(owner, frame.parsed, False, None)
        self._refuse(
            RemoteProtocolError(
                ErrorCode.SYNC_TIMEOUT,
                f"not every reachable broker acknowledged the route within "
                f"{self.broker.config.sync_timeout} s; the subscription was removed",
                ref=frame.id,
            )
        )

    async def _send_retained(self, owner: Session, sub_id: int, flt: routing.Filter) -> None:
        """The retained messages for a new subscription, unless it is gone again (a
        ``sync`` SUB that failed)."""
        if sub_id in owner.subs:
            await self.broker.deliver_retained(owner, sub_id, flt)

    async def _drop_stored_session(self, frame: DropSession) -> None:
        try:
            dropped = await self.broker.drop_session(
                frame.client_id, requester=self.session, owner=self.identity.owner
            )
        except NotOwner as exc:
            self._refuse(RemoteProtocolError(ErrorCode.NOT_AUTHORIZED, str(exc), ref=frame.id))
            return
        reply = SessionDropped(id=frame.id, dropped=dropped)
        self.session.send_control(self.proto.send(reply))

    async def _store_ack_one(self, client_id: str, seqs: list[int]) -> None:
        store = self.broker.store
        assert store is not None
        for seq in seqs:
            await store.begin_ack_one(client_id, seq)

    async def _store_ack(self, seq: int) -> None:
        store = self.broker.store
        assert store is not None
        await store.begin_ack(self.session.client_id, seq)


#: The handler of each frame a client may send after WELCOME (the state table in
#: broker.wire.states lets no other through).
_HANDLERS: Final[dict[type, Callable[[Requests, Any], None]]] = {
    Pub: Requests._pub,
    Sub: Requests._sub,
    Unsub: Requests._unsub,
    Ack: Requests._ack,
    Ping: Requests._ping,
    Pong: Requests._pong,
    Sessions: Requests._sessions,
    DropSession: Requests._drop_session,
    Routes: Requests._routes,
    Stats: Requests._stats,
    Error: Requests._error,
}
