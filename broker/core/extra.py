"""What a stored message keeps beyond topic, payload, headers and id: its ``extra`` blob.

An MQTT publish carries the publisher's QoS (``Message.qos``), MQTT 5 properties that pass
through as they came (``Message.mqtt_props``) and an expiry (``Message.expires_at``). The
store keeps them, for a durable session's offline queue and for retained messages, as one
opaque blob (``messages.extra``, ``retained.extra``: ``broker.store.schema``) that only this
module reads and writes.

``pack_extra`` returns None for what every native message is (QoS 1, no properties, no
expiry), so that case stores NULL and costs one test. Otherwise the blob is a msgpack map
with only the keys that differ from that default:

- ``"q"``: the QoS (0 or 2; 1 is the default);
- ``"p"``: the properties (bytes);
- ``"e"``: the expiry as wall-clock epoch seconds (float). ``expires_at`` is a trio time,
  which means nothing after a restart: ``pack_extra`` turns it into ``time.time()`` plus
  what is left, ``apply_extra`` back into ``trio.current_time()`` plus what is left then
  (already past: the message reads back as expired).

Unknown keys are ignored (a newer broker may add some). A blob that does not decode, or
whose values have the wrong types, is ignored whole with a warning: bad stored data must
not stop a broker, and the message is still delivered, with the defaults.
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgpack
import trio

from broker.core.message import Message
from broker.log import get_logger

__all__ = ["apply_extra", "pack_extra"]

log = get_logger("topiary.store")


def pack_extra(message: Message) -> bytes | None:
    """The blob to store with ``message``, or None when it has only the defaults.

    Called in the broker's trio thread (it reads ``trio.current_time()`` when there is an
    expiry). A negative ``expires_at`` is an interval still to be counted from now (a will
    message before it is published, ``broker.mqtt.connect``); it is stored as such.
    """
    qos = message.qos
    props = message.mqtt_props
    expires_at = message.expires_at
    if qos == 1 and props is None and not expires_at:
        return None
    fields: dict[str, Any] = {}
    if qos != 1:
        fields["q"] = qos
    if props is not None:
        fields["p"] = bytes(props)
    if expires_at:
        left = -expires_at if expires_at < 0 else expires_at - trio.current_time()
        fields["e"] = time.time() + left
    return msgpack.packb(fields)


def apply_extra(message: Message, extra: bytes | None) -> None:
    """Set ``message``'s QoS, MQTT properties and expiry from a stored blob (None: nothing
    to set); a blob that cannot be read is logged and ignored."""
    if extra is None:
        return
    try:
        fields = msgpack.unpackb(extra)
        if not isinstance(fields, dict):
            raise ValueError(f"a {type(fields).__name__}, not a map")
        qos = fields.get("q", 1)
        props = fields.get("p")
        wall = fields.get("e")
        if type(qos) is not int or not 0 <= qos <= 2:
            raise ValueError(f"QoS {qos!r}")
        if props is not None and not isinstance(props, bytes):
            raise ValueError(f"properties of type {type(props).__name__}")
        if wall is not None and (
            not isinstance(wall, (int, float)) or isinstance(wall, bool) or not math.isfinite(wall)
        ):
            raise ValueError(f"expiry {wall!r}")
    except Exception as exc:
        log.warning(
            "ignoring a stored message's unreadable extra fields",
            msg_id=message.msg_id,
            topic=message.topic,
            error=str(exc) or type(exc).__name__,
        )
        return
    message.qos = qos
    message.mqtt_props = props
    if wall is None:
        message.expires_at = 0.0
        return
    expires_at = trio.current_time() + (wall - time.time())
    # 0.0 means "never": a message that expired exactly then must still read as expired.
    message.expires_at = expires_at if expires_at else -math.ulp(0.0)
