"""``/api/dashboard``: what the dashboard page shows, as one JSON document.

Counters are cumulative; the page turns two successive readings into rates. Everything a
large broker could have many of is bounded: the busiest sessions by pending messages (the
rest summed in ``others``), the busiest topics and filters (sampled, broker/core/hot.py),
the mesh's origins without their filter lists, the bridges' last reports (at most
``broker.core.reports.MAX_REPORTS``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import trio

from broker.core import Broker
from broker.core.reports import REPORTS_PREFIX, Report

#: Sessions listed by name; the others are summed.
TOP_SESSIONS = 20
#: Topics and filters listed.
TOP_HOT = 10
#: A bridge report's counts (docs/bridge.md), each a non-negative integer.
REPORT_COUNTS = ("records_in", "unwanted_dropped", "malformed", "wanted", "published")
#: A bridge report's ratios: a non-negative number, or null until a record is wanted.
REPORT_RATIOS = ("moved_per_wanted", "read_per_wanted")
#: Counters the page shows as rates (cumulative here).
RATE_COUNTERS = (
    "messages_in",
    "messages_out",
    "messages_unrouted",
    "bytes_in",
    "bytes_out",
    "dropped",
    "duplicates_dropped",
    "quota_dropped",
    "messages_replayed",
    "connections_total",
)


def dashboard_snapshot(broker: Broker) -> dict[str, Any]:
    """One reading of everything the dashboard shows."""
    snapshot = broker.counters.snapshot()
    sessions = [*broker.sessions.values(), *broker.durable.values()]
    return {
        "server_id": broker.server_id,
        "time": time.time(),
        "uptime_seconds": round(broker.uptime, 3),
        "counters": {name: snapshot[name] for name in RATE_COUNTERS},
        "connections": len(broker.connections),
        # the table's entries but the broker's own (its bridge reports' subscriber)
        "subscriptions": broker.table.statistics().subscriptions - len(broker.reports.refs),
        "queued": sum(s.queued for s in sessions),
        "hot": broker.hot.describe(TOP_HOT),
        "sessions": with_ages(broker, sessions_summary(broker.sessions_info())),
        "mesh": mesh_summary(broker),
        "economy": economy(snapshot, bridge_reports(broker.reports.reports())),
        "store": _store(broker),
    }


def sessions_summary(info: list[dict[str, Any]], top: int = TOP_SESSIONS) -> dict[str, Any]:
    """Durable sessions and groups, the ``top`` with most pending first, filters counted
    rather than listed; the others summed."""
    ranked = sorted(info, key=lambda s: (-s.get("pending", 0), s["client_id"]))
    listed = [
        {key: value for key, value in session.items() if key != "filters"}
        | {"filters": len(session.get("filters", ()))}
        for session in ranked[:top]
    ]
    rest = ranked[top:]
    return {
        "count": len(info),
        "connected": sum(1 for s in info if s.get("connected")),
        "pending": sum(s.get("pending", 0) for s in info),
        "listed": listed,
        "others": {
            "count": len(rest),
            "pending": sum(s.get("pending", 0) for s in rest),
            "pending_bytes": sum(s.get("pending_bytes", 0) for s in rest),
        },
    }


def with_ages(broker: Broker, summary: dict[str, Any]) -> dict[str, Any]:
    """Add ``oldest_pending_age_seconds`` to the listed sessions whose core session knows
    when its oldest unacked message was routed (``oldest_pending_at``, trio time)."""
    now = trio.current_time()
    for listed in summary["listed"]:
        session = broker.durable.get(listed["client_id"])
        at = getattr(session, "oldest_pending_at", None)  # per-session lag, where kept
        if "oldest_pending_age_seconds" not in listed and isinstance(at, float):
            listed["oldest_pending_age_seconds"] = round(max(0.0, now - at), 3)
    return summary


def mesh_summary(broker: Broker) -> dict[str, Any]:
    """The peer mesh as this broker sees it: its links and every origin it knows, with
    neighbours and distance (not the filters)."""
    peering = broker.peering
    if not peering.active:
        return {"active": False}
    described = peering.describe()
    origins = {
        origin: {key: value for key, value in entry.items() if key != "filters"}
        for origin, entry in described.get("origins", {}).items()
    }
    stats = peering.stats()
    return {
        "active": True,
        "broker_id": described.get("broker_id", broker.server_id),
        "links": described.get("links", {}),
        "origins": origins,
        "reachable": stats.get("reachable"),
        "remote_filters": stats.get("remote_filters"),
        "counters": described.get("counters", {}),
    }


def economy(
    snapshot: dict[str, Any], bridges: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Messages moved per message wanted, as far as the broker can tell.

    A message published here that no subscriber (nor peer) wanted was moved for nothing:
    ``moved_per_wanted`` is published / (published - unrouted), 1.0 when everything was
    wanted. ``deliveries_per_message`` is the fan-out. ``bridge``: the Kafka bridges' last
    reports (``bridge_reports``), None when none has reported to this broker.
    """
    published = snapshot["messages_in"]
    unrouted = snapshot["messages_unrouted"]
    wanted = published - unrouted
    return {
        "published": published,
        "unrouted": unrouted,
        "wanted": wanted,
        "delivered": snapshot["messages_out"],
        "moved_per_wanted": published / wanted if wanted > 0 else None,
        "deliveries_per_message": snapshot["messages_out"] / published if published else None,
        "bridge": bridges or None,
    }


def bridge_reports(reports: list[Report], now: float | None = None) -> list[dict[str, Any]]:
    """Each bridge's last report as the page shows it: ``bridge`` (the topic's last level),
    ``age_seconds``, ``bytes``, and either ``problem: None`` with the report's figures or
    ``problem``: what is wrong with it (a malformed report). Never raises, whatever the
    payload."""
    now = time.time() if now is None else now
    out = []
    for report in reports:
        entry: dict[str, Any] = {
            "bridge": report.topic.removeprefix(REPORTS_PREFIX),
            "topic": report.topic,
            "age_seconds": round(max(0.0, now - report.received), 3),
            "bytes": report.size,
        }
        try:
            entry |= {"problem": None, **parse_report(report.payload)}
        except ValueError as exc:
            entry["problem"] = str(exc)
        out.append(entry)
    return out


def parse_report(payload: bytes | None) -> dict[str, Any]:
    """The figures of one bridge report (docs/bridge.md); ValueError saying what is wrong."""
    if payload is None:
        raise ValueError("too large to keep")
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"not JSON: {str(exc)[:100]}") from None
    if not isinstance(document, dict):
        raise ValueError(f"not a JSON object but {type(document).__name__}")
    figures: dict[str, Any] = {}
    for key in REPORT_COUNTS:
        value = document.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be a non-negative integer, got {value!r}"[:160])
        figures[key] = value
    for key in REPORT_RATIOS:
        value = document.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(f"{key} must be a non-negative number or null, got {value!r}"[:160])
        figures[key] = value
    for key in ("source_topic", "bridge_id"):
        value = document.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {type(value).__name__}")
        figures[key] = value[:250] if isinstance(value, str) else None
    at = document.get("time")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int | float)):
        raise ValueError(f"time must be a number, got {type(at).__name__}")
    figures["time"] = at if at is None or math.isfinite(at) else None
    return figures


def _store(broker: Broker) -> dict[str, Any] | None:
    if broker.store is None:
        return None
    stats = broker.store.statistics()
    return {
        "queued": stats.queued_operations,
        "last_commit_ms": round(stats.last_commit_ms, 3),
        "mean_batch": round(stats.mean_batch_size, 2),
        "messages": stats.messages,
        "deliveries": stats.deliveries,
        "db_bytes": stats.db_size_bytes,
    }


__all__ = [
    "bridge_reports",
    "dashboard_snapshot",
    "economy",
    "mesh_summary",
    "parse_report",
    "sessions_summary",
    "with_ages",
]
