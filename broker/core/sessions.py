"""The session registry: who is connected, who is remembered, and take-over rules.

Transient sessions are keyed by client id (a repeated or missing id gets a distinct
key); durable sessions and shared groups by their store id, created in the store
on first use and restored from it at start-up. The router owns the subscription
table: the registry never routes, and it hands restored filters back to the
router to subscribe.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from functools import partial
from typing import Any

import trio

from broker.config import BrokerConfig
from broker.core.counters import Counters
from broker.core.extra import apply_extra
from broker.core.groups import Group, group_session_id
from broker.core.message import Message
from broker.core.session import OutboundLimits, Session
from broker.security.identity import Identity
from broker.store import SessionRecord, Store, StoreError

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    digits = []
    while True:
        n, r = divmod(n, 36)
        digits.append(_ALPHABET[r])
        if not n:
            return "".join(reversed(digits))


def _forget_delivery(store: Store, client_id: str, seq: int) -> None:
    """Acknowledge one delivery of a group in the store, without waiting: a message no
    member may have (topic ACLs). With the store's queue full it stays stored, and after
    a restart it is denied (and settled) again."""
    with contextlib.suppress(trio.WouldBlock, StoreError):
        store.ack_one_nowait(client_id, seq)


def run_prefix() -> str:
    """A prefix unique to this broker run (its start in ms, base 36), short to send: the ids
    the broker assigns (message ids, anonymous client ids) never repeat across restarts."""
    return f"{_base36(time.time_ns() // 1_000_000)}-"


class NotOwner(Exception):
    """A durable session that belongs to another identity: it may not be opened or dropped."""

    def __init__(self, client_id: str) -> None:
        super().__init__(f"durable session {client_id!r} belongs to another identity")


def may_own(session: Session, owner: str | None) -> bool:
    """Whether ``owner`` may open or drop ``session``: its owner, or anyone when it has none
    (a shared group, or a session stored before owners existed); ``owner`` None skips the
    check (the broker's own calls)."""
    return owner is None or session.owner is None or session.owner == owner


class SessionRegistry:
    """Every session a broker has: transient by key, durable by client id, groups by name."""

    def __init__(
        self,
        config: BrokerConfig,
        store: Store | None,
        limits: OutboundLimits,
        counters: Counters,
        id_prefix: str,
    ) -> None:
        self.config = config
        self.store = store
        self.limits = limits
        self.counters = counters
        self.sessions: dict[str, Session] = {}  # transient sessions (and group members)
        self.durable: dict[str, Session] = {}  # durable sessions and groups, by store id
        self.groups: dict[str, Group] = {}
        #: Client id (a group's: its store id) -> the options stored with its filters
        #: ((filter, dialect) -> bytes, ``Store.add_filter``), as ``restore`` read them; only
        #: sessions with some are here. A front end reads them to bring back its
        #: subscriptions' options after a restart, and may pop what it has taken over. Not
        #: kept up to date afterwards (the front end keeps its live options itself).
        self.filter_options: dict[str, dict[tuple[str, str], bytes]] = {}
        self._creating = trio.Lock()
        self._id_prefix = id_prefix
        self._client_counter = itertools.count(1)

    # -- transient -----------------------------------------------------------------------

    def open_transient(self, client_id: str | None) -> Session:
        if not client_id:
            client_id = f"anon-{self._id_prefix}{next(self._client_counter)}"
        elif client_id in self.sessions:
            # Transient sessions: the same id twice gets a distinct internal key;
            # durable sessions (with ids that must be unique) decide take-over.
            client_id = f"{client_id}#{next(self._client_counter)}"
        session = Session(client_id, self.limits, self.counters)
        self.sessions[client_id] = session
        return session

    def forget(self, session: Session) -> None:
        """A transient session (or a durable one being dropped) is gone."""
        self.sessions.pop(session.client_id, None)

    # -- durable and groups --------------------------------------------------------------

    async def open_durable(
        self, client_id: str, owner: str | None = None, cert: str | None = None
    ) -> tuple[Session, bool]:
        """The durable session ``client_id`` and whether it existed (session_present).

        A new session belongs to ``owner``; an existing one opens only for its owner
        (``NotOwner`` otherwise), and one without an owner becomes ``owner``'s. ``cert`` is
        the certificate subject the owner's connection presented (None: none): stored with
        the session when it changed, for the rules it has while away (``restore``)."""
        async with self._creating:  # two first connections at once: one session
            session = self.durable.get(client_id)
            if session is not None:
                if not may_own(session, owner):
                    raise NotOwner(client_id)
                if owner is None or session.shared:
                    return session, True
                assert self.store is not None
                if session.owner is None:
                    session.owner = await self.store.claim_session(client_id, owner)
                    if session.owner != owner:
                        raise NotOwner(client_id)
                if session.principal is None or session.principal[0].cert != cert:
                    await self.store.set_principal(client_id, cert)
                return session, True
            assert self.store is not None
            record = await self.store.create_session(client_id, None, owner, cert)
            session = self._new_durable(client_id, record.next_seq - 1, record.last_ack)
            session.owner = record.owner
            if not may_own(session, owner):  # (created meanwhile by another broker process)
                raise NotOwner(client_id)
            return session, False

    async def open_group(self, name: str) -> tuple[Group, bool]:
        """Shared group ``name`` (its durable session created if new) and whether it existed."""
        async with self._creating:  # two first members at once must not make two groups
            group = self.groups.get(name)
            if group is not None:
                return group, True
            if self.store is None:  # (MQTT's $share without a data dir: in memory only)
                return self._new_group(name, 0, 0), False
            record = await self.store.create_session(group_session_id(name), name)
            return self._new_group(name, record.next_seq - 1, record.last_ack), False

    async def restore(self) -> list[tuple[Session, tuple[tuple[str, str], ...]]]:
        """The durable sessions and groups in the store, each with its (filter, dialect)s for
        the router to subscribe again; what a group's members had not acknowledged goes back
        in its queue (with the QoS, properties and expiry stored with it). The options
        stored with the filters are left in ``filter_options``. A session whose owner the
        store knows gets it as its ``principal`` (user and certificate; no groups: the
        router takes those from the users file), for the router to authorize."""
        assert self.store is not None
        restored = []
        now = trio.current_time()  # what is pending counts as pending since the restore
        for record in await self.store.sessions():
            session: Session
            if record.group is not None:
                session = self._new_group(record.group, record.next_seq - 1, record.last_ack)
                await self._load_group_queue(session, record, now)
            else:
                session = self._new_durable(record.client_id, record.next_seq - 1, record.last_ack)
                session.owner = record.owner
                principal = record.principal
                if principal is not None:  # whose rules it has until its owner is back
                    owner = Identity(user=principal.user, cert=principal.cert)
                    session.principal = (owner, record.client_id)
                if record.pending:
                    session.track(record.next_seq - 1, record.pending_bytes, now, record.pending)
            restored.append((session, record.filters))
            if record.filter_options:
                self.filter_options[record.client_id] = dict(record.filter_options)
        return restored

    async def _load_group_queue(self, group: Group, record: SessionRecord, at: float) -> None:
        assert self.store is not None
        after = record.last_ack
        while page := await self.store.pending(record.client_id, after, 1000):
            for m in page:
                message = Message(m.topic, m.payload, m.headers, m.msg_id)
                apply_extra(message, m.extra)
                group.restored(m.seq, message, at)
            after = page[-1].seq

    def forget_group(self, group: Group) -> None:
        """A group that is being dropped (``Broker.drop_session``) is gone."""
        if self.groups.get(group.name) is group:
            del self.groups[group.name]

    def _new_durable(self, client_id: str, seq: int, last_ack: int) -> Session:
        session = Session(
            client_id, self.limits, self.counters, durable=True, seq=seq, last_ack=last_ack
        )
        self.durable[client_id] = session
        return session

    def _new_group(self, name: str, seq: int, last_ack: int) -> Group:
        group = Group(
            name, self.limits, self.counters, self.config.group_prefetch, seq=seq, last_ack=last_ack
        )
        self.durable[group.client_id] = group
        self.groups[name] = group
        store = self.store
        if store is not None:
            group.on_denied = partial(_forget_delivery, store, group.client_id)
        return group

    # -- operators -----------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """What an operator sees of each durable session (``topiary sessions``)."""
        return [
            {
                "client_id": session.client_id,
                "filters": sorted([ref.filter, ref.dialect] for ref in session.refs.values()),
                "connected": session.connection is not None,
                "last_ack": session.last_ack,
                "last_seq": session.seq,
                "pending": session.backlog_messages,
                "pending_bytes": session.backlog_bytes,
                "quota_dropped": session.quota_dropped,
                "deferred": session.deferred,  # sent from the store: queue full or away
                "owner": session.owner,  # the identity it belongs to (None: anyone's)
                **(
                    {
                        "group": session.name,
                        "members": len(session.members),
                        "queued": len(session.queue),
                        "redelivered": session.redelivered,
                    }
                    if isinstance(session, Group)
                    else {}
                ),
            }
            for session in sorted(self.durable.values(), key=lambda s: s.client_id)
        ]
