"""The MQTT codec's public face: ``Decoder`` (bytes -> packets), ``encode`` (packet ->
bytes), the PUBLISH fan-out helpers, and ``MqttError``, the only exception decoding raises.

Why our own codec: the only maintained sans-IO MQTT codec on PyPI (``mqtt5``) speaks 5.0
only, and one listening port must serve 3.1.1 and 5.0 clients alike.
"""

from __future__ import annotations

from broker.mqtt.decoder import DEFAULT_MAX_PACKET, Decoder
from broker.mqtt.encoder import PublishTemplate, encode, encode_publish, publish_parts
from broker.mqtt.errors import MqttError
from broker.mqtt.properties import encode_properties, property_section

__all__ = [
    "DEFAULT_MAX_PACKET",
    "Decoder",
    "MqttError",
    "PublishTemplate",
    "encode",
    "encode_properties",
    "encode_publish",
    "property_section",
    "publish_parts",
]
