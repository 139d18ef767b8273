"""Bridges report to the broker: ``$SYS/bridges/<id>`` -> the broker's last-report store ->
/api/dashboard's ``economy.bridge``.

The store alone; the defensive parsing; a real broker fed by a plain publisher (good and
malformed reports); and a real bridge on Tansu whose report arrives with the right counts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from bridges.config import REPORTS_PREFIX as BRIDGE_REPORTS_PREFIX
from bridges.config import bridge_config_from_dict
from bridges.tansu import Tansu
from broker.client import Client, connect
from broker.config import ConfigError
from broker.core import Counters, Message, OutboundLimits
from broker.core.reports import REPORTS_FILTER, REPORTS_PREFIX, Report, Reports
from broker.http.api import bridge_reports, dashboard_snapshot, parse_report
from tests.bridgekit import beacon, bridge_config, config_dict, json_values, produce, running_bridge
from tests.conftest import running_broker
from tests.test_dashboard import http_get

GOOD = {
    "bridge_id": "x",
    "source_topic": "beacons",
    "time": 1700000000.0,
    "records_in": 30,
    "unwanted_dropped": 18,
    "malformed": 2,
    "wanted": 10,
    "published": 10,
    "moved_per_wanted": 1.0,
    "read_per_wanted": 3.0,
}


def _message(topic: str, payload: bytes) -> Message:
    return Message(topic, payload, None, "m")


# -- the store ---------------------------------------------------------------------------------


def test_the_store_keeps_the_last_report_per_topic_bounded_oldest_dropped() -> None:
    reports = Reports(OutboundLimits(), Counters(), capacity=3, max_bytes=10)
    for topic in ("$SYS/bridges/a", "$SYS/bridges/b", "$SYS/bridges/c"):
        assert reports.deliver(_message(topic, b"1"), 1) is True
    assert reports.deliver(_message("$SYS/bridges/a", b"2"), 1)  # a is now the newest
    reports.deliver(_message("$SYS/bridges/d", b"3"), 1)  # b reported longest ago: dropped
    reports.deliver(_message("$SYS/bridges/e", b"x" * 11), 1)  # too large: size only
    kept = {r.topic: (r.payload, r.size) for r in reports.reports()}
    assert kept == {
        "$SYS/bridges/a": (b"2", 1),
        "$SYS/bridges/d": (b"3", 1),
        "$SYS/bridges/e": (None, 11),
    }
    assert (reports.received, reports.evicted) == (6, 2)
    assert reports.queued == 0 and reports.dropped == 0  # it never queues
    for i in range(1_000):
        reports.deliver(_message(f"$SYS/bridges/n{i}", b"{}"), 1)
    assert len(reports.last) == 3


def test_the_bridges_report_where_the_broker_listens() -> None:
    assert BRIDGE_REPORTS_PREFIX == REPORTS_PREFIX
    assert REPORTS_FILTER.removesuffix(">") == REPORTS_PREFIX


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[1, 2]", "not a JSON object but list"),
        (b"[" * 100_000, "not JSON"),
        (json.dumps({**GOOD, "wanted": -1}).encode(), "wanted must be a non-negative integer"),
        (json.dumps({**GOOD, "published": "10"}).encode(), "published must be"),
        (json.dumps({**GOOD, "records_in": True}).encode(), "records_in must be"),
        (b'{"records_in": 1e999}', "records_in must be"),
        (json.dumps({**GOOD, "read_per_wanted": "x"}).encode(), "read_per_wanted must be"),
        (json.dumps(GOOD).replace("3.0", "NaN").encode(), "read_per_wanted must be"),
        (json.dumps({**GOOD, "bridge_id": 7}).encode(), "bridge_id must be a string"),
        (json.dumps({**GOOD, "time": "now"}).encode(), "time must be a number"),
        (None, "too large to keep"),
    ],
)
def test_a_malformed_report_is_shown_as_malformed(payload: bytes | None, problem: str) -> None:
    with pytest.raises(ValueError, match="^" + problem):
        parse_report(payload)
    [entry] = bridge_reports([Report("$SYS/bridges/bad", payload, 3, 100.0)], now=101.0)
    assert entry["problem"].startswith(problem) and "records_in" not in entry
    assert (entry["bridge"], entry["age_seconds"]) == ("bad", 1.0)
    json.dumps(entry)  # the endpoint can always serialise it


def test_a_good_report_keeps_its_figures_and_null_ratios() -> None:
    figures = parse_report(json.dumps({**GOOD, "moved_per_wanted": None, "extra": 1}).encode())
    assert figures["moved_per_wanted"] is None and figures["read_per_wanted"] == 3.0
    assert (figures["records_in"], figures["wanted"], figures["source_topic"]) == (
        30,
        10,
        "beacons",
    )
    assert "extra" not in figures


# -- a real broker -----------------------------------------------------------------------------


async def test_reports_published_to_the_broker_show_up_in_the_dashboard_data() -> None:
    async with running_broker(http_listen="127.0.0.1:0") as server:
        assert server.http is not None
        broker = server.broker
        before = broker.stats()
        assert before["subscriptions"] == 0 and before["table"]["entries"] == 1  # its own
        assert broker.sessions_info() == [] and dashboard_snapshot(broker)["subscriptions"] == 0
        async with connect(server.addresses[0]) as publisher:
            await publisher.publish("$SYS/bridges/x", json.dumps(GOOD), confirm=True)
            await publisher.publish("$SYS/bridges/bad", b"\x00 not a report", confirm=True)
            async with publisher.subscribe(">") as sub:  # a wildcard-first filter: no $SYS
                await publisher.publish("$SYS/bridges/x", json.dumps(GOOD), confirm=True)
                await publisher.publish("plain", b"p", confirm=True)
                assert (await sub.get()).topic == "plain"
            assert (await publisher.stats())["subscriptions"] == 0
        head, body = await http_get(server.http.addresses[0], "/api/dashboard")
    assert head.startswith("HTTP/1.1 200")
    data = json.loads(body)
    assert data["subscriptions"] == 0
    bad, good = data["economy"]["bridge"]
    assert bad["bridge"] == "bad" and bad["problem"].startswith("not JSON")
    assert (good["bridge"], good["problem"]) == ("x", None)
    assert {key: good[key] for key in GOOD} == GOOD
    assert 0 <= good["age_seconds"] < 5


async def test_publish_nowait_skips_rather_than_waits() -> None:
    async with running_broker() as server:
        client = Client(server.addresses[0], client_id=None, credentials=None, keepalive=5.0,
                        reconnect=False, backoff=(0.1, 1.0))  # fmt: skip
        assert client.publish_nowait("$SYS/bridges/x", b"{}") is False  # not connected
        async with connect(server.addresses[0]) as connected:
            assert connected.publish_nowait("$SYS/bridges/x", json.dumps(GOOD).encode())
            await connected.ping()  # the broker has read what came before
        [report] = server.broker.reports.reports()
    assert json.loads(report.payload or b"") == GOOD


# -- a real bridge -----------------------------------------------------------------------------


def test_report_settings_are_checked_and_the_id_is_one_level() -> None:
    document = config_dict("k:9092", "127.0.0.1:7474", "t", group="g/$x*")
    config = bridge_config_from_dict(document)
    assert config.report_interval == 0  # bridgekit turns reports off
    assert (config.report_id, config.report_topic) == ("g/$x*", "$SYS/bridges/g%2F$x%2A")
    document["broker"] |= {"bridge_id": "$eu", "report_interval": 2}
    config = bridge_config_from_dict(document)
    assert (config.report_topic, config.report_interval) == ("$SYS/bridges/%24eu", 2.0)
    for bad, match in [
        ({"report_interval": -1}, r"report_interval must be in \[0, 86400\]"),
        ({"report_interval": float("inf")}, "report_interval must be in"),
        ({"report_interval": "5"}, "report_interval must be int or float"),
        ({"bridge_id": " "}, "bridge_id must not be empty"),
        ({"bridge_id": "x" * 300}, "bridge_id"),
    ]:
        with pytest.raises(ConfigError, match=match):
            bridge_config_from_dict({**document, "broker": {**document["broker"], **bad}})
    del document["broker"]["report_interval"]
    assert bridge_config_from_dict(document).report_interval == 5.0  # on by default


N = 300  # beacons; region cycles eu, us, ap, so a third are wanted
MALFORMED = 12


async def test_a_bridge_reports_its_counts_to_the_broker(tansu: Tansu, topic_name: str) -> None:
    tansu.create_topic(topic_name, 2)
    tansu.create_topic(f"{topic_name}.dlq", 1)
    records = [beacon(i) for i in range(N)]
    wanted = sum(r["region"] == "eu" for r in records)
    values = [*json_values(records), *(b"{broken %d" % i for i in range(MALFORMED))]
    await trio.to_thread.run_sync(lambda: produce(tansu, topic_name, values))

    async with running_broker(http_listen="127.0.0.1:0") as server:
        assert server.http is not None
        host, port = server.addresses[0]
        async with connect(server.addresses[0]) as client, client.subscribe("beacon/eu/>"):
            broker = {"bridge_id": "eu/beacons", "report_interval": 0.2}
            config = bridge_config(tansu, f"{host}:{port}", topic_name, broker=broker)
            async with running_bridge(config) as bridge:
                report: dict[str, Any] = {}

                def complete() -> bool:
                    return (
                        report.get("published") == wanted and report.get("malformed") == MALFORMED
                    )

                with trio.fail_after(30):  # bounded polling on the dashboard data itself
                    while not complete():
                        _head, body = await http_get(server.http.addresses[0], "/api/dashboard")
                        reports = json.loads(body)["economy"]["bridge"] or []
                        report = next((r for r in reports if r["bridge"] == "eu%2Fbeacons"), {})
                        await trio.sleep(0.1)
                assert bridge.reports_sent >= 1
    assert report["problem"] is None and report["malformed"] == MALFORMED
    assert report["bridge_id"] == "eu/beacons" and report["source_topic"] == topic_name
    assert report["records_in"] == N + MALFORMED
    assert report["unwanted_dropped"] == N - wanted
    assert report["wanted"] == wanted
    assert report["moved_per_wanted"] == 1.0
    assert report["read_per_wanted"] == pytest.approx((N + MALFORMED) / wanted)


# -- the page ----------------------------------------------------------------------------------


async def test_the_page_shows_each_bridges_economy_and_a_malformed_report() -> None:
    from tests.test_dashboard import WAIT_SECONDS, _start_browser

    script = """
        const row = (id) => document.querySelector(`#bridges tr[data-bridge="${id}"]`);
        const good = row("x"), bad = row("bad");
        return JSON.stringify({
            read: good ? good.querySelector("td.read-per-wanted").textContent : null,
            moved: good ? good.querySelector("td.moved-per-wanted").textContent : null,
            problem: bad ? bad.querySelector("td.problem").textContent : null,
        });
    """
    async with running_broker(http_listen="127.0.0.1:0") as server:
        assert server.http is not None
        host, port = server.http.addresses[0]
        async with connect(server.addresses[0]) as publisher:
            await publisher.publish("$SYS/bridges/x", json.dumps(GOOD), confirm=True)
            await publisher.publish("$SYS/bridges/bad", b"{", confirm=True)

        def browse() -> dict[str, Any]:
            from selenium.webdriver.support.ui import WebDriverWait

            driver = _start_browser()
            try:
                driver.get(f"http://{host}:{port}/")
                wait = WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.2)
                return wait.until(
                    lambda d: (r := json.loads(d.execute_script(script)))["read"] and r
                )
            finally:
                driver.quit()

        with trio.fail_after(30):
            shown = await trio.to_thread.run_sync(browse)
    assert (shown["read"], shown["moved"]) == ("3.000", "1.000")
    assert shown["problem"].startswith("malformed report: not JSON")
