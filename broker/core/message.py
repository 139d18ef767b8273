"""A published message, stored once however many sessions it goes to.

Fan-out is the hot path: one publish becomes one delivery per interested
session, and only the subscription id and the sequence number differ between
them. So a message carries a slot where a front end keeps its encoding of the
shared fields, made once for all deliveries (``broker.wire.codec`` fills it for
the native protocol). The core itself never looks at it.

One message in ``Broker.latency_sample_every`` carries the trio time it was routed
(``routed_at``; 0.0 for the others): each session's writer notes it as it sends the MSG,
for the publish-to-delivery latency histogram.

Retained messages: ``retain`` says the publisher set the retain flag (MQTT's Retain As
Published passes it on); ``from_retained`` says this delivery comes from the retained store,
on subscribe. The store keeps Message objects of its own (``broker.core.retained``), so the
shared encoding of a live-routed message and that of its retained copy never mix.
"""

from __future__ import annotations


class Message:
    __slots__ = (
        "encoded",
        "encoded_fields",
        "expires_at",
        "from_retained",
        "headers",
        "mqtt_heads",
        "mqtt_props",
        "mqtt_shared",
        "msg_id",
        "origin",
        "payload",
        "qos",
        "retain",
        "routed_at",
        "size",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        msg_id: str,
        qos: int = 1,
        retain: bool = False,
        from_retained: bool = False,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.headers = headers
        self.msg_id = msg_id
        self.size = len(payload)
        # A front end's encoding of the fields every delivery shares, and how many there are.
        self.encoded: bytes | None = None
        self.encoded_fields = 0
        self.routed_at = 0.0  # trio time it was routed, for a sampled message; else 0.0
        # The publisher's quality of service (MQTT 0, 1 or 2): a delivery's QoS is the lower
        # of this and the subscription's. Native PUBs and messages read back from the store
        # count as 1 (at least once: the broker stores them for durable sessions).
        self.qos = qos
        # Set by the MQTT front end only: trio time after which the message is not delivered
        # (v5 Message Expiry Interval; 0.0: never), the publishing session (No Local), the
        # publish's v5 properties that pass through as they came (encoded), and its cache of
        # the PUBLISH bytes every delivery shares.
        self.expires_at = 0.0
        self.origin: object = None
        self.mqtt_props: bytes | None = None
        self.mqtt_shared: tuple | None = None
        self.mqtt_heads: list[bytes] | None = None
        self.retain = retain  # the publisher set the retain flag
        self.from_retained = from_retained  # delivered from the retained store on subscribe

    def __repr__(self) -> str:
        return f"<Message {self.msg_id} {self.topic!r} {self.size} bytes>"
