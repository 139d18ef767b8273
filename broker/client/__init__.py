"""The native client library: ``connect`` to a broker, publish, subscribe, ack."""

from broker.address import parse_server, parse_servers
from broker.client.client import Client, connect, tls_context
from broker.client.errors import BrokerError, ConnectionLost, worth_retrying
from broker.client.subscription import Message, Subscription
from broker.errors import ProtocolError

__all__ = [
    "BrokerError",
    "Client",
    "ConnectionLost",
    "Message",
    "ProtocolError",
    "Subscription",
    "connect",
    "parse_server",
    "parse_servers",
    "tls_context",
    "worth_retrying",
]
