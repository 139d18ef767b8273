"""Test kit for the MQTT front end: a broker in a thread, and paho-mqtt clients around it.

paho-mqtt is a threaded, blocking client, so MQTT tests are plain (synchronous) tests: the
broker runs in its own trio loop in a background thread (``broker_in_thread``), and each
paho client runs its network loop in another (``Paho``). Every wait is for an event with a
bound (a CONNACK, a SUBACK, a PUBACK, a message), never a sleep; a bound that runs out is a
failure.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
import trio
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.config import BrokerConfig
from broker.server import Server, run_broker

WAIT = 10.0  # seconds any one expected event may take on a loaded machine


@dataclass
class Running:
    """A broker served from a thread: its server object and the trio token to reach it."""

    server: Server
    token: trio.lowlevel.TrioToken

    @property
    def mqtt_port(self) -> int:
        return self.server.mqtt_addresses[0][1]

    @property
    def ws_port(self) -> int:
        return self.server.mqtt_ws_addresses[0][1]

    @property
    def native(self) -> tuple[str, int]:
        return self.server.addresses[0]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a synchronous function in the broker's loop (to look at its state)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def run(self, afn: Callable[..., Any], *args: Any) -> Any:
        """Run an async function in the broker's loop."""
        return trio.from_thread.run(afn, *args, trio_token=self.token)


@contextlib.contextmanager
def broker_in_thread(**overrides: Any) -> Iterator[Running]:
    """A broker with an MQTT port (and a WebSocket one) on 127.0.0.1, in a thread."""
    settings = {
        "port": 0,
        "mqtt_listen": "127.0.0.1:0",
        "mqtt_websocket": "127.0.0.1:0",
        **overrides,
    }
    config = BrokerConfig(**settings)
    started: queue.Queue[Running | BaseException] = queue.Queue()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(run_broker, config)
            started.put(Running(server, trio.lowlevel.current_trio_token()))

    def thread() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the test
            started.put(exc)

    worker = threading.Thread(target=thread, name="broker", daemon=True)
    worker.start()
    running = started.get(timeout=WAIT)
    if isinstance(running, BaseException):
        raise running
    try:
        yield running
    finally:
        with contextlib.suppress(trio.RunFinishedError):
            running.call(running.server.shutdown)
        worker.join(timeout=WAIT + 10)
        assert not worker.is_alive(), "the broker did not shut down"


class Paho:
    """A paho-mqtt client with waits: connect, subscribe, publish, receive."""

    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        version: int = 5,
        clean: bool = True,
        expiry: int | None = None,
        transport: str = "tcp",
        keepalive: int = 60,
        will: tuple[str, bytes, int, bool] | None = None,
        will_delay: int | None = None,
        username: str | None = None,
        password: str | None = None,
        properties: Properties | None = None,
    ) -> None:
        protocol = {5: paho.MQTTv5, 4: paho.MQTTv311, 3: paho.MQTTv31}[version]
        self.version = version
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            transport=transport,  # type: ignore[arg-type]
            clean_session=None if version == 5 else clean,
        )
        if transport == "websockets":
            self.client.ws_set_options(path="/mqtt")
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            will_props = None
            if will_delay is not None:
                will_props = Properties(PacketTypes.WILLMESSAGE)
                will_props.WillDelayInterval = will_delay
            self.client.will_set(*will, properties=will_props)
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[tuple[Any, Any, Any]] = queue.Queue()
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.unsubacks: queue.Queue[Any] = queue.Queue()
        self.disconnects: queue.Queue[Any] = queue.Queue()
        self.client.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.client.on_message = lambda c, u, msg: self.messages.put(msg)
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put(codes)
        self.client.on_unsubscribe = lambda c, u, mid, codes, props: self.unsubacks.put(codes)
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.port = port
        self.clean = clean
        self.expiry = expiry
        self.keepalive = keepalive
        self.properties = properties

    def connect(self) -> tuple[Any, Any, Any]:
        """Connect and wait for the CONNACK: (flags, reason code, properties)."""
        props = self.properties
        if self.version == 5 and self.expiry is not None:
            props = props or Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self.expiry
        kwargs: dict[str, Any] = {"keepalive": self.keepalive}
        if self.version == 5:
            kwargs["clean_start"] = self.clean
            kwargs["properties"] = props
        self.client.connect("127.0.0.1", self.port, **kwargs)
        self.client.loop_start()
        return self.connack.get(timeout=WAIT)

    def subscribe(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.client.subscribe(*args, **kwargs)
        return self.subacks.get(timeout=WAIT)

    def unsubscribe(self, *args: Any, **kwargs: Any) -> Any:
        self.client.unsubscribe(*args, **kwargs)
        return self.unsubacks.get(timeout=WAIT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, **kwargs: Any) -> None:
        """Publish and, for QoS 1 and 2, wait until the broker has acknowledged it."""
        info = self.client.publish(topic, payload, qos=qos, **kwargs)
        info.wait_for_publish(timeout=WAIT)
        assert info.is_published(), f"no acknowledgement for {topic!r} within {WAIT} s"

    def receive(self) -> paho.MQTTMessage:
        return self.messages.get(timeout=WAIT)

    def ping(self) -> None:
        """A barrier: a QoS 1 publish to a topic nobody wants, acknowledged (everything this
        client sent before it was handled)."""
        self.publish("barrier/nobody", b"", qos=1)

    def disconnect(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def nothing_more(client: Paho) -> bool:
    """After a barrier: True when no further message is queued for ``client``."""
    return client.messages.empty()


def receive_from_any(clients: list[Paho], count: int) -> list[list[paho.MQTTMessage]]:
    """``count`` messages in all, from whichever of ``clients`` gets them: each one's list."""
    got: list[list[paho.MQTTMessage]] = [[] for _ in clients]
    deadline = time.monotonic() + WAIT
    while sum(map(len, got)) < count:
        assert time.monotonic() < deadline, f"{sum(map(len, got))} of {count} messages came"
        for mine, client in zip(got, clients, strict=True):
            with contextlib.suppress(queue.Empty):
                mine.append(client.messages.get(timeout=0.02))  # a bounded wait on a queue
    return got
