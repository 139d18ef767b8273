"""The dashboard page in a real browser (Debian's headless Chromium driven by selenium),
against a live broker; and the sampler behind its busiest topics and filters.

The browser test is not skipped when Chromium is missing: ``make test`` installs it, and a
browser that cannot start fails the test with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from broker.client import connect
from broker.core.hot import HotCounter, HotSpots
from broker.http.api import dashboard_snapshot, sessions_summary, with_ages
from tests.conftest import running_broker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Flags that let Chromium start headless as root on a machine with no network beyond loopback.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1100",
)
SLOW_RATE = 40.0  # messages/s published until the page has shown a first reading
FAST_RATE = 160.0  # messages/s after it, so that the rate shown must change
PUBLISH_LIMIT = 2_000  # the publisher stops after this many messages ...
PUBLISH_SECONDS = 14.0  # ... or this long, whichever comes first
WAIT_SECONDS = 6.0  # each of the browser's waits


# -- the sampler -----------------------------------------------------------------------------


class _Ref:
    def __init__(self, filter: str, dialect: str = "native") -> None:
        self.filter = filter
        self.dialect = dialect


def test_a_hot_counter_stays_bounded_and_keeps_the_largest() -> None:
    counter: HotCounter[str] = HotCounter(capacity=4)
    for _ in range(50):
        counter.add("busy")
    for i in range(1_000):
        counter.add(f"once/{i}")
        assert len(counter.counts) <= 8
    assert counter.top(1) == [("busy", 50)]


def test_the_sampler_estimates_shares_and_forgets_old_traffic() -> None:
    now = [0.0]
    hot = HotSpots(every=4, capacity=16, half_life=10.0, clock=lambda: now[0])
    refs = [_Ref("t/>"), _Ref("t/+", "mqtt")]
    for position in range(1, 8_001):
        if position >= hot.next_at:
            hot.sample("t/a" if position % 4 else "t/b", refs, position)
    described = hot.describe(5)
    shares = {t["topic"]: t["per_message"] for t in described["topics"]}
    assert shares["t/a"] == pytest.approx(0.75, abs=0.08)
    assert shares["t/b"] == pytest.approx(0.25, abs=0.08)
    assert described["filters"][0]["per_message"] == 1.0
    assert described["sampled"] is True
    assert 1_000 < described["samples"] < 3_000  # about one in four
    for period in range(1, 4):  # three half-lives of traffic on one new topic only
        now[0] = 11.0 * period
        for position in range(period * 10_000, period * 10_000 + 2_000):
            if position >= hot.next_at:
                hot.sample("t/new", [], position)
    assert hot.describe(1)["topics"][0]["topic"] == "t/new"


# -- /api/dashboard ----------------------------------------------------------------------------


async def http_get(address: tuple[str, int], path: str) -> tuple[str, bytes]:
    """GET ``path`` on a connection the server closes after answering; (head, body)."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(
                f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while data := await stream.receive_some(65536):
                chunks.append(data)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.decode(), body


async def test_the_dashboard_data_counts_what_was_published(tmp_path: Path) -> None:
    async with running_broker(http_listen="127.0.0.1:0", data_dir=str(tmp_path)) as server:
        assert server.http is not None
        address = server.addresses[0]
        async with connect(address, client_id="away", durable=True) as away:
            async with away.subscribe("orders/>"):
                await away.ping()
        async with connect(address) as publisher:
            for i in range(5):
                await publisher.publish(f"orders/{i}", b"12345")
            for _ in range(2):
                await publisher.publish("nobody/wants", b"x", confirm=True)
        head, body = await http_get(server.http.addresses[0], "/api/dashboard")
        script_head, script = await http_get(server.http.addresses[0], "/dashboard.js")
    assert head.startswith("HTTP/1.1 200") and "application/json" in head
    data = json.loads(body)
    assert data["counters"]["messages_in"] == 7
    economy = data["economy"]
    assert (economy["published"], economy["unrouted"], economy["wanted"]) == (7, 2, 5)
    assert economy["moved_per_wanted"] == pytest.approx(7 / 5)
    assert economy["bridge"] is None
    (session,) = data["sessions"]["listed"]
    assert (session["client_id"], session["connected"], session["pending"]) == ("away", False, 5)
    assert session["pending_bytes"] == 25 and session["filters"] == 1
    assert data["hot"]["sampled"] is True
    assert data["hot"]["topics"][0]["topic"] == "orders/0"  # the first message is sampled
    assert data["mesh"] == {"active": False}
    assert "text/javascript" in script_head and b"/api/dashboard" in script


def test_the_sessions_listed_are_bounded_and_the_rest_summed() -> None:
    info = [
        {"client_id": f"s{i}", "pending": i, "pending_bytes": 10 * i, "connected": i % 2 == 0}
        for i in range(30)
    ]
    summary = sessions_summary(info, top=3)
    assert [s["client_id"] for s in summary["listed"]] == ["s29", "s28", "s27"]
    assert summary["others"] == {"count": 27, "pending": sum(range(27)), "pending_bytes": 3510}
    assert (summary["count"], summary["connected"], summary["pending"]) == (30, 15, 435)


async def test_a_session_that_knows_its_oldest_pending_message_shows_its_age() -> None:
    lagging = SimpleNamespace(oldest_pending_at=trio.current_time() - 2.5)
    broker = cast(Any, SimpleNamespace(durable={"lagging": lagging, "idle": SimpleNamespace()}))
    summary = sessions_summary([{"client_id": "lagging"}, {"client_id": "idle"}])
    ages = {
        s["client_id"]: s.get("oldest_pending_age_seconds")
        for s in with_ages(broker, summary)["listed"]
    }
    assert ages["lagging"] == pytest.approx(2.5, abs=0.5) and ages["idle"] is None


async def test_the_dashboard_data_shows_the_peer_mesh() -> None:
    fast = {"peer_keepalive": 0.3, "peer_flush": 0.002, "peer_backoff_max": 0.2}
    async with running_broker(server_id="a", **fast) as a:
        host, port = a.addresses[0]
        async with running_broker(server_id="b", peers=(f"{host}:{port}",), **fast) as b:
            with trio.fail_after(5):
                while b.broker.peering.table.reachable() != {"a"}:  # no event to wait on
                    await trio.sleep(0.01)
            mesh = dashboard_snapshot(b.broker)["mesh"]
    assert mesh["active"] is True and mesh["broker_id"] == "b"
    assert mesh["links"].keys() == {"a"}
    assert mesh["origins"]["a"]["distance"] == 1
    assert "filters" not in mesh["origins"]["a"]


# -- the page in a browser -------------------------------------------------------------------


def _start_browser() -> Any:
    """A headless Chromium under selenium, or a test failure that says why not."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        pytest.fail(
            f"cannot start the browser: {', '.join(missing)} missing "
            "(`make test` installs them: apt-get install -y chromium chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        pytest.fail(
            f"cannot start the browser: selenium is not installed ({exc}); pip install -e '.[test]'"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    # selenium creates a new, empty profile directory for each session (--user-data-dir).
    try:
        return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    except Exception as exc:
        pytest.fail(f"cannot start the browser ({CHROMIUM} via {CHROMEDRIVER}): {exc}")


def _number(text: str) -> float | None:
    """The number a cell shows ('1,234.5', '12 KiB'), or None (the page's dash)."""
    match = re.search(r"-?[\d,]+(?:\.\d+)?", text)
    return float(match.group().replace(",", "")) if match else None


def _reading(driver: Any) -> dict[str, Any]:
    """What the page shows now: the rates and the lagging session's row."""
    script = """
        const row = document.querySelector('#sessions tr[data-session="dash-lagging"]');
        const cell = (cls) => row ? row.querySelector('td.' + cls).textContent : null;
        return JSON.stringify({
            status: document.getElementById('status').dataset.state,
            rate_in: document.getElementById('rate-in').textContent,
            rate_out: document.getElementById('rate-out').textContent,
            pending: cell('pending'), pending_bytes: cell('pending-bytes'), lag: cell('lag'),
            topics: document.querySelectorAll('#topics tbody td.topic').length,
        });
    """
    return json.loads(driver.execute_script(script))


def _wait_for(driver: Any, what: str, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll the page (selenium's WebDriverWait, bounded) until ``ready`` holds of a reading."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    seen: list[dict[str, Any]] = []

    def check(d: Any) -> dict[str, Any] | bool:
        seen.append(_reading(d))
        return seen[-1] if ready(seen[-1]) else False

    try:
        return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.2).until(check)
    except TimeoutException:
        pytest.fail(f"the page never showed {what} within {WAIT_SECONDS} s; last: {seen[-1:]}")


def _pending(reading: dict[str, Any]) -> float:
    return _number(reading["pending"] or "") or 0.0


def shown(reading: dict[str, Any]) -> bool:
    """The page is live and shows a publish rate, the session's pending and lag, a topic."""
    return (
        reading["status"] == "live"
        and (_number(reading["rate_in"]) or 0) > 0
        and _pending(reading) > 0
        and _number(reading["lag"] or "") is not None
        and reading["topics"] > 0
    )


def moved(first: dict[str, Any], reading: dict[str, Any]) -> bool:
    """Since ``first``: a clearly faster rate, more pending messages, a longer lag."""
    return (
        (_number(reading["rate_in"]) or 0) > (_number(first["rate_in"]) or 0) * 1.5
        and _pending(reading) > _pending(first)
        and (_number(reading["lag"] or "") or 0) > (_number(first["lag"] or "") or 0)
    )


async def test_the_dashboard_shows_live_rates_and_a_durable_sessions_lag(tmp_path: Path) -> None:
    rate = [SLOW_RATE]
    with trio.fail_after(30):
        async with running_broker(
            http_listen="127.0.0.1:0", data_dir=str(tmp_path / "data")
        ) as server:
            assert server.http is not None
            host, port = server.http.addresses[0]
            url = f"http://{host}:{port}/"
            address = server.addresses[0]

            async def publish() -> None:
                """Bounded in count and in time; the rate can be raised from the test."""
                async with connect(address) as publisher:
                    with trio.move_on_after(PUBLISH_SECONDS):
                        for i in range(PUBLISH_LIMIT):
                            await publisher.publish(f"dash/orders/{i % 3}", b"x" * 200)
                            await trio.sleep(1 / rate[0])

            def browse() -> tuple[dict[str, Any], dict[str, Any]]:
                driver = _start_browser()
                try:
                    driver.get(url)
                    first = _wait_for(driver, "a rate and the session's pending and lag", shown)
                    trio.from_thread.run_sync(rate.__setitem__, 0, FAST_RATE)
                    later = _wait_for(
                        driver, "a faster rate, more pending, a longer lag", partial(moved, first)
                    )
                    driver.save_screenshot(str(tmp_path / "dashboard.png"))
                    return first, later
                finally:
                    driver.quit()

            async with connect(address, client_id="dash-lagging", durable=True) as lagging:
                async with lagging.subscribe("dash/>"), trio.open_nursery() as nursery:
                    nursery.start_soon(publish)
                    first, later = await trio.to_thread.run_sync(browse)
                    nursery.cancel_scope.cancel()
    assert (tmp_path / "dashboard.png").stat().st_size > 0
    assert _number(later["pending_bytes"] or "") is not None
    assert shown(first) and moved(first, later)
