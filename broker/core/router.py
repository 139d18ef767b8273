"""The router: the broker's sessions, its subscription table, and publish -> deliver.

Routing is synchronous: ``publish`` matches a message and queues it to every
interested session before it returns, which is what keeps per-publisher order
on every topic; what it asks of the store comes back as ``DurableWork`` for the
caller to queue before it reads on. Only opening sessions and talking to the
store awaits. Front ends (broker/native/, one package per protocol) call in;
the router calls out only through ``Session.deliver`` and the ``Mesh``.

Topic ACLs (``routing.acl``, configured by broker/security/acl_file.py): front ends check
publishes and subscriptions with a session's ``acl`` before they call in; the router applies
deny-subscribe rules per message. A match answer whose sessions have no deny rules keeps
its plain delivery plan; one with a session that has some gets a checked plan
(``_Checked``), routed the long way, which skips that session for the topics its rules deny
(counted in ``acl_denied_deliveries``); retained messages sent on subscribe obey them too.

Retained messages (``publish(..., retain=True)``) are routed like any other and also kept
as their topic's retained message (``Retained``; in the store too, in the same append), and
a new subscription is sent the retained messages it matches (``deliver_retained``). They
stay off the path of an ordinary publish: one test of ``retain``. Retained state is this
broker's: a message forwarded to a peer is retained by the broker it was published to.
"""

from __future__ import annotations

import heapq
import itertools
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

import routing
from broker.config import BrokerConfig
from broker.core.counters import Counters
from broker.core.dedupe import RecentIds
from broker.core.delivery import DurableWork, Mesh, NullMesh, QuotaExceeded
from broker.core.extra import apply_extra, pack_extra
from broker.core.groups import Group
from broker.core.hot import HotSpots
from broker.core.message import Message
from broker.core.reports import REPORTS_FILTER, Reports
from broker.core.retained import Retained
from broker.core.session import OutboundLimits, Session, SubRef
from broker.core.sessions import NotOwner, SessionRegistry, may_own, run_prefix
from broker.core.store_full import StoreFullLog
from broker.histogram import Histogram
from broker.log import get_logger
from broker.security.floods import FloodGuard
from broker.security.identity import Identity
from broker.security.logins import Logins
from broker.security.principals import away_identity
from broker.store import Pending, Store, StoreError, StoreFull
from routing.acl import Access, Policy

log = get_logger("topiary.broker")

WORST_DROPPING = 5  # sessions STATS names as the ones that dropped most

#: One routed message in this many carries its routing time (``Message.routed_at``) for the
#: publish-to-delivery latency histogram: timing every one would cost fan-out throughput.
LATENCY_SAMPLE_EVERY = 64
#: Delivery plans kept (``Broker._plans``): distinct match answers, not topics, so a few
#: hundred cover a stream of tens of thousands of topics; emptied when full.
PLANS_MAX = 4096
#: The plan of an answer that reaches a durable session: routed the long way.
_DURABLE: Any = ()


class _Checked:
    """The plan of an answer that reaches a session with deny-subscribe rules: the
    (session, sub id) entries grouped by their deny rules (``Access.denials``: sessions with
    the same ones share them), each group as (its ``denies`` or None, entries), so a message
    asks each set of rules once."""

    __slots__ = ("groups",)

    def __init__(self, groups: tuple[tuple[Any, tuple[tuple[Session, int], ...]], ...]) -> None:
        self.groups = groups


class Broker:
    """The protocol-agnostic core: sessions (transient, durable, shared groups), the
    subscription table, the duplicate filter and the counters; every front end calls it."""

    def __init__(self, config: BrokerConfig | None = None, store: Store | None = None) -> None:
        self.config = config or BrokerConfig()
        self.store = store
        self.server_id = self.config.broker_id or f"topiary-{os.getpid()}"
        self.table = routing.SubscriptionTable(cache_size=self.config.match_cache)
        self.counters = Counters()
        # Who may connect (users file, anonymous access): raises ConfigError for a bad file.
        self.logins = Logins(self.config, self.counters)
        # Limits against floods (connections, rates, subscriptions): the front ends ask it.
        self.guard = FloodGuard(self.config, self.counters)
        # The busiest topics and filters, sampled (one routed message in ~64; see hot.py).
        self.hot = HotSpots()
        self.connections: set[Any] = set()  # ClientConnection objects, for shutdown
        self.started = time.time()
        self.limits = OutboundLimits(
            messages=self.config.outbound_messages,
            bytes=self.config.outbound_bytes,
            slow_consumer_drops=self.config.slow_consumer_drops,
        )
        # Message ids the broker assigns: unique per broker run, short to send.
        self._id_prefix = run_prefix()
        self._msg_counter = itertools.count(1)
        self.registry = SessionRegistry(
            self.config, store, self.limits, self.counters, self._id_prefix
        )
        self._recent_ids = RecentIds(self.config.dedup_window)
        # The last retained message of each topic (loaded from the store by ``load``).
        self.retained = Retained()
        # Publish-to-delivery latency, seconds: from routing a sampled message (every
        # ``latency_sample_every``-th that reaches a session) to a writer sending its MSG.
        self.latency_sample_every = LATENCY_SAMPLE_EVERY
        self.delivery_latency = Histogram()
        self._until_sample = self.latency_sample_every
        # Match answer -> its delivery plan: ((session, sub id), ...) each session once,
        # when every session in it is transient, else _DURABLE. Emptied by every change of
        # the subscriptions (sub ids and sessions change only then), and when full.
        self._plans: dict[frozenset, Any] = {}
        # Front ends with state of their own beyond the sessions (MQTT), by name: STATS
        # includes what each ``stats()`` says.
        self.frontends: dict[str, Any] = {}
        # The peer mesh, once the broker is served with one (broker.server attaches it).
        self.peering: Mesh = NullMesh()
        #: The hot-spare election (broker/ha/elector.py), when failover is by the witness:
        #: ``write_refusal()`` says why a confirmed write is refused now (None: allowed),
        #: ``ha_statistics()`` is merged into STATS' ``ha`` section.
        self.write_refusal: Callable[[], str | None] | None = None
        #: Appends the disk refused: counted, logged rate-limited (store_full.py).
        self.store_full = StoreFullLog(self.counters)
        self.ha_statistics: Callable[[], dict[str, Any]] | None = None
        # The last report of each bridge (reports.py): in the table, in no registry, and
        # subscribed before any mesh exists, so it is not mirrored to peers.
        self.reports = Reports(self.limits, self.counters)
        # Topic ACLs: None, everything is allowed (no [acl] configured); see set_policy.
        self.policy: Policy | None = None
        reports_filter = routing.parse_filter(REPORTS_FILTER)
        _sub_id, ref, _new = self.reports.subscribe(reports_filter.text, reports_filter.dialect)
        self.table.add(reports_filter, ref)

    # -- sessions (kept by the registry; the router adds the table and the mesh) ----------

    @property
    def sessions(self) -> dict[str, Session]:
        return self.registry.sessions

    @property
    def durable(self) -> dict[str, Session]:
        return self.registry.durable

    @property
    def groups(self) -> dict[str, Group]:
        return self.registry.groups

    def open_session(self, client_id: str | None) -> Session:
        return self.registry.open_transient(client_id)

    async def open_durable(
        self, client_id: str, owner: str | None = None, cert: str | None = None
    ) -> tuple[Session, bool]:
        """The durable session (``SessionRegistry.open_durable``: ``NotOwner`` when it
        belongs to an identity other than ``owner``, whose connection presented the
        certificate subject ``cert``) and whether it existed."""
        return await self.registry.open_durable(client_id, owner, cert)

    def may_own(self, client_id: str, owner: str) -> bool:
        """Whether ``owner`` may open or drop the durable session ``client_id`` (True when
        there is none): front ends ask before they take over a connection holding it."""
        session = self.registry.durable.get(client_id)
        return session is None or may_own(session, owner)

    async def open_group(self, name: str) -> tuple[Group, bool]:
        return await self.registry.open_group(name)

    def sessions_info(self) -> list[dict[str, Any]]:
        return self.registry.describe()

    async def load(self) -> int:
        """Restore the durable sessions in the store (their filters route again at once)
        and the retained messages (with their QoS, MQTT properties and expiry); returns how
        many sessions. A session whose owner the store knows has its owner's topic ACL
        rules from here on (``principal``): with a policy in force, its filters those rules
        do not grant are removed (from the store too), else ``set_policy`` does that.
        The duplicate window starts from the publisher ids the store kept, so a copy a
        publisher sends again after a restart or a failover is dropped here too, not only
        by the store (transient subscribers would get it twice)."""
        if self.store is not None:
            if self.config.dedup_window:
                for msg_id in await self.store.recent_publisher_ids(self.config.dedup_window):
                    self._recent_ids.seen(msg_id)
            retained = self.retained
            for kept in await self.store.retained():
                retained.update(kept.topic, kept.payload, kept.headers, kept.msg_id)
                if kept.extra is not None:
                    held = retained.get(kept.topic)
                    if held is not None:
                        apply_extra(held, kept.extra)
        restored = await self.registry.restore()
        for session, filters in restored:
            for text, dialect in filters:
                self.subscribe(session, routing.parse_filter(text, dialect))
        store = self.registry.store
        for session, _filters in restored:
            if session.principal is None or store is None:
                continue
            session.acl = self._rules_of(session)
            for _sub_id, flt in self._revoke(session):
                try:
                    await store.remove_filter(session.client_id, flt.text, flt.dialect)
                except StoreError as exc:  # (still stored: the next start removes it again)
                    log.error("store failed", client=session.client_id, error=str(exc))
        return len(restored)

    async def persist(self, work: DurableWork) -> Pending:
        """Queue the store append for ``work`` (waiting for room); once its outcome is known
        its seqs are marked committed, which lets writers fill gaps from the store."""
        assert self.store is not None
        message = work.message
        deliveries = work.deliveries
        pending = await self.store.begin_append(
            msg_id=message.msg_id,
            topic=message.topic,
            payload=message.payload,
            headers=message.headers,
            deliveries=[(session.client_id, seq) for session, seq in deliveries],
            publisher_msg_id=work.publisher_msg_id,
            on_done=partial(self._settled, deliveries),
            retain=work.retain,
            from_retained=message.from_retained,
            extra=pack_extra(message),
        )
        for session, through in work.trims or ():
            await self.store.begin_trim_through(session.client_id, through)
        return pending

    def persist_nowait(self, work: DurableWork) -> Pending | None:
        """``persist`` without a checkpoint, for the reader's hot path: None (nothing queued)
        when the store's queue has no room for the append and its quota trims, or it is
        closed; then ``persist`` does it (and raises what there is to raise)."""
        assert self.store is not None
        message = work.message
        deliveries = work.deliveries
        trims = work.trims
        try:
            return self.store.append_nowait(
                message.msg_id,
                message.topic,
                message.payload,
                message.headers,
                tuple([(session.client_id, seq) for session, seq in deliveries]),
                work.publisher_msg_id,
                partial(self._settled, deliveries),
                work.retain,
                message.from_retained,
                pack_extra(message),
                None if trims is None else [(s.client_id, through) for s, through in trims],
            )
        except (trio.WouldBlock, StoreError):
            return None

    def _settled(self, deliveries: list[tuple[Session, int]], error: BaseException | None) -> None:
        """An append's outcome is known (in commit order): its seqs are in the store, or
        will never be, so a writer waiting to fill from the store may go on."""
        if error is not None:
            self.counters.store_errors += 1
            if isinstance(error, StoreFull):
                self.store_full.refused(error)
            else:
                log.error("store append failed", error=str(error))
        elif self.store_full.active:
            self.store_full.succeeded()
        for session, seq in deliveries:
            session.mark_committed(seq)

    async def drop_session(
        self, client_id: str, requester: Session | None = None, owner: str | None = None
    ) -> bool:
        """Delete a durable session and what is stored for it.

        A connection holding it is closed with SESSION_TAKEN, unless it is the requester's
        own: that one carries on as a transient session (its subscriptions stay live).
        Given an ``owner`` (the requester's ``Identity.owner``), a session that belongs to
        another identity is not touched: ``NotOwner``.
        """
        if self.store is None:
            return False
        held = self.registry.durable.get(client_id)
        if held is not None and not may_own(held, owner):
            raise NotOwner(client_id)
        session = self.registry.durable.pop(client_id, None)
        if isinstance(session, Group):
            self.registry.forget_group(session)
        if session is not None:
            session.durable = False
            self._plans.clear()
            if session is not requester:
                holder = session.connection
                if holder is not None:
                    holder.take_over("the session was dropped")
                self.close_session(session)
        dropped = await self.store.drop_session(client_id)
        return dropped or session is not None

    async def drop_group(self, group: Group) -> None:
        """End a shared group (an MQTT ``$share`` subscription whose last subscriber left):
        its filters, its queue, and what is stored for it."""
        if group.members:
            return  # joined again meanwhile
        if self.store is not None:
            await self.drop_session(group.client_id)
            return
        self.registry.durable.pop(group.client_id, None)
        self.registry.forget_group(group)
        self.close_session(group)

    def close_session(self, session: Session) -> None:
        self._plans.clear()
        peering = self.peering if self.peering.active else None
        for ref in list(session.refs.values()):
            self.table.remove(ref.filter, ref, ref.dialect)
            if peering is not None:
                peering.local_remove(routing.parse_filter(ref.filter, ref.dialect))
        session.refs.clear()
        session.subs.clear()
        self.registry.forget(session)

    # -- topic ACLs ----------------------------------------------------------------------

    def access_for(self, identity: Identity, client_id: str) -> Access | None:
        """The compiled rules of a client (None when no policy is configured)."""
        policy = self.policy
        return None if policy is None else policy.access(identity, client_id)

    def authorize(
        self, session: Session, identity: Identity, client_id: str
    ) -> list[tuple[int, routing.Filter]]:
        """Give ``session`` the rules of ``identity`` and ``client_id`` (the id the client
        gave, not a registry key), and remove the subscriptions they do not grant (a
        resumed durable session's): those are returned as (sub id, filter), counted in
        ``acl_denied_subscribe``; the caller tells the client and updates the store."""
        session.principal = (identity, client_id)
        session.acl = self.access_for(identity, client_id)
        self._plans.clear()
        return self._revoke(session)

    def set_policy(self, policy: Policy | None) -> list[tuple[Session, list[tuple[int, Any]]]]:
        """Switch to ``policy`` (start-up, a SIGHUP reload): every session with a principal
        gets its new rules at once, connections stay; each loses the subscriptions the new
        rules do not grant, and its ``on_revoked`` is told (of none, too). Returns (session,
        removed) for each session that lost some. A durable session that is away (restored
        from the store, or left by its connection) gets its owner's rules as the users file
        says now (``_rules_of``); one whose owner the store does not know (stored by an
        older version) has no principal: its owner's next connection checks it."""
        self.policy = policy
        self._plans.clear()
        changed = []
        seen: set[int] = set()
        for session in [*self.registry.sessions.values(), *self.registry.durable.values()]:
            principal = session.principal
            if principal is None or id(session) in seen:
                continue
            seen.add(id(session))
            session.acl = self._rules_of(session)
            removed = self._revoke(session)
            if removed:
                changed.append((session, removed))
            if session.on_revoked is not None:  # (told even of none: MQTT checks its shares)
                session.on_revoked(removed)
        return changed

    def _rules_of(self, session: Session) -> Access | None:
        """The compiled rules of a session with a principal: its client's, or, for a
        durable session that no connection holds, its owner's as the users file in force
        names it (``broker.security.principals.away_identity``: current groups; a user the
        file no longer names gets what an anonymous client would)."""
        assert session.principal is not None
        identity, client_id = session.principal
        # (Front ends attach a durable session and ``authorize`` it without a checkpoint in
        # between, so a session with a connection always has its client's principal here.)
        if session.durable and session.connection is None and not session.shared:
            identity = away_identity(identity, self.logins.users)
        return self.access_for(identity, client_id)

    def _revoke(self, session: Session) -> list[tuple[int, routing.Filter]]:
        """Unsubscribe what ``session``'s rules do not grant; (sub id, filter) of each."""
        acl = session.acl
        if acl is None or not session.subs:
            return []
        removed = []
        for sub_id, ref in list(session.subs.items()):
            if not acl.may_subscribe_text(ref.filter, ref.dialect):
                self.unsubscribe(session, sub_id)
                removed.append((sub_id, routing.parse_filter(ref.filter, ref.dialect)))
        self.counters.acl_denied_subscribe += len(removed)
        if removed:
            log.info(
                "subscriptions removed by the topic ACLs",
                client=session.client_id,
                filters=[flt.text for _sub_id, flt in removed],
            )
        return removed

    def _acl_allows(self, session: Session, topic: str) -> bool:
        """Do ``session``'s deny-subscribe rules let ``topic`` through? (Counted if not.)"""
        acl = session.acl
        if acl is None or not acl.has_denies or not acl.denies(topic):
            return True
        self.counters.acl_denied_deliveries += 1
        return False

    # -- subscriptions -------------------------------------------------------------------

    def subscribe(self, session: Session, filter: routing.Filter) -> int:
        """Returns the subscription id; ``filter`` was parsed (and so checked) by the caller."""
        sub_id, ref, is_new = session.subscribe(filter.text, filter.dialect)
        self._plans.clear()
        if is_new:
            self.table.add(filter, ref)
            if self.peering.active:
                self.peering.local_add(filter)
        self.counters.subscribes += 1
        return sub_id

    def subscribe_many(self, session: Session, filters: list[routing.Filter]) -> list[int]:
        """``subscribe`` for each filter in order (a client's pipelined SUBs); their ids."""
        sub_ids, new = session.subscribe_many(filters)
        self._plans.clear()
        if new:
            self.table.add_many(new)
            if self.peering.active:
                for flt, _ref in new:
                    self.peering.local_add(flt)
        self.counters.subscribes += len(filters)
        return sub_ids

    def unsubscribe_many(self, session: Session, sub_ids: list[int]) -> list[bool]:
        """``unsubscribe`` for each id in order (a client's pipelined UNSUBs)."""
        self._plans.clear()
        found = []
        append = found.append
        session_unsubscribe = session.unsubscribe
        gone: list[tuple[str, str, SubRef]] = []  # the table entries to remove, in order
        for sub_id in sub_ids:
            dropped = session_unsubscribe(sub_id)
            if dropped is None:
                append(False)
                continue
            ref, remove_entry = dropped
            if remove_entry:
                gone.append((ref.filter, ref.dialect, ref))
            append(True)
        if gone:
            self.table.remove_many(gone)
            if self.peering.active:
                for text, dialect, _ref in gone:
                    self.peering.local_remove(routing.parse_filter(text, dialect))
        self.counters.unsubscribes += found.count(True)
        return found

    def unsubscribe(self, session: Session, sub_id: int) -> bool:
        self._plans.clear()
        dropped = session.unsubscribe(sub_id)
        if dropped is None:
            return False
        ref, remove_entry = dropped
        if remove_entry:
            self.table.remove(ref.filter, ref, ref.dialect)
            if self.peering.active:
                self.peering.local_remove(routing.parse_filter(ref.filter, ref.dialect))
        self.counters.unsubscribes += 1
        return True

    # -- routing -------------------------------------------------------------------------

    def next_msg_id(self) -> str:
        return f"{self._id_prefix}{next(self._msg_counter)}"

    def publish(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        msg_id: str | None = None,
        *,
        retain: bool = False,
    ) -> DurableWork | None:
        """Route one message to every interested session.

        Returns the store work when durable sessions got it, or when it is retained and
        there is a store (the caller queues it with ``persist`` before reading on, so the
        store sees appends in routing order). With ``retain`` the message (flagged
        ``retain``) also replaces its topic's retained message; an empty payload deletes
        that instead, and is routed all the same.
        """
        if retain:
            message = Message(topic, payload, headers, msg_id or self.next_msg_id(), retain=True)
            return self.publish_message(message, msg_id)
        counters = self.counters
        if msg_id is not None and self._recent_ids.seen(msg_id):
            counters.duplicates_dropped += 1
            return None
        counters.messages_in += 1
        counters.bytes_in += len(payload)
        peering = self.peering
        if not peering.active:
            # _route's common case, inlined (no peers, transient sessions only: see there)
            targets = self.table.match(topic)
            plan = self._plans.get(targets)
            if (
                plan is None
                or plan is _DURABLE
                or plan.__class__ is _Checked
                or counters.messages_in >= self.hot.next_at
                or self._until_sample == 1
            ):
                return self._route(topic, payload, headers, msg_id, msg_id, targets=targets)
            self._until_sample -= 1
            if not msg_id:
                msg_id = f"{self._id_prefix}{next(self._msg_counter)}"
            message = Message(topic, payload, headers, msg_id)
            delivered = 0
            for session, sub_id in plan:
                delivered += session.deliver(message, sub_id)
            counters.messages_out += delivered
            counters.bytes_out += delivered * message.size
            return None
        dests = peering.wanting(topic)
        if not dests:
            return self._route(topic, payload, headers, msg_id, msg_id)
        message = Message(topic, payload, headers, msg_id or self.next_msg_id())
        work = self._route(topic, payload, headers, message.msg_id, msg_id, message, remote=True)
        peering.forward(message, msg_id is not None, dests, 1, self.server_id)
        return work

    def publish_run(self, pubs: list[Any], start: int, max_payload: int) -> int:
        """``publish(pub["topic"], pub["payload"])`` for the plain PUB maps ``pubs[start:]``
        (checked wire maps of PUBs with no id, msg_id, headers or retain flag, as
        ``broker.wire.codec.plain_pub`` passes them on) that ``publish``'s inlined common
        case would route: no peers, payload within ``max_payload``, a plan of transient
        sessions only with no deny rules, no hot-spot or latency sample due. Returns the
        index of the first entry it did not route (a map that needs ``publish`` itself, or
        anything else): the caller publishes that one its own way.

        The same deliveries, counters and message ids as one ``publish`` per PUB, with
        what ``publish`` looks up per call looked up once per run, and the counters added
        once: a publisher's read brings hundreds of PUBs.
        """
        if self.peering.active:
            return start
        counters = self.counters
        match = self.table.match
        plans = self._plans
        prefix = self._id_prefix
        serial = self._msg_counter
        until = self._until_sample
        sample_at = self.hot.next_at
        count = counters.messages_in
        bytes_in = delivered = bytes_out = unrouted = 0
        i = start
        while True:
            pub = pubs[i]
            if pub.__class__ is not dict or len(pub) != 3 or until == 1:
                break  # (3 keys: type, topic, payload; a msg_id goes through the dedupe)
            payload = pub["payload"]
            size = len(payload)
            if size > max_payload or count + 1 >= sample_at:
                break
            topic = pub["topic"]
            targets = match(topic)
            if not targets:  # routed nowhere: counted, as _route counts it
                count += 1
                bytes_in += size
                unrouted += 1
                i += 1
                continue
            plan = plans.get(targets)
            if plan is None or plan is _DURABLE or plan.__class__ is _Checked:
                break
            count += 1
            bytes_in += size
            until -= 1
            message = Message(topic, payload, None, f"{prefix}{next(serial)}")
            sent = 0
            for session, sub_id in plan:
                sent += session.deliver(message, sub_id)
            delivered += sent
            bytes_out += sent * size
            i += 1
        if i > start:
            self._until_sample = until
            counters.messages_in = count
            counters.bytes_in += bytes_in
            counters.messages_out += delivered
            counters.bytes_out += bytes_out
            counters.messages_unrouted += unrouted
        return i

    def publish_message(
        self, message: Message, publisher_msg_id: str | None = None
    ) -> DurableWork | None:
        """``publish`` for a message a front end built itself (MQTT: with its QoS, expiry,
        origin and properties; ``message.retain`` makes it its topic's retained message);
        ``publisher_msg_id`` is the publisher's id, for the duplicate filter, if it gave
        one."""
        counters = self.counters
        if publisher_msg_id is not None and self._recent_ids.seen(publisher_msg_id):
            counters.duplicates_dropped += 1
            return None
        counters.messages_in += 1
        counters.bytes_in += message.size
        peering = self.peering
        dests = peering.wanting(message.topic) if peering.active else frozenset()
        work = self._route(
            message.topic,
            message.payload,
            message.headers,
            message.msg_id,
            publisher_msg_id,
            message,
            remote=bool(dests),
        )  # (raises QuotaExceeded before anything is retained)
        if dests:
            peering.forward(message, publisher_msg_id is not None, dests, 1, self.server_id)
        if not message.retain:
            return work
        self.retained.update(
            message.topic, message.payload, message.headers, message.msg_id, like=message
        )
        if self.store is None:
            return None
        if work is None:
            work = DurableWork(message, [], publisher_msg_id)
        work.retain = True
        return work

    def retained_matching(self, flt: routing.Filter) -> list[Message]:
        """The retained messages ``flt`` matches (flagged ``retain`` and ``from_retained``;
        the same objects for every subscriber, so their encoding is made once)."""
        return self.retained.matching(flt)

    async def deliver_retained(self, session: Session, sub_id: int, flt: routing.Filter) -> int:
        """Queue to ``session`` the retained messages ``flt`` matches, for its subscription
        ``sub_id``; how many were queued.

        A durable session gets them like routed messages: a seq each and a stored delivery
        (so they come again until acked). A transient one gets ``deliver_retained_nowait``.
        A shared group gets none (MQTT's rule for ``$share``).
        """
        if session.shared:
            return 0
        if not session.durable or self.store is None:
            return self.deliver_retained_nowait(session, sub_id, flt)
        config = self.config
        counters = self.counters
        sent = 0
        for message in self.retained.matching(flt):
            if not self._acl_allows(session, message.topic):
                continue
            if config.overflow == "reject-publish" and session.would_overflow(
                message.size, config.session_max_messages, config.session_max_bytes
            ):
                break  # full: the rest are not sent (as publishes would be refused)
            session.deliver(message, sub_id)
            seq = session.seq
            session.track(seq, message.size, trio.current_time())
            through, dropped = session.trim_to(
                config.session_max_messages, config.session_max_bytes
            )
            trims = None
            if dropped:
                counters.quota_dropped += dropped
                trims = [(session, through)]
            # Queued before the next seq is assigned: the store sees a session's seqs in order.
            await self.persist(DurableWork(message, [(session, seq)], None, trims))
            sent += 1
        counters.retained_sent += sent
        return sent

    def deliver_retained_nowait(self, session: Session, sub_id: int, flt: routing.Filter) -> int:
        """``deliver_retained`` for a transient session, without waiting: each message is
        queued as a routed one is (dropped, and counted, when the queue is full)."""
        if session.shared:
            return 0
        sent = 0
        for message in self.retained.matching(flt):
            if self._acl_allows(session, message.topic):
                sent += session.deliver(message, sub_id)
        self.counters.retained_sent += sent
        return sent

    def seen_msg_id(self, msg_id: str) -> bool:
        """True if a publisher's ``msg_id`` was routed lately (the duplicate filter)."""
        return self._recent_ids.seen(msg_id)

    def route_local(self, message: Message, publisher_msg_id: str | None) -> DurableWork | None:
        """Deliver an event a peer forwarded to the sessions here (it was counted there)."""
        self.counters.messages_in += 1
        self.counters.bytes_in += message.size
        return self._route(
            message.topic,
            message.payload,
            message.headers,
            message.msg_id,
            publisher_msg_id,
            message,
        )

    def _route(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        msg_id: str | None,
        publisher_msg_id: str | None,
        message: Message | None = None,
        remote: bool = False,
        targets: frozenset | None = None,
    ) -> DurableWork | None:
        """Deliver to the sessions that want ``topic`` (``targets``, when the caller matched
        it already); ``publish`` inlines the common case."""
        counters = self.counters
        if targets is None:
            targets = self.table.match(topic)
        if counters.messages_in >= self.hot.next_at:  # a sample, now and then (hot.py)
            self.hot.sample(topic, targets, counters.messages_in)
        if not targets:
            if not remote:
                counters.messages_unrouted += 1
            return None
        plan = self._plans.get(targets)
        if plan is None:
            plan = self._plan(targets)
        if plan is not _DURABLE:  # transient sessions only: nothing for the store
            if message is None:
                if not msg_id:
                    msg_id = f"{self._id_prefix}{next(self._msg_counter)}"
                message = Message(topic, payload, headers, msg_id)
            self._until_sample -= 1
            if not self._until_sample:
                self._sample(message)
            delivered = 0
            if plan.__class__ is _Checked:
                for denies, entries in plan.groups:  # type: ignore[union-attr]
                    if denies is not None and denies(topic):
                        counters.acl_denied_deliveries += len(entries)
                        continue
                    for session, sub_id in entries:
                        delivered += session.deliver(message, sub_id)
            else:
                for session, sub_id in plan:
                    delivered += session.deliver(message, sub_id)
            counters.messages_out += delivered
            counters.bytes_out += delivered * message.size
            return None
        sessions = _sessions(targets)
        if self.policy is not None:  # deny-subscribe rules: those sessions do not get it
            sessions = {s: i for s, i in sessions.items() if self._acl_allows(s, topic)}
            if not sessions:
                return None
        config = self.config
        size = len(payload)
        if config.overflow == "reject-publish":
            for session in sessions:
                if session.durable and session.would_overflow(
                    size, config.session_max_messages, config.session_max_bytes
                ):
                    counters.quota_rejected += 1
                    if publisher_msg_id is not None:  # a retry must not count as a repeat
                        self._recent_ids.forget(publisher_msg_id)
                    raise QuotaExceeded(
                        f"durable session {session.client_id!r} is full "
                        f"({session.backlog_messages} messages, {session.backlog_bytes} bytes "
                        "pending)"
                    )
        if message is None:
            message = Message(topic, payload, headers, msg_id or self.next_msg_id())
        self._until_sample -= 1
        if not self._until_sample:
            self._sample(message)
        delivered = 0
        durable: list[tuple[Session, int]] | None = None
        trims: list[tuple[Session, int]] | None = None
        now = 0.0
        for session, sub_id in sessions.items():
            delivered += session.deliver(message, sub_id)
            if session.durable:
                if durable is None:
                    durable = []
                    now = trio.current_time()
                durable.append((session, session.seq))
                if session.shared:
                    continue  # quotas are per ordinary session (groups ack out of order)
                session.track(session.seq, size, now)
                through, dropped = session.trim_to(
                    config.session_max_messages, config.session_max_bytes
                )
                if dropped:
                    counters.quota_dropped += dropped
                    if trims is None:
                        trims = []
                    trims.append((session, through))
        counters.messages_out += delivered
        counters.bytes_out += delivered * message.size
        if durable is None or self.store is None:
            return None
        return DurableWork(message, durable, publisher_msg_id, trims)

    def _plan(self, targets: frozenset) -> Any:
        """The delivery plan of a match answer (see ``_plans``), made and kept."""
        sessions = _sessions(targets)
        plan = _DURABLE
        if not any(session.durable for session in sessions):
            plan = tuple(sessions.items())
            if any(s.acl is not None and s.acl.has_denies for s in sessions):
                groups: dict[Any, list[tuple[Session, int]]] = {}
                for entry in plan:
                    acl = entry[0].acl
                    groups.setdefault(acl.denials if acl is not None else None, []).append(entry)
                plan = _Checked(
                    tuple(
                        (None if denials is None else denials.denies, tuple(entries))
                        for denials, entries in groups.items()
                    )
                )
        plans = self._plans
        if len(plans) >= PLANS_MAX:
            plans.clear()
        plans[targets] = plan
        return plan

    def _sample(self, message: Message) -> None:
        """Stamp ``message`` for the latency histogram (one routed in ``latency_sample_every``)."""
        self._until_sample = self.latency_sample_every
        message.routed_at = trio.current_time()

    # -- operators -----------------------------------------------------------------------

    def routes_info(self) -> dict[str, Any]:
        """The route table as this broker sees it (``topiary routes``)."""
        return self.peering.describe()

    @property
    def uptime(self) -> float:
        """Seconds since this broker started."""
        return time.time() - self.started

    def worst_dropping(self, count: int = WORST_DROPPING) -> list[dict[str, Any]]:
        """The connected sessions that dropped most messages (full queues), worst first:
        who reads too slowly."""
        worst = heapq.nlargest(
            count,
            (s for s in self.sessions.values() if s.dropped),
            key=lambda s: s.dropped,
        )
        return [{"client": s.client_id, "dropped": s.dropped, "queued": s.queued} for s in worst]

    def stats(self) -> dict[str, Any]:
        table = self.table.statistics()
        snapshot = self.counters.snapshot()
        snapshot.update(
            {
                "server_id": self.server_id,
                "uptime_seconds": round(time.time() - self.started, 3),
                "connections": len(self.connections),
                "durable_sessions": len(self.durable),
                "subscriptions": sum(len(s.subs) for s in self.sessions.values()),
                "table": {
                    "entries": table.subscriptions,
                    "filters": table.filters,
                    "trie_nodes": table.trie_nodes,
                    "cache_entries": table.cache_entries,
                    "cache_hits": table.cache_hits,
                    "cache_misses": table.cache_misses,
                },
                "queued": sum(s.queued for s in self.sessions.values()),
                "worst_dropping": self.worst_dropping(),
                "retained_messages": len(self.retained),
                "retained_bytes": self.retained.bytes,
            }
        )
        if self.peering.active:
            snapshot["peering"] = self.peering.stats()
        for name, frontend in self.frontends.items():
            snapshot[name] = frontend.stats()
        if self.store is not None:
            store = self.store.statistics()
            snapshot["store"] = {
                "batches": store.batches_committed,
                "operations": store.operations,
                "operations_failed": store.operations_failed,
                "mean_batch": round(store.mean_batch_size, 2),
                "max_batch": store.max_batch_size,
                "last_commit_ms": round(store.last_commit_ms, 3),
                "queued": store.queued_operations,
                "db_bytes": store.db_size_bytes,
                "messages": store.messages,
                "deliveries": store.deliveries,
            }
            replication = self.store.replication_statistics()
            if replication is not None:
                snapshot["ha"] = {"role": "primary", **replication}
                if self.ha_statistics is not None:
                    snapshot["ha"].update(self.ha_statistics())
        return snapshot


def _sessions(targets: frozenset) -> dict[Session, int]:
    """Session -> the sub id its MSG names, for the subscriptions in a match answer (a
    session holding several matching filters gets the message once)."""
    sessions: dict[Session, int] = {}  # (sessions hash by identity: no tuple, no id())
    for ref in targets:
        session = ref.session
        if session not in sessions:
            sessions[session] = ref.sub_id
    return sessions


__all__ = ["Broker", "DurableWork", "QuotaExceeded", "RecentIds"]
