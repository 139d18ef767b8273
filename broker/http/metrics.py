"""The broker's state as Prometheus metrics, read at scrape time.

A collector, not instruments on the hot path: the broker already counts everything in
plain integers (``Counters``, the table's and the store's statistics, the peer links), so a
scrape reads them and ``prometheus_client`` writes the exposition format. Routing costs
nothing more for being scraped. All names start with ``topiary_``; docs/operations.md lists
them.

Per-session series (durable sessions and shared groups) are bounded: the ``top_sessions``
(``[http] top_sessions``) with the oldest pending message each get a series labelled with
their client id, and one series labelled ``session="other"`` adds up the rest.

The two histograms are plain bucket counts that the broker and the store keep
(``broker.histogram.Histogram``), turned into ``HistogramMetricFamily`` here: the core and
the store never import ``prometheus_client``, each broker owns its own (tests run several
in one process), and observing costs no lock.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from broker.core import Broker, Session
from broker.ha.elector import ELECTOR_HELP
from broker.ha.shipping import HELP as HA_HELP
from broker.histogram import Histogram
from broker.security.floods import LIMITS

#: The label value of the series that adds up the sessions outside the top N.
OTHER = "other"

#: Counters of ``Broker.counters``: attribute -> (metric name without _total, help).
COUNTERS: dict[str, tuple[str, str]] = {
    "connections_total": ("connections_accepted", "Connections accepted since start."),
    "connections_refused": ("connections_refused", "HELLOs refused for bad credentials."),
    "messages_in": ("messages_in", "Messages published (routed), from clients and peers."),
    "messages_out": ("messages_out", "Messages queued to sessions (one per subscriber)."),
    "messages_unrouted": ("messages_unrouted", "Published messages that matched nothing."),
    "duplicates_dropped": (
        "duplicates_dropped",
        "Publishes dropped as repeats of a recent msg_id.",
    ),
    "dropped": ("messages_dropped", "Messages dropped by flow control (a full queue)."),
    "messages_replayed": ("messages_replayed", "Messages sent from the store."),
    "quota_dropped": ("quota_dropped", "Durable messages dropped by drop-oldest quotas."),
    "quota_rejected": ("quota_rejected", "Publishes refused by reject-publish quotas."),
    "group_redelivered": (
        "group_redelivered",
        "Messages handed to another shared-group member after one left.",
    ),
    "bytes_in": ("payload_bytes_in", "Payload bytes published."),
    "bytes_out": ("payload_bytes_out", "Payload bytes queued to sessions."),
    "bytes_sent": ("bytes_sent", "Bytes written to client sockets (all frames)."),
    "slow_consumer_disconnects": (
        "slow_consumer_disconnects",
        "Connections closed as slow consumers.",
    ),
    "idle_disconnects": (
        "idle_disconnects",
        "Connections closed for silence (nothing sent, nothing read).",
    ),
    "turns_yielded": (
        "turns_yielded",
        "Times a busy connection gave way to the others (its turn was up).",
    ),
    "subscribes": ("subscribes", "Subscribe requests served."),
    "unsubscribes": ("unsubscribes", "Unsubscribe requests served."),
    "store_errors": ("store_errors", "Store writes that failed."),
    "store_full": (
        "store_full",
        "Store writes the disk refused (full, quota, file size limit): not stored, and "
        "their confirmed publishes refused (STORE_FULL, MQTT 0x97).",
    ),
    "retained_sent": (
        "retained_sent",
        "Retained messages queued to new subscriptions (from the retained store).",
    ),
    "acl_denied_publish": ("acl_denied_publish", "Publishes the topic ACLs refused."),
    "acl_denied_subscribe": (
        "acl_denied_subscribe",
        "Subscriptions the topic ACLs refused or removed.",
    ),
    "acl_denied_deliveries": (
        "acl_denied_deliveries",
        "Messages not delivered to a subscriber because a deny-subscribe rule matched.",
    ),
    "logins": ("logins", "Logins with a user name and password that were accepted."),
    "auth_failures": (
        "auth_failures",
        "Logins refused: a bad user name or password, or anonymous access when it is off.",
    ),
    "tls_handshake_failures": (
        "tls_handshake_failures",
        "TLS handshakes that failed on the TLS listeners (plain text, an old version, "
        "a missing or bad client certificate, too slow).",
    ),
}


class BrokerCollector:
    """Reads one broker's state at each scrape (``prometheus_client`` collector protocol)."""

    def __init__(self, broker: Broker, top_sessions: int | None = None) -> None:
        self.broker = broker
        self.top_sessions = (
            broker.config.http_top_sessions if top_sessions is None else top_sessions
        )

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        counters = broker.counters
        for attribute, (name, help_text) in COUNTERS.items():
            yield _counter(f"topiary_{name}", help_text, getattr(counters, attribute))
        errors = CounterMetricFamily(
            "topiary_errors", "ERROR frames sent to clients, by code.", labels=["code"]
        )
        for code, count in sorted(counters.errors.items()):
            errors.add_metric([code], count)
        yield errors
        refused = CounterMetricFamily(
            "topiary_limit_refused",
            "Connections, PUBs and subscriptions refused by a limit against floods, by limit.",
            labels=["limit"],
        )
        for limit in LIMITS:
            refused.add_metric([limit], counters.limit_refused.get(limit, 0))
        yield refused
        yield _gauge("topiary_connections", "Client connections open now.", len(broker.connections))
        yield _frontends(broker)
        yield _gauge(
            "topiary_durable_sessions",
            "Durable sessions and shared groups held.",
            len(broker.durable),
        )
        yield _gauge(
            "topiary_subscriptions",
            "Subscriptions of connected sessions.",
            sum(len(s.subs) for s in broker.sessions.values()),
        )
        yield _gauge(
            "topiary_queued_frames",
            "Frames waiting in connection queues.",
            sum(s.queued for s in broker.sessions.values()),
        )
        yield _gauge("topiary_uptime_seconds", "Seconds since the broker started.", broker.uptime)
        yield _gauge(
            "topiary_retained_messages",
            "Retained messages held (one per topic).",
            len(broker.retained),
        )
        yield _gauge(
            "topiary_retained_bytes",
            "Payload bytes of the retained messages held.",
            broker.retained.bytes,
        )
        yield _gauge("topiary_groups", "Shared groups held.", len(broker.groups))
        yield _gauge(
            "topiary_group_members",
            "Members connected to shared groups, all groups together.",
            sum(len(group.members) for group in broker.groups.values()),
        )
        yield _histogram(
            "topiary_delivery_latency_seconds",
            f"Seconds from routing a PUB to its MSG bytes handed to the socket, in the "
            f"broker; sampled: one routed message in {broker.latency_sample_every} is timed, "
            f"at each of its deliveries (messages sent from the store are not timed).",
            broker.delivery_latency,
        )
        yield from _table(broker)
        if broker.store is not None:
            yield from _store(broker)
            yield from _sessions(broker, self.top_sessions)
        if broker.peering.active:
            yield from _peering(broker.peering.stats())
        mqtt = broker.frontends.get("mqtt")
        if mqtt is not None:
            yield from _mqtt(mqtt.stats())


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _histogram(name: str, help_text: str, histogram: Histogram) -> HistogramMetricFamily:
    buckets = [(floatToGoString(bound), count) for bound, count in histogram.cumulative()]
    return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=histogram.sum)


def _frontends(broker: Broker) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "topiary_frontend_connections",
        "Client connections with an open session now, by front end.",
        labels=["frontend"],
    )
    counts = Counter(
        getattr(connection, "frontend", "unknown")
        for connection in broker.connections
        if getattr(connection, "session", None) is not None
    )
    counts.setdefault("native", 0)
    for frontend, count in sorted(counts.items()):
        family.add_metric([frontend], count)
    return family


def _sessions(broker: Broker, top: int) -> Iterator[Metric]:
    """Per durable session and shared group, the ``top`` with the oldest pending message by
    client id, the rest added up as ``session="other"``."""
    now = trio.current_time()

    def age(session: Session) -> float:
        at = session.oldest_pending_at
        return 0.0 if at is None else max(0.0, now - at)

    ranked = [(age(session), session.client_id, session) for session in broker.durable.values()]
    first = heapq.nlargest(top, ranked, key=lambda row: (row[0], row[1])) if top else []
    chosen = {id(row[2]) for row in first}
    rest = [row for row in ranked if id(row[2]) not in chosen]
    label = ["session"]
    pending = GaugeMetricFamily(
        "topiary_session_pending_messages",
        "Messages routed to a durable session or shared group and not yet acked.",
        labels=label,
    )
    oldest = GaugeMetricFamily(
        "topiary_session_oldest_pending_age_seconds",
        "Seconds since the oldest unacked message was routed (consumer lag); a backlog "
        "restored at start-up counts from the restore. For other: the largest.",
        labels=label,
    )
    delivered = CounterMetricFamily(
        "topiary_session_delivered",
        "Messages sent to the client (a group: handed to a member) since the broker started.",
        labels=label,
    )
    acked = CounterMetricFamily(
        "topiary_session_acked",
        "Messages acked since the broker started.",
        labels=label,
    )
    for lag, client_id, session in first:
        pending.add_metric([client_id], session.pending_messages)
        oldest.add_metric([client_id], lag)
        delivered.add_metric([client_id], session.delivered)
        acked.add_metric([client_id], session.acked)
    pending.add_metric([OTHER], sum(row[2].pending_messages for row in rest))
    oldest.add_metric([OTHER], max((row[0] for row in rest), default=0.0))
    delivered.add_metric([OTHER], sum(row[2].delivered for row in rest))
    acked.add_metric([OTHER], sum(row[2].acked for row in rest))
    yield pending
    yield oldest
    yield delivered
    yield acked
    yield _gauge(
        "topiary_session_other_sessions",
        'Durable sessions and groups added up in the session="other" series.',
        len(rest),
    )


def _table(broker: Broker) -> Iterator[Metric]:
    table = broker.table.statistics()
    yield _gauge("topiary_table_entries", "Subscription table entries.", table.subscriptions)
    yield _gauge("topiary_table_filters", "Distinct filters in the table.", table.filters)
    yield _gauge("topiary_table_trie_nodes", "Nodes of the subscription trie.", table.trie_nodes)
    yield _gauge("topiary_match_cache_entries", "Topics in the match cache.", table.cache_entries)
    yield _counter("topiary_match_cache_hits", "Match cache hits.", table.cache_hits)
    yield _counter("topiary_match_cache_misses", "Match cache misses.", table.cache_misses)
    yield _gauge(
        "topiary_table_subscribers", "Distinct subscribers in the table.", table.subscribers
    )
    yield _counter("topiary_table_matches", "Topics matched (cache hits and cold).", table.matches)
    yield _counter(
        "topiary_match_cache_evictions", "Match cache entries evicted.", table.cache_evictions
    )
    yield _counter(
        "topiary_match_cache_invalidated",
        "Match cache answers changed by subscription changes (patched in place or dropped).",
        table.cache_invalidated,
    )
    yield _counter("topiary_match_cache_clears", "Match cache cleared whole.", table.cache_clears)


def _store(broker: Broker) -> Iterator[Metric]:
    assert broker.store is not None
    replication = broker.store.replication_statistics()
    for name, value in (replication or {}).items():
        kind, help_text = HA_HELP[name]
        make = _counter if kind == "counter" else _gauge
        yield make(f"topiary_ha_{name}", help_text, value)
    election = broker.ha_statistics() if broker.ha_statistics is not None else {}
    for name, (kind, help_text) in ELECTOR_HELP.items():  # failover by the witness
        if name in election:
            make = _counter if kind == "counter" else _gauge
            yield make(f"topiary_ha_{name}", help_text, election[name])
    store = broker.store.statistics()
    yield _counter(
        "topiary_store_commits", "Store transactions committed.", store.batches_committed
    )
    yield _counter("topiary_store_operations", "Store operations committed.", store.operations)
    yield _counter(
        "topiary_store_operations_failed", "Store operations that failed.", store.operations_failed
    )
    yield _gauge(
        "topiary_store_last_commit_seconds",
        "Duration of the last store commit.",
        store.last_commit_ms / 1000,
    )
    yield _gauge(
        "topiary_store_queued_operations", "Operations waiting to commit.", store.queued_operations
    )
    yield _gauge("topiary_store_db_bytes", "Size of the database file.", store.db_size_bytes)
    yield _gauge("topiary_store_messages", "Messages held in the store.", store.messages)
    yield _gauge(
        "topiary_store_deliveries", "Pending deliveries held in the store.", store.deliveries
    )
    yield _gauge("topiary_store_sessions", "Durable sessions held in the store.", store.sessions)
    yield _gauge(
        "topiary_store_mean_batch_operations", "Mean operations per commit.", store.mean_batch_size
    )
    yield _gauge(
        "topiary_store_max_batch_operations", "Most operations in one commit.", store.max_batch_size
    )
    yield _gauge(
        "topiary_store_callers_waiting",
        "Callers waiting for room in the store's queue (backpressure).",
        store.callers_waiting_for_room,
    )
    yield _gauge("topiary_store_dedup_ids", "Publisher msg_ids remembered.", store.dedup_ids)
    yield _counter(
        "topiary_store_duplicates", "Appends refused as duplicates (since open).", store.duplicates
    )
    yield _histogram(
        "topiary_store_commit_duration_seconds",
        "Seconds each store batch took to commit (one observation per batch).",
        broker.store.commit_seconds,
    )


#: ``PeerCounters`` fields: name (also of the metric, after topiary_peer_) -> help.
PEER_COUNTERS: dict[str, str] = {
    "fwd_out": "FWD frames sent (one per event per next hop).",
    "fwd_in": "FWD frames received.",
    "delivered_from_peers": "Events a FWD brought for local subscribers.",
    "unreachable_dropped": "(event, destination) pairs dropped with no path.",
    "link_dropped": "FWD copies lost, all links: link down or its queue full.",
    "hop_limit_dropped": "Events dropped at the hop limit.",
    "duplicates_dropped": "Forwarded events dropped as repeats.",
    "quota_rejected": "Forwarded events refused by reject-publish quotas.",
    "links_opened": "Peer links opened.",
    "links_refused": "Peer links refused.",
    "auth_failures": "Peer links refused for their credentials (unknown id, bad secret or cert).",
    "sync_waits": "Sync SUBs that waited for every reachable broker's ack.",
    "sync_timeouts": "Sync SUBs whose wait timed out.",
    "tls_dial_failures": "Dials to tls:// peers whose TLS handshake failed (certificate, name).",
    "dials_not_primary": "Dials a pair's standby refused (NOT_PRIMARY); the next one was tried.",
}


def _peering(stats: dict[str, Any]) -> Iterator[Metric]:
    for name, help_text in PEER_COUNTERS.items():
        yield _counter(f"topiary_peer_{name}", help_text, stats[name])
    yield _gauge("topiary_peer_links", "Peer links up now.", len(stats["links"]))
    yield _gauge("topiary_peer_reachable_brokers", "Brokers reachable now.", stats["reachable"])
    yield _gauge(
        "topiary_peer_remote_filters", "Filters of all other brokers.", stats["remote_filters"]
    )
    links = {
        "fwd_out": CounterMetricFamily(
            "topiary_peer_link_fwd_out", "Events forwarded on a link.", labels=["peer"]
        ),
        "fwd_in": CounterMetricFamily(
            "topiary_peer_link_fwd_in", "Events received on a link.", labels=["peer"]
        ),
        # not topiary_peer_link_dropped: that is the all-links counter above
        "dropped": CounterMetricFamily(
            "topiary_peer_link_fwd_dropped",
            "Events dropped on a link (queue full).",
            labels=["peer"],
        ),
        "queued": GaugeMetricFamily(
            "topiary_peer_link_queued", "Frames queued on a link now.", labels=["peer"]
        ),
        "bytes_out": CounterMetricFamily(
            "topiary_peer_link_bytes_out", "Bytes written on a link.", labels=["peer"]
        ),
        "routes_out": CounterMetricFamily(
            "topiary_peer_link_routes_out", "Route updates sent on a link.", labels=["peer"]
        ),
        "routes_in": CounterMetricFamily(
            "topiary_peer_link_routes_in", "Route updates received on a link.", labels=["peer"]
        ),
        "up_seconds": GaugeMetricFamily(
            "topiary_peer_link_up_seconds", "Seconds since a link opened.", labels=["peer"]
        ),
    }
    for peer, link in stats["links"].items():
        for key, family in links.items():
            family.add_metric([peer], link[key])
    yield from links.values()


def exposition(broker: Broker) -> tuple[bytes, str]:
    """The body and content type of a scrape of ``broker``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))  # type: ignore[arg-type]
    return generate_latest(registry), CONTENT_TYPE_LATEST


#: The MQTT front end's own counters (broker.mqtt.state.FrontEndCounters): name -> help.
MQTT_COUNTERS: dict[str, str] = {
    "connections_total": "MQTT connections accepted.",
    "connect_refused": "CONNECTs refused with a CONNACK reason code (or cut off as malformed).",
    "packets_malformed": "MQTT connections closed for a malformed packet.",
    "protocol_errors": "MQTT connections closed for a protocol error.",
    "expired": "Messages not sent to an MQTT client because their expiry interval had passed.",
    "too_large_for_client": "Messages not sent: larger than the client's Maximum Packet Size.",
    "wills_published": "Will messages published.",
    "sessions_expired": "MQTT sessions ended by their Session Expiry Interval.",
    "takeovers": "MQTT connections closed because a new one took their client id.",
}


def _mqtt(stats: dict[str, Any]) -> Iterator[Metric]:
    for name, help_text in MQTT_COUNTERS.items():
        yield _counter(f"topiary_mqtt_{name.removesuffix('_total')}", help_text, stats[name])
    yield _gauge("topiary_mqtt_clients", "MQTT clients connected now.", stats["clients"])
