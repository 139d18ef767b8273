"""The broker's state as Prometheus metrics, read at scrape time.

A collector, not instruments on the hot path: the broker already counts everything in
plain integers (``Counters``, the table's and the store's statistics, the peer links), so a
scrape reads them and ``prometheus_client`` writes the exposition format. Routing costs
nothing more for being scraped. All names start with ``topiary_``; docs/operations.md lists
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from broker.core import Broker

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
    "idle_disconnects": ("idle_disconnects", "Connections closed for silence."),
    "subscribes": ("subscribes", "Subscribe requests served."),
    "unsubscribes": ("unsubscribes", "Unsubscribe requests served."),
    "store_errors": ("store_errors", "Store writes that failed."),
}


class BrokerCollector:
    """Reads one broker's state at each scrape (``prometheus_client`` collector protocol)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

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
        yield _gauge("topiary_connections", "Client connections open now.", len(broker.connections))
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
        yield from _table(broker)
        if broker.store is not None:
            yield from _store(broker)
        if broker.peering.active:
            yield from _peering(broker.peering.stats())


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _table(broker: Broker) -> Iterator[Metric]:
    table = broker.table.statistics()
    yield _gauge("topiary_table_entries", "Subscription table entries.", table.subscriptions)
    yield _gauge("topiary_table_filters", "Distinct filters in the table.", table.filters)
    yield _gauge("topiary_table_trie_nodes", "Nodes of the subscription trie.", table.trie_nodes)
    yield _gauge("topiary_match_cache_entries", "Topics in the match cache.", table.cache_entries)
    yield _counter("topiary_match_cache_hits", "Match cache hits.", table.cache_hits)
    yield _counter("topiary_match_cache_misses", "Match cache misses.", table.cache_misses)


def _store(broker: Broker) -> Iterator[Metric]:
    assert broker.store is not None
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


def _peering(stats: dict[str, Any]) -> Iterator[Metric]:
    for name in (
        "fwd_out",
        "fwd_in",
        "delivered_from_peers",
        "unreachable_dropped",
        "link_dropped",
        "hop_limit_dropped",
        "duplicates_dropped",
        "quota_rejected",
        "links_opened",
        "links_refused",
        "sync_waits",
        "sync_timeouts",
    ):
        yield _counter(f"topiary_peer_{name}", f"Peering: {name.replace('_', ' ')}.", stats[name])
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
        "dropped": CounterMetricFamily(
            "topiary_peer_link_dropped", "Events dropped on a link (queue full).", labels=["peer"]
        ),
        "queued": GaugeMetricFamily(
            "topiary_peer_link_queued", "Frames queued on a link now.", labels=["peer"]
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
