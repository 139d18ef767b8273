"""What the parts of an MQTT connection (CONNECT, requests, deliveries) see of it.

A Protocol, so that those modules need not import ``broker.mqtt.connection``, which
imports them: the connection is the one place that puts the parts together.
"""

from __future__ import annotations

from typing import Protocol

import trio

from broker.core import Broker
from broker.mqtt.closing import Closing
from broker.mqtt.decoder import Decoder
from broker.mqtt.state import MqttFrontEnd
from broker.security import Identity
from broker.security.floods import Refusal


class Conn(Protocol):
    broker: Broker
    mqtt: MqttFrontEnd
    stream: trio.abc.Stream
    peer: str
    decoder: Decoder
    last_heard: float
    requests_nursery: trio.Nursery | None
    identity: Identity  # who the client proved to be (ANONYMOUS until CONNECT is accepted)
    refusal: Refusal | None  # a limit against floods refused it: CONNACK says so

    @property
    def shutting_down(self) -> bool: ...

    def stop(self, closing: Closing) -> None: ...

    def last_word(self) -> bytes: ...

    def take_over(self, why: str = ...) -> None: ...
