"""The trio shell for native-protocol clients: one ``ClientConnection`` per socket."""

from broker.native.connection import ClientConnection

__all__ = ["ClientConnection"]
