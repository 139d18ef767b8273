"""The native client library: ``connect`` to a broker, publish, subscribe, ack."""

from broker.client.client import (
    BrokerError,
    Client,
    ConnectionLost,
    Message,
    ProtocolError,
    Subscription,
    connect,
    parse_server,
    worth_retrying,
)

__all__ = [
    "BrokerError",
    "Client",
    "ConnectionLost",
    "Message",
    "ProtocolError",
    "Subscription",
    "connect",
    "parse_server",
    "worth_retrying",
]
