"""The broker's HTTP port for operators: metrics, health, stats and the dashboard page.

Off unless ``--http HOST:PORT`` (or ``[http] listen``) is given; served from the broker's
own trio loop by a small h11 server.
"""

from broker.http.app import broker_routes, readiness
from broker.http.server import HttpServer, Request, Response

__all__ = ["HttpServer", "Request", "Response", "broker_routes", "readiness"]
