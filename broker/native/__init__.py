"""The trio shell for native-protocol clients: one ``ClientConnection`` per socket, and
the one task that keeps them all alive (``KeepaliveSweeper``)."""

from broker.native.connection import ClientConnection
from broker.native.keepalive import KeepaliveSweeper

__all__ = ["ClientConnection", "KeepaliveSweeper"]
