"""What a client call raises when the broker refuses or the connection is gone, and which
of those failures are worth connecting again for."""

from __future__ import annotations

import trio

from broker.errors import refused_for_good


class BrokerError(Exception):
    """The broker refused a request (ERROR frame): ``code`` and ``text`` say why."""

    def __init__(self, code: str, text: str, ref: int | None = None) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text
        self.ref = ref


class ConnectionLost(Exception):
    """The connection ended (and ``reconnect`` was off, or the client is closing)."""


def worth_retrying(exc: BaseException) -> bool:
    """Whether a failed :func:`connect` may succeed later: the broker was not there, went
    away mid-handshake, or refused for a reason of the moment (SHUTTING_DOWN); not a bad
    token or another protocol version."""
    if isinstance(exc, BrokerError):
        return not refused_for_good(exc.code)
    return isinstance(exc, (OSError, ConnectionLost, trio.BrokenResourceError))
