"""Why an MQTT connection ends, as the reader, the keepalive or a take-over says it."""

from __future__ import annotations


class Closing(Exception):
    """Why a connection ends: the v5 reason code for its DISCONNECT (None: tell nothing)
    and a text for the log (and the v5 Reason String)."""

    def __init__(self, reason: int | None, text: str, *, will: bool = True) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text
        self.will = will  # publish the client's Will (every end but a clean DISCONNECT)
