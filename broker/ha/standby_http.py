"""What a standby's HTTP port answers: it is alive, not ready, and how far behind it is.

A standby serves no clients, but its operators still scrape it: the replication lag and the
link's health are what tell them the hot spare is worth having. On the ports ``[http]
listen`` and ``[tls] listen_http`` a standby answers

| path | answer |
|---|---|
| ``/healthz`` | 200: the process answers |
| ``/readyz`` | 503 ``not ready: standby; the primary is HOST:PORT`` (load balancers skip it) |
| ``/metrics`` | its replication, door and election counters (docs/operations.md) |
| ``/api/stats`` | the same as JSON, with ``"role": "standby"`` |

anything else 404. The primary's port answers the broker's full set (broker/http/app.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from broker.ha.door import StandbyDoor
from broker.ha.elector import ELECTOR_HELP, Elector
from broker.ha.follower import Follower
from broker.http.server import Request, Response, Routes, text

__all__ = ["FOLLOWER_HELP", "standby_routes", "standby_statistics"]

#: ``FollowerCounters`` -> help, for ``topiary_ha_follower_<name>_total``.
FOLLOWER_HELP: dict[str, str] = {
    "connections": "Replication sessions with the primary that got past the handshake.",
    "link_failures": "Replication connections that failed or ended (the standby dials again).",
    "records_applied": "Replication records applied to the standby's store.",
    "commits": "Standby store transactions (each applies the records journaled meanwhile).",
    "journal_syncs": "Journal appends (one fdatasync each) acknowledged to the primary.",
    "bytes_received": "Record and snapshot bytes received from the primary.",
    "snapshots_installed": "Snapshots installed (new, lagging or diverged standby).",
    "divergences": "Records whose digest did not follow the standby's chain (a snapshot follows).",
    "damaged_rebuilt": "Standby stores that failed to open, moved aside and rebuilt.",
    "tls_failures": "Replication connections whose TLS handshake failed.",
    "store_full": "Arrivals the standby's store refused (disk full): nothing acknowledged.",
    "withdrawals": "Pending records the primary withdrew (its commit failed here): unjournaled.",
}

#: ``DoorCounters`` -> help, for ``topiary_ha_door_<name>_total``.
DOOR_HELP: dict[str, str] = {
    "refused_native": "Native clients refused with NOT_PRIMARY by this standby.",
    "refused_mqtt": "MQTT clients refused (CONNACK Use another server) by this standby.",
    "closed_other": "Connections to the standby's WebSocket or link ports, closed at once.",
}


def standby_statistics(
    follower: Follower, door: StandbyDoor, elector: Elector | None, primary: str
) -> dict[str, Any]:
    """The standby's state and counters, as ``/api/stats`` shows them."""
    heard = follower.last_contact
    since = -1.0 if heard is None else trio.current_time() - heard
    return {
        "role": "standby",
        "primary": primary,
        "seq": follower.position.seq,
        "term": follower.position.term,
        "connected": follower.connected,
        "seconds_since_contact": since,
        "follower": follower.counters.snapshot(),
        "door": {name: getattr(door.counters, name) for name in DOOR_HELP},
        "election": elector.statistics() if elector is not None else None,
    }


class _StandbyCollector:
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield GaugeMetricFamily("topiary_ha_standby", "1: this broker is the standby.", value=1)
        yield GaugeMetricFamily(
            "topiary_ha_standby_seq", "The seq of the newest record applied here.", stats["seq"]
        )
        yield GaugeMetricFamily(
            "topiary_ha_standby_connected",
            "1 while the replication link to the primary is up.",
            value=int(stats["connected"]),
        )
        yield GaugeMetricFamily(
            "topiary_ha_standby_seconds_since_contact",
            "Seconds since the primary was last heard on the link (-1: never).",
            value=stats["seconds_since_contact"],
        )
        for name, help_text in FOLLOWER_HELP.items():
            if name in stats["follower"]:
                yield CounterMetricFamily(
                    f"topiary_ha_follower_{name}", help_text, value=stats["follower"][name]
                )
        for name, help_text in DOOR_HELP.items():
            yield CounterMetricFamily(
                f"topiary_ha_door_{name}", help_text, value=stats["door"][name]
            )
        election = stats["election"] or {}
        if "ha_term" in election:
            yield GaugeMetricFamily(
                "topiary_ha_term", "The term this broker is in.", value=election["ha_term"]
            )
        for name, (kind, help_text) in ELECTOR_HELP.items():
            if name in election and election[name] is not None:
                family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                yield family(f"topiary_ha_{name}", help_text, value=election[name])


def standby_routes(
    follower: Follower, door: StandbyDoor, elector: Elector | None, primary: str
) -> Routes:
    """The routes of a standby's HTTP port (the table above)."""

    def stats() -> dict[str, Any]:
        return standby_statistics(follower, door, elector, primary)

    def healthz(_request: Request) -> Response:
        return text(200, "ok\n")

    def readyz(_request: Request) -> Response:
        return text(503, f"not ready: standby; the primary is {primary}\n")

    def metrics(_request: Request) -> Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_StandbyCollector(stats))  # type: ignore[arg-type]
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    def api_stats(_request: Request) -> Response:
        body = json.dumps(stats(), sort_keys=True, default=str).encode()
        return Response(200, body, "application/json")

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics, "/api/stats": api_stats}
