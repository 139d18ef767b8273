"""What the broker's HTTP port answers: health, readiness, metrics, stats, the dashboard.

| path | answer |
|---|---|
| ``/healthz`` | 200 while the process serves (the loop answers at all) |
| ``/readyz`` | 200 when it accepts clients (store open, configured peers linked); else 503 |
| ``/metrics`` | Prometheus text exposition (broker/http/metrics.py) |
| ``/api/stats`` | the broker's statistics as JSON (what ``topiary stats`` prints) |
| ``/api/dashboard`` | what the dashboard shows, as JSON (broker/http/api.py) |
| ``/`` | the dashboard page (and its ``/dashboard.js``, ``/dashboard.css``); polls the above |
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources

from broker.core import Broker
from broker.http.api import dashboard_snapshot
from broker.http.metrics import exposition
from broker.http.server import Request, Response, Routes, text


def readiness(broker: Broker) -> list[str]:
    """What keeps the broker from being ready; empty when it is."""
    missing = []
    if broker.config.data_dir is not None and broker.store is None:
        missing.append("store not open")
    peering = broker.peering
    configured = len(broker.config.peers)
    if configured and len(peering.stats().get("links", {})) < configured:
        missing.append("peers not all linked")
    return missing


def broker_routes(broker: Broker) -> Routes:
    """The routes of one broker's HTTP port."""

    def healthz(_request: Request) -> Response:
        return text(200, "ok\n")

    def readyz(_request: Request) -> Response:
        missing = readiness(broker)
        if missing:
            return text(503, "not ready: " + "; ".join(missing) + "\n")
        return text(200, "ready\n")

    def metrics(_request: Request) -> Response:
        body, content_type = exposition(broker)
        return Response(200, body, content_type)

    def stats(_request: Request) -> Response:
        body = json.dumps(broker.stats(), sort_keys=True).encode()
        return Response(200, body, "application/json")

    def dashboard_data(_request: Request) -> Response:
        body = json.dumps(dashboard_snapshot(broker), sort_keys=True).encode()
        return Response(200, body, "application/json", [("Cache-Control", "no-store")])

    return {
        "/healthz": healthz,
        "/readyz": readyz,
        "/metrics": metrics,
        "/api/stats": stats,
        "/api/dashboard": dashboard_data,
        **{path: static(name, kind) for path, (name, kind) in STATIC.items()},
    }


#: The page's files (package data of broker.http), by path.
STATIC = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


def static(name: str, content_type: str) -> Callable[[Request], Response]:
    """A handler that answers with the package file ``name`` (read once, now)."""
    body = resources.files("broker.http").joinpath(name).read_bytes()

    def handler(_request: Request) -> Response:
        return Response(200, body, content_type)

    return handler
