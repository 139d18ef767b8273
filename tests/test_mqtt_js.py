"""MQTT.js (Node) over WebSocket and TCP against topiary: the browser and Node's driver.

Trello's case, which the design starts from: a page on a WebSocket subscribes with wildcards
and follows what services publish with topiary's native client. MQTT.js is pinned in
tests/js/package-lock.json and installed by `make test`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from broker.client import connect as native_connect
from tests.mqttkit import WAIT, Paho, Running, broker_in_thread

JS = Path(__file__).parent / "js"


@pytest.fixture
def broker() -> Running:
    assert shutil.which("node"), "Node.js is needed (it is on every machine this runs on)"
    assert (JS / "node_modules" / "mqtt").is_dir(), "MQTT.js is missing: `make test` installs it"
    with broker_in_thread() as running:
        yield running


def subscriber(url: str, filters: str, count: int, *extra: str) -> subprocess.Popen[str]:
    """Start mqtt_sub.js and wait for its SUBSCRIBED line (the SUBACK came back)."""
    proc = subprocess.Popen(
        ["node", str(JS / "mqtt_sub.js"), url, filters, str(count), "--timeout", "30", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    assert first == "SUBSCRIBED", f"{first!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    return proc


def lines(proc: subprocess.Popen[str]) -> list[dict[str, object]]:
    """Its JSON lines, once it exits. Read through the same file object as SUBSCRIBED was:
    ``communicate`` would read the pipe underneath and lose what readline had buffered."""
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()  # until it exits (mqtt_sub.js bounds itself with --timeout)
    err = proc.stderr.read()
    assert proc.wait(timeout=WAIT) == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("version", ["4", "5"])
def test_a_websocket_page_follows_what_a_native_service_publishes(
    broker: Running, version: str
) -> None:
    url = f"ws://127.0.0.1:{broker.ws_port}/mqtt"
    proc = subscriber(url, "board/+/cards/#", 2, "--protocol-version", version, "--qos", "1")

    async def service() -> None:
        async with native_connect(broker.native) as client:
            await client.publish("board/7/lists/1", b"not this", confirm=True)
            await client.publish("board/7/cards/42", b"card moved", confirm=True)
            await client.publish("board/8/cards/1/comments", "comment", confirm=True)

    trio.run(service)
    got = lines(proc)
    assert [(m["topic"], m["payload"]) for m in got] == [
        ("board/7/cards/42", "card moved"),
        ("board/8/cards/1/comments", "comment"),
    ]


def test_a_node_service_over_tcp_gets_retained_state_then_live_updates(broker: Running) -> None:
    publisher = Paho(broker.mqtt_port, "state")
    publisher.connect()
    publisher.publish("status/door", b"open", qos=1, retain=True)
    proc = subscriber(f"mqtt://127.0.0.1:{broker.mqtt_port}", "status/#", 2, "--qos", "1")
    publisher.publish("status/door", b"closed", qos=1)
    got = lines(proc)
    assert [(m["payload"], m["retain"]) for m in got] == [("open", True), ("closed", False)]
    publisher.disconnect()
