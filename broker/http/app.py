"""What the broker's HTTP port answers: health, readiness, metrics, stats, the dashboard.

| path | answer |
|---|---|
| ``/healthz`` | 200 while the process serves (the loop answers at all) |
| ``/readyz`` | 200 when it accepts clients (store open, configured peers linked); else 503 |
| ``/metrics`` | Prometheus text exposition (broker/http/metrics.py) |
| ``/api/stats`` | the broker's statistics as JSON (what ``topiary stats`` prints), for the page |
| ``/`` | the dashboard page, which polls ``/api/stats`` |
"""

from __future__ import annotations

import json
from importlib import resources

from broker.core import Broker
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

    page = resources.files("broker.http").joinpath("dashboard.html").read_bytes()

    def dashboard(_request: Request) -> Response:
        return Response(200, page, "text/html; charset=utf-8")

    return {
        "/healthz": healthz,
        "/readyz": readyz,
        "/metrics": metrics,
        "/api/stats": stats,
        "/": dashboard,
    }
