"""The one exception the MQTT decoder raises: the peer sent something MQTT does not allow."""

from __future__ import annotations

from broker.mqtt.reasons import NAMES

__all__ = ["MqttError"]


class MqttError(Exception):
    """The peer broke MQTT; the stream can no longer be trusted.

    ``reason_code`` is the 5.0 reason code to send in a CONNACK (before the session exists)
    or DISCONNECT (after), e.g. ``reasons.MALFORMED_PACKET`` or ``reasons.PROTOCOL_ERROR``;
    3.1.1 has no such packet for most errors, so a 3.1.1 connection is just closed. ``text``
    says what is wrong and where, e.g. "PUBLISH: QoS 3 is not valid".
    """

    def __init__(self, reason_code: int, text: str) -> None:
        super().__init__(reason_code, text)
        self.reason_code = reason_code
        self.text = text

    def __str__(self) -> str:
        name = NAMES.get(self.reason_code, "unknown")
        return f"{self.text} (reason code 0x{self.reason_code:02X}, {name})"
