"""The operators' documents stay true: the Grafana dashboard and the alert rules use only
metrics the broker exposes, and every metric a scrape shows is documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from broker.client import connect
from tests.conftest import running_broker
from tests.test_http import get, http_address

DOCS = Path(__file__).resolve().parent.parent / "docs"
NAME = re.compile(r"\btopiary_[a-z0-9_]+")
SUFFIXES = ("_bucket", "_count", "_sum")


def documented() -> set[str]:
    """The metric names in the tables of docs/operations.md."""
    return set(
        re.findall(r"^\| `(topiary_[a-z0-9_]+)` \|", (DOCS / "operations.md").read_text(), re.M)
    )


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in documented():
            return name.removesuffix(suffix)
    return name


def test_the_grafana_dashboard_uses_only_documented_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    used = {
        family(name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in NAME.findall(target["expr"])
    }
    assert used, "the dashboard queries no topiary metric"
    assert used - documented() == set()


def test_the_alert_rules_use_only_documented_metrics() -> None:
    used = {family(name) for name in NAME.findall((DOCS / "prometheus-alerts.yml").read_text())}
    assert used
    assert used - documented() == set()


async def test_every_metric_a_scrape_shows_is_documented(tmp_path: Path) -> None:
    async with running_broker(
        http_listen="127.0.0.1:0", data_dir=str(tmp_path), mqtt_listen="127.0.0.1:0"
    ) as server:
        async with connect(server.addresses[0], client_id="d", durable=True) as client:
            async with client.subscribe("o/>") as sub:
                await client.publish("o/1", b"x", confirm=True)
                await sub.get()
        status, body = await get(http_address(server), "/metrics")
    assert status == 200
    shown = {metric.name for metric in text_string_to_metric_families(body.decode())}
    # The parser reports a counter without its _total suffix.
    names = {name if name + "_total" not in documented() else name + "_total" for name in shown}
    assert names - documented() == set()
